"""MONITOR fan-out (spec §10): every command of every connection, as one line per command.

Line format (Rafka's): `+<unix seconds, 6 decimals> [0 <client id>] "<arg0>" "<arg1>"...\\r\\n`.
Arguments are quoted without escaping, as Rafka does; only CR and LF are escaped (as
`\\r`, `\\n`) so that a value cannot break the monitor's RESP framing. Each monitor has a
queue bounded in lines and in bytes; when it is full new lines are dropped and the drop is
logged once per burst. The writer hands one batch at a time to the connection and waits
for the client to read it, so a monitor that never reads holds at most its queue plus one
batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Protocol

import structlog

log = structlog.get_logger("rafka.gateway.monitor")

# Arguments never shown to monitors (AUTH passwords).
REDACTED_ARG = b"(redacted)"


def _escape(raw: bytes) -> bytes:
    """CR and LF written as `\\r`, `\\n`: a monitor's line stays one line."""
    if b"\r" in raw or b"\n" in raw:
        raw = raw.replace(b"\r", b"\\r").replace(b"\n", b"\\n")
    return raw


def _quote(arg: bytes) -> bytes:
    return b'"' + _escape(arg) + b'"'


def redact(args: Sequence[bytes]) -> Sequence[bytes]:
    """Hide the secrets of AUTH, HELLO ... AUTH user pass, and RAFKA.PUSH ADD (a
    subscription's headers may hold credentials)."""
    name = args[0].upper()
    if name == b"RAFKA.PUSH" and len(args) > 2 and args[1].upper() == b"ADD":
        return [args[0], args[1], *(REDACTED_ARG for _ in args[2:])]
    if name == b"AUTH":
        return [args[0], *(REDACTED_ARG for _ in args[1:])]
    if name == b"HELLO":
        out = list(args)
        for index, arg in enumerate(out):
            if arg.upper() == b"AUTH":
                for secret in range(index + 1, min(index + 3, len(out))):
                    out[secret] = REDACTED_ARG
        return out
    return args


def format_line(client_id: str, args: Sequence[bytes], now: float) -> bytes:
    quoted = b" ".join(_quote(arg) for arg in redact(args))
    # The id is a client's SETNAME, which may hold CR/LF too: escaped as the arguments.
    name = _escape(client_id.encode("utf-8", "replace"))
    return b"+%.6f [0 %s] %s\r\n" % (now, name, quoted)


class Writer(Protocol):
    """Where a monitor's lines go: the monitoring connection (write, then wait while
    the client does not read; drain raises ConnectionError once it is gone)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


class Monitor:
    """One monitoring connection: a bounded queue and the task that writes it out."""

    def __init__(self, label: str, writer: Writer, queue_size: int, queue_bytes: int) -> None:
        self.label = label
        self._writer = writer
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=queue_size)
        self._max_bytes = queue_bytes
        self.queued_bytes = 0  # bytes of the lines in the queue
        self._dropped = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="monitor-writer")

    def offer(self, line: bytes) -> None:
        try:
            if self.queued_bytes + len(line) > self._max_bytes:
                raise asyncio.QueueFull
            self._queue.put_nowait(line)
            self.queued_bytes += len(line)
        except asyncio.QueueFull:
            if self._dropped == 0:
                log.warning("monitor queue full, dropping lines", monitor=self.label)
            self._dropped += 1

    async def _run(self) -> None:
        try:
            while True:
                lines = [await self._queue.get()]
                while not self._queue.empty():
                    lines.append(self._queue.get_nowait())
                batch = b"".join(lines)
                self.queued_bytes = 0  # the queue is empty: the batch is the writer's now
                self._writer.write(batch)
                await self._writer.drain()
                if self._dropped:
                    log.warning("monitor lines dropped", monitor=self.label, count=self._dropped)
                    self._dropped = 0
        except (ConnectionError, RuntimeError):
            # The connection is going away; its handler deregisters this monitor.
            return

    def cancel(self) -> None:
        """Stop writing now, without waiting (the shutdown bound has passed)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class MonitorHub:
    """The registered monitors, keyed by connection (not by client id, see §15.4)."""

    def __init__(self) -> None:
        # Read directly by the dispatcher: an empty dict means nothing to publish.
        self.registered: dict[int, Monitor] = {}

    def __len__(self) -> int:
        return len(self.registered)

    def add(self, key: int, monitor: Monitor) -> None:
        self.registered[key] = monitor
        monitor.start()
        log.info("new monitor client", client=monitor.label, active_monitors=len(self.registered))

    async def remove(self, key: int) -> None:
        monitor = self.registered.pop(key, None)
        if monitor is not None:
            await monitor.stop()

    def discard(self, key: int) -> None:
        """Deregister without waiting for the writer task to end (see Monitor.cancel)."""
        monitor = self.registered.pop(key, None)
        if monitor is not None:
            monitor.cancel()

    def publish(self, client_id: str, args: Sequence[bytes]) -> None:
        if not self.registered or not args:
            return
        line = format_line(client_id, args, time.time())
        for monitor in self.registered.values():
            monitor.offer(line)
