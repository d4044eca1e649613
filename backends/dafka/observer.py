"""The observer actor: what the Dafka network holds, without consuming any record.

The gateway needs to know, for every topic, its partitions and their heads: to resume its
own partitions where the stores stopped (never reusing an offset), to list topics (KEYS),
and to start a group at `latest`. The observer is a consumer-shaped node that subscribes
to every HEAD (`H`, one message per partition per `producer/head_interval`) and to the
answers addressed to it, and asks every store reader for the heads of every subject: a
CONSUMER_HELLO with the subject "" (C's reader matches subjects by prefix, ours treats ""
as "every subject"), at hello time and on `refresh()` (GET_HEADS with topic "").

DIRECT_HEADs carry no store address, so "every store has answered" is judged by time: the
answers to one request leave a reader in one burst, and the observer is *settled* once it
has greeted `min_stores` readers and no answer arrived for `settle` seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, bind_data_socket, new_subscribers, now_ms
from backends.dafka.config import Config

log = structlog.get_logger(__name__)

_instances = itertools.count()
_EVERY_SUBJECT = ""


class NotSettled(Exception):
    """The stores did not all answer in time."""


class Observer:
    """Heads of every partition the network holds, kept current from HEAD messages."""

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None = None,
        *,
        settle: float = 0.1,
        on_head: Callable[[str, str, int], None] | None = None,
    ) -> None:
        """`on_head(topic, address, head)` runs on the actor thread for every head that
        moved (stored or published)."""
        self.address = uuid.uuid4().hex.upper()
        self._config = config
        self._context = context or zmq.Context.instance()
        self._settle = settle
        self._on_head = on_head
        self._cond = threading.Condition()
        # (topic, address) -> head; stored: what a store answered; published: HEADs.
        self._stored: dict[tuple[str, str], int] = {}
        self._published: dict[tuple[str, str], int] = {}
        self._readers: set[str] = set()
        self._last_answer = time.monotonic()
        self._refresh_requested = False
        self._closed = False
        self._pipe_endpoint = f"inproc://dafka-observer-{self.address}-{next(_instances)}"
        self._pipe = self._context.socket(zmq.PAIR)
        self._pipe.linger = 0
        self._pipe.bind(self._pipe_endpoint)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dafka-observer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._pipe.close()
            self._closed = True
            raise self._error

    # -- user side (any thread) ---------------------------------------------------------

    @property
    def stores(self) -> int:
        """Store readers greeted so far."""
        with self._cond:
            return len(self._readers)

    def wait_settled(self, min_stores: int, timeout: float) -> None:
        """Block until `min_stores` readers were greeted and their answers stopped coming;
        raise NotSettled after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                quiet = now - self._last_answer
                if len(self._readers) >= min_stores and quiet >= self._settle:
                    return
                if now >= deadline:
                    raise NotSettled(
                        f"{len(self._readers)} of {min_stores} Dafka store(s) answered "
                        f"within {timeout:g} s"
                    )
                wait = self._settle - quiet if len(self._readers) >= min_stores else 0.05
                self._cond.wait(max(0.001, min(wait, deadline - now)))

    def refresh(self, min_stores: int, timeout: float) -> None:
        """Ask every store for every head again, then wait until settled."""
        with self._cond:
            self._refresh_requested = True
            self._last_answer = time.monotonic()
            with contextlib.suppress(zmq.Again):
                self._pipe.send(b"R", zmq.NOBLOCK)
        self.wait_settled(min_stores, timeout)

    def note_stored(self, topic: str, address: str, head: int) -> None:
        """A store acknowledged `head` to a producer of this process: known at once,
        before any HEAD or DIRECT_HEAD says so."""
        with self._cond:
            if head > self._stored.get((topic, address), -1):
                self._stored[(topic, address)] = head

    def stored_head(self, topic: str, address: str) -> int | None:
        with self._cond:
            return self._stored.get((topic, address))

    def heads(self, topic: str) -> dict[str, int]:
        """address -> highest head known (stored or published) of every partition."""
        with self._cond:
            out = {a: h for (t, a), h in self._stored.items() if t == topic}
            for (t, a), h in self._published.items():
                if t == topic and h > out.get(a, -1):
                    out[a] = h
            return out

    def topics(self) -> set[str]:
        with self._cond:
            return {t for t, _ in self._stored} | {t for t, _ in self._published}

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(zmq.Again):
                self._pipe.send(b"T", zmq.NOBLOCK)
        self._thread.join()
        self._pipe.close()

    # -- actor --------------------------------------------------------------------------

    def _run(self) -> None:
        ctx = self._context
        pipe = ctx.socket(zmq.PAIR)
        sub = ctx.socket(zmq.SUB)
        xpub = ctx.socket(zmq.XPUB)
        beacon: Beacon | None = None
        for sock in (pipe, sub, xpub):
            sock.linger = 0
        try:
            pipe.connect(self._pipe_endpoint)
            xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            port = bind_data_socket(xpub, self._config)
            sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(proto.HEAD))
            for msg_id in (proto.DIRECT_HEAD, proto.STORE_HELLO):
                sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, self.address))
            beacon = Beacon(self._config, self.address, ctx)
            beacon.wait_ready()
            beacon.start(port)
        except BaseException as error:
            self._error = error
            if beacon is not None:
                beacon.close()
            for sock in (pipe, sub, xpub):
                sock.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pipe, sub, xpub, beacon)
        except BaseException:
            log.exception("dafka observer stopped on an error", observer=self.address)
        finally:
            beacon.stop()
            beacon.close()
            for sock in (pipe, sub, xpub):
                sock.close()

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        poller = zmq.Poller()
        for sock in (pipe, sub, xpub, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        while True:
            wait = max(0, min(beacon.next_deadline_ms() - now_ms(), 1000))
            events = dict(poller.poll(wait))
            if pipe in events:
                stop = False
                while True:
                    try:
                        stop = pipe.recv(zmq.NOBLOCK) == b"T" or stop
                    except zmq.Again:
                        break
                if stop:
                    return
                with self._cond:
                    refresh, self._refresh_requested = self._refresh_requested, False
                if refresh:
                    get_heads = proto.Message(
                        proto.GET_HEADS, _EVERY_SUBJECT.encode(), address=self.address
                    )
                    xpub.send_multipart(proto.encode(get_heads))
            if beacon.socket in events:
                apply_events(beacon.handle(), sub)
            if xpub in events:
                for reader in new_subscribers(xpub, proto.CONSUMER_HELLO):
                    self._hello(xpub, reader)
            if sub in events:
                self._drain(sub, xpub)
            apply_events(beacon.tick(now_ms()), sub)

    def _hello(self, xpub: zmq.Socket, reader: bytes) -> None:
        if not reader or b"\0" in reader:
            return
        hello = proto.Message(
            proto.CONSUMER_HELLO, reader, address=self.address, subjects=[_EVERY_SUBJECT]
        )
        xpub.send_multipart(proto.encode(hello))
        with self._cond:
            self._readers.add(reader.decode("ascii", "replace"))
            self._last_answer = time.monotonic()
            self._cond.notify_all()

    def _drain(self, sub: zmq.Socket, xpub: zmq.Socket) -> None:
        moved: list[tuple[str, str, int]] = []
        answered = False
        for _ in range(100_000):
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = proto.decode(frames)
            except proto.MalformedMessage:
                continue
            if msg.id == proto.STORE_HELLO:
                self._hello(xpub, msg.address.encode())
                continue
            if msg.id not in (proto.HEAD, proto.DIRECT_HEAD) or msg.sequence < 0:
                continue
            key = (msg.subject, msg.address)
            table = self._published if msg.id == proto.HEAD else self._stored
            answered = answered or msg.id == proto.DIRECT_HEAD
            with self._cond:
                if msg.sequence > table.get(key, -1):
                    table[key] = msg.sequence
                    moved.append((msg.subject, msg.address, msg.sequence))
        if answered:
            with self._cond:
                self._last_answer = time.monotonic()
                self._cond.notify_all()
        if self._on_head is not None:
            for topic, address, head in moved:
                self._on_head(topic, address, head)
