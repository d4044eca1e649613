"""Consumer lag per group and partition, read at scrape time through the engine's `Admin`
(the one `rafka-topics --describe` uses), off the gateway's event loop.

The Admin runs on an event loop of its own, in a thread of its own, started at the first
read and kept (a Dafka admin joins the network once: an observer and a reader node). A
read waits at most `timeout` seconds; a collection still running then is not abandoned:
the next read waits for it rather than start another, so that slow scrapes never pile up.
Topics whose names start with `__` (Kafka's and Rafka's internal ones) are left out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from backends.base import Admin

log = structlog.get_logger("rafka.gateway.metrics")

INTERNAL_PREFIX = "__"


@dataclass(frozen=True, slots=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int
    lag: int


@dataclass(frozen=True, slots=True)
class PartitionEnd:
    topic: str
    partition: int
    first: int
    next: int


@dataclass(frozen=True, slots=True)
class LagSnapshot:
    """One collection: every group's committed offset and lag, every partition's offsets."""

    lags: tuple[PartitionLag, ...]
    partitions: tuple[PartitionEnd, ...]
    seconds: float  # how long the collection took


class LagUnavailable(Exception):
    """No collection finished in time, or the last one failed; the text says which."""


class LagReader:
    def __init__(self, make_admin: Callable[[], Admin], timeout: float) -> None:
        self._make_admin = make_admin
        self._timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._admin: Admin | None = None
        self._running: concurrent.futures.Future[LagSnapshot] | None = None
        self._closed = False

    def read(self) -> LagSnapshot:
        """Blocking, at most `timeout` seconds: a fresh collection (or the one in
        progress). Raises LagUnavailable."""
        with self._lock:
            if self._closed:
                raise LagUnavailable("the gateway is shutting down")
            if self._running is None or self._running.done():
                self._running = asyncio.run_coroutine_threadsafe(self._collect(), self._start())
            running = self._running
        try:
            return running.result(self._timeout)
        except concurrent.futures.TimeoutError:
            raise LagUnavailable(
                f"consumer lag not read within {self._timeout:g} s (gateway.metrics_lag_timeout)"
            ) from None
        except concurrent.futures.CancelledError:
            raise LagUnavailable("the gateway is shutting down") from None
        except Exception as error:
            raise LagUnavailable(f"cannot read consumer lag: {error}") from None

    def _start(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            # Named, so that a thread left behind says whose it is.
            loop.set_default_executor(
                concurrent.futures.ThreadPoolExecutor(thread_name_prefix="rafka-metrics-lag")
            )
            thread = threading.Thread(
                target=loop.run_forever, name="rafka-metrics-lag", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    async def _collect(self) -> LagSnapshot:
        started = time.monotonic()
        if self._admin is None:
            self._admin = self._make_admin()
        admin = self._admin
        try:
            topics = [t for t in await admin.list_topics() if not t.startswith(INTERNAL_PREFIX)]
            descriptions = await admin.describe_many(topics)
        except Exception:
            # A fresh Admin next time, rather than one in whatever state this left it.
            self._admin = None
            with contextlib.suppress(Exception):
                await admin.close()
            raise
        lags: list[PartitionLag] = []
        ends: list[PartitionEnd] = []
        for described in descriptions:
            topic = described.name
            for offsets in described.partitions:
                ends.append(PartitionEnd(topic, offsets.partition, offsets.first, offsets.next))
            for group in described.groups:
                lags.append(
                    PartitionLag(group.group, topic, group.partition, group.committed, group.lag)
                )
        return LagSnapshot(tuple(lags), tuple(ends), time.monotonic() - started)

    def close(self, timeout: float) -> None:
        """Blocking: stop the collection in progress, close the Admin, end the thread."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            running = self._running
        if loop is None or thread is None:
            return
        if running is not None:
            running.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self._close_admin(), loop).result(timeout)
        except Exception:
            log.exception("closing the metrics' admin failed")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            log.error("the metrics' lag thread did not end", seconds=timeout)
        else:
            loop.close()

    async def _close_admin(self) -> None:
        # The collection in progress (cancelled above) ends before the admin closes.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()
        # The Admin's blocking calls ran on this loop's executor: end its threads too.
        await asyncio.get_running_loop().shutdown_default_executor()
