"""The fake Dafka node of the upstream tests (spec §8): a real network node that injects
hand-made messages and returns every message it receives.

It binds a verbose XPUB (beaconed, like a consumer or store reader) and connects a SUB
subscribed to everything to every node the beacon reports. It runs its own thread so that
discovery keeps working while a test blocks in `recv`. Besides the upstream API it offers
waits that replace upstream's sleeps:

- `wait_subscribed(prefix)`: some node's SUB subscribed `prefix` on our XPUB, i.e. that
  node is connected to us and will receive what we send with that prefix;
- `wait_connected(address)`: our SUB finished the handshake with node `address`'s data
  socket, i.e. we will receive what it publishes from now on.

With `c_store=True` it also plays a C store writer (spec §5.3) the way it matters to a
producer: it keeps each partition's records contiguously in memory, FETCHes a gap from its
head + 1 (on RECORD and HEAD, through the fetch filter), and ACKs a partition only when it
stored something new, never again for a HEAD it already holds. `slow_join_ms` delays when
a subscription on our XPUB counts for those ACKs: ZeroMQ's slow joiner, where a PUB drops
what it sends before the subscriber's subscription reached it.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, bind_data_socket, now_ms
from backends.dafka.config import Config
from backends.dafka.fetch_filter import FetchFilter
from backends.dafka.proto import MalformedMessage, Message

log = structlog.get_logger(__name__)

T = TypeVar("T")


class TestPeer:
    """A fake node; use it from one thread (the test's). `close()` stops and joins it."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None = None,
        *,
        c_store: bool = False,
        slow_join_ms: int = 0,
    ) -> None:
        self.address = uuid.uuid4().hex.upper()
        self._c_store = c_store
        self._slow_join = slow_join_ms / 1000
        self._stored: dict[tuple[str, str], list[bytes]] = {}  # c_store: (topic, partition)
        self._filter = FetchFilter()
        self.acks_sent = 0  # c_store: ACKs our XPUB had a subscription for …
        self.acks_dropped = 0  # … and those the slow joiner lost
        self._config = config
        self._context = context or zmq.Context.instance()
        self._verbose = config.get_bool("test/verbose")
        self._control_endpoint = f"inproc://dafka-test-peer-{self.address}"
        self._received: queue.Queue[Message] = queue.Queue()
        self._state = threading.Condition()
        self._subscriptions: list[bytes] = []  # every XPUB subscribe event, flag stripped
        self._subscribed_at: dict[bytes, float] = {}  # first time of each, monotonic s
        self._handshakes: set[str] = set()  # endpoints our SUB is connected to
        self._senders: dict[str, str] = {}  # node uuid -> endpoint, from the beacon
        self.malformed: list[list[bytes]] = []  # received frames that did not decode
        self.port = -1
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dafka-test-peer", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        # The caller's end of the command pipe: created, used and closed by the caller.
        self._control = self._context.socket(zmq.PAIR)
        self._control.connect(self._control_endpoint)

    # --- sending ---------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """Publish any message on our XPUB."""
        self.send_frames(proto.encode(msg))

    def send_frames(self, frames: list[bytes]) -> None:
        """Publish raw frames (e.g. malformed ones) on our XPUB."""
        self._control.send_multipart([b"SEND", *frames])

    def send_record(self, topic: str, seq: int, content: bytes | str) -> None:
        self._send_record(proto.RECORD, topic, topic, seq, content)

    def send_direct_record(self, to: str, topic: str, seq: int, content: bytes | str) -> None:
        """A record of our partition as a FETCH answer: DIRECT_RECORD routed to node `to`."""
        self._send_record(proto.DIRECT_RECORD, to, topic, seq, content)

    def _send_record(
        self, msg_id: int, routing: str, topic: str, seq: int, content: bytes | str
    ) -> None:
        data = content.encode() if isinstance(content, str) else content
        self.send(
            Message(
                msg_id,
                routing.encode(),
                address=self.address,
                subject=topic,
                sequence=seq,
                content=data,
            )
        )

    def send_head(self, topic: str, seq: int) -> None:
        self.send(
            Message(proto.HEAD, topic.encode(), address=self.address, subject=topic, sequence=seq)
        )

    def send_fetch(self, partition: str, topic: str, seq: int, count: int) -> None:
        self.send(
            Message(
                proto.FETCH,
                partition.encode(),
                address=self.address,
                subject=topic,
                sequence=seq,
                count=count,
            )
        )

    def send_store_hello(self, consumer_address: str) -> None:
        self.send(Message(proto.STORE_HELLO, consumer_address.encode(), address=self.address))

    def send_get_heads(self, topic: str) -> None:
        """As an earliest consumer (ours or C's when it subscribes): heads of `topic`, please."""
        self.send(Message(proto.GET_HEADS, topic.encode(), address=self.address))

    def send_direct_head(self, requester: str, topic: str, seq: int) -> None:
        """As a store reader: our partition of `topic` is stored up to `seq`."""
        self.send(
            Message(
                proto.DIRECT_HEAD,
                requester.encode(),
                address=self.address,
                subject=topic,
                sequence=seq,
            )
        )

    # --- receiving -------------------------------------------------------------------------

    def recv(self, timeout: float = 5.0) -> Message:
        """The next message received; TimeoutError if none comes within `timeout` s."""
        try:
            return self._received.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(
                f"test peer {self.address}: no message received within {timeout:g} s"
            ) from self._error

    def recv_id(self, id: int, timeout: float = 5.0) -> Message:
        """The next message of type `id`, discarding others (e.g. periodic HEADs)."""
        deadline = time.monotonic() + timeout
        skipped: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            try:
                msg = self._received.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise TimeoutError(
                    f"test peer {self.address}: no {proto.NAMES.get(id, id)} within "
                    f"{timeout:g} s (skipped: {', '.join(skipped[-10:]) or 'nothing'})"
                ) from None
            if msg.id == id:
                return msg
            skipped.append(msg.name)

    def stored(self, topic: str, partition: str) -> list[bytes]:
        """c_store: the records of a partition stored so far (from sequence 0, no holes)."""
        with self._state:
            return list(self._stored.get((topic, partition), []))

    def pending(self) -> int:
        """How many received messages wait for `recv`."""
        return self._received.qsize()

    # --- waits replacing upstream's sleeps -------------------------------------------------

    def subscriptions(self) -> list[bytes]:
        """Every subscription other nodes made on our XPUB so far (flag byte stripped)."""
        with self._state:
            return list(self._subscriptions)

    def wait_subscribed(self, prefix: bytes, timeout: float = 5.0) -> bytes:
        """Wait until a node subscribes something starting with `prefix` on our XPUB."""
        return self._wait(
            lambda: next((s for s in self._subscriptions if s.startswith(prefix)), None),
            timeout,
            lambda: (
                f"no subscription starting with {prefix!r} on our XPUB "
                f"(seen: {self._subscriptions[-10:]})"
            ),
        )

    def wait_connected(self, address: str, timeout: float = 5.0) -> str:
        """Wait until our SUB is connected to node `address` (a uuid); returns its endpoint."""
        return self._wait(
            lambda: (
                endpoint if (endpoint := self._senders.get(address)) in self._handshakes else None
            ),
            timeout,
            lambda: (
                f"our SUB is not connected to node {address} "
                f"(beacon saw {sorted(self._senders)}, connected {sorted(self._handshakes)})"
            ),
        )

    def _wait(self, found: Callable[[], T | None], timeout: float, failure: Callable[[], str]) -> T:
        deadline = time.monotonic() + timeout
        with self._state:
            while (result := found()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"test peer {self.address}: {failure()} after {timeout:g} s")
                self._state.wait(remaining)
            return result

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._thread.is_alive():
                self._control.send_multipart([b"$TERM"])
        finally:
            self._control.close(linger=2000)  # bounded, in case the thread died meanwhile
        self._thread.join()

    def __enter__(self) -> TestPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        ctx = self._context
        hwm = self._config.get_int("consumer/high_watermark")
        control = ctx.socket(zmq.PAIR)
        xpub = ctx.socket(zmq.XPUB)
        sub = ctx.socket(zmq.SUB)
        sockets = [control, xpub, sub]
        beacon: Beacon | None = None
        monitor: zmq.Socket | None = None
        try:
            for sock in sockets:
                sock.setsockopt(zmq.LINGER, 0)
            control.bind(self._control_endpoint)
            xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
            xpub.setsockopt(zmq.SNDHWM, hwm)
            sub.setsockopt(zmq.RCVHWM, hwm)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
            self.port = bind_data_socket(xpub, self._config, sub)
            beacon = Beacon(self._config, self.address, ctx)
            beacon.wait_ready()
            beacon.start(self.port)
        except BaseException as exc:  # handed to the constructor, which re-raises it
            self._error = exc
            self._shutdown(beacon, sub, monitor, sockets)
            self._started.set()
            return
        self._started.set()
        try:
            self._loop(beacon, control, xpub, sub, monitor)
        except BaseException as exc:
            self._error = exc  # surfaced by recv(), instead of a silent timeout
            raise
        finally:
            self._shutdown(beacon, sub, monitor, sockets)

    @staticmethod
    def _shutdown(
        beacon: Beacon | None,
        sub: zmq.Socket,
        monitor: zmq.Socket | None,
        sockets: list[zmq.Socket],
    ) -> None:
        if beacon is not None:
            beacon.close()
        if monitor is not None:
            sub.disable_monitor()
            monitor.close(linger=0)
        for sock in sockets:
            sock.close(linger=0)

    def _loop(
        self,
        beacon: Beacon,
        control: zmq.Socket,
        xpub: zmq.Socket,
        sub: zmq.Socket,
        monitor: zmq.Socket,
    ) -> None:
        poller = zmq.Poller()
        for sock in (control, xpub, sub, monitor, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        while True:
            timeout = max(0, beacon.next_deadline_ms() - now_ms())
            ready = dict(poller.poll(timeout))
            if beacon.socket in ready:
                self._on_beacon_events(beacon, beacon.handle(), sub)
            self._on_beacon_events(beacon, beacon.tick(now_ms()), sub)
            if monitor in ready:
                self._on_monitor(monitor)
            # Subscriptions first: a c_store ACK must see those that arrived with the data.
            if xpub in ready:
                self._on_subscriptions(xpub)
            if sub in ready:
                self._on_data(sub, xpub)
            if control in ready and not self._on_commands(control, xpub):
                return

    def _on_beacon_events(
        self, beacon: Beacon, events: list[tuple[str, str]], sub: zmq.Socket
    ) -> None:
        if not events:
            return
        apply_events(events, sub)
        with self._state:
            self._senders = dict(beacon.senders)
            for kind, endpoint in events:
                if kind == "DISCONNECT":
                    self._handshakes.discard(endpoint)
            self._state.notify_all()

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            endpoint = event["endpoint"]
            text = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
            with self._state:
                if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._handshakes.add(text)
                else:
                    self._handshakes.discard(text)
                self._state.notify_all()

    def _on_data(self, sub: zmq.Socket, xpub: zmq.Socket) -> None:
        while True:
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = proto.decode(frames)
            except MalformedMessage as exc:
                log.warning("test peer received a malformed message", error=str(exc))
                self.malformed.append(frames)
                continue
            if self._verbose:
                log.info("test peer received", peer=self.address, message=msg)
            if self._c_store:
                self._store(msg, xpub)
            self._received.put(msg)

    def _store(self, msg: Message, xpub: zmq.Socket) -> None:
        """What a C store writer does with a message (spec §5.3), one message at a time."""
        if msg.id == proto.DIRECT_RECORD and msg.topic != self.address.encode():
            return  # an answer to someone else's FETCH: a store never sees it
        if msg.id not in (proto.RECORD, proto.DIRECT_RECORD, proto.HEAD):
            return
        with self._state:
            records = self._stored.setdefault((msg.subject, msg.address), [])
            head = len(records) - 1
            if msg.id != proto.HEAD and msg.sequence == head + 1:
                records.append(msg.content)
                self._state.notify_all()
                stored = True
            else:
                stored = False
        if stored:
            self._ack(xpub, msg.address, msg.subject, msg.sequence)
        elif msg.sequence > head:
            count = self._filter.should_fetch(msg.subject, msg.address, head + 1, now_ms())
            if count is not None:
                fetch = Message(
                    proto.FETCH,
                    msg.address.encode(),
                    address=self.address,
                    subject=msg.subject,
                    sequence=head + 1,
                    count=count,
                )
                xpub.send_multipart(proto.encode(fetch))

    def _ack(self, xpub: zmq.Socket, partition: str, subject: str, sequence: int) -> None:
        prefix = proto.subscription(proto.ACK, partition)
        with self._state:
            since = self._subscribed_at.get(prefix)
            heard = since is not None and time.monotonic() - since >= self._slow_join
            if heard:
                self.acks_sent += 1
            else:
                self.acks_dropped += 1
        if heard:
            ack = Message(proto.ACK, partition.encode(), subject=subject, sequence=sequence)
            xpub.send_multipart(proto.encode(ack))

    def _on_subscriptions(self, xpub: zmq.Socket) -> None:
        while True:
            try:
                frame = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame[:1] == b"\x01":
                with self._state:
                    self._subscriptions.append(frame[1:])
                    self._subscribed_at.setdefault(frame[1:], time.monotonic())
                    self._state.notify_all()

    def _on_commands(self, control: zmq.Socket, xpub: zmq.Socket) -> bool:
        while True:
            try:
                frames = control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return True
            if frames[0] == b"$TERM":
                return False
            xpub.send_multipart(frames[1:])
