"""Discovery client (spec §1.8, §2.3): announce "I am <sender>, my data socket is on <port>"
through the tower(s), and turn other nodes' announcements into CONNECT/DISCONNECT events.

Unlike C's beacon actor this has no thread: the owner registers `socket` in its poller,
calls `handle()` when it is readable and `tick(now_ms())` when `next_deadline_ms()` has
passed, and applies the returned events to its data SUB socket(s).

Fix of spec §10.17: `wait_ready` is bounded and raises TowerUnreachable instead of blocking
forever when no tower answers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections.abc import Callable, Iterator

import structlog
import zmq

from backends.dafka import proto, security
from backends.dafka.config import Config
from backends.dafka.doubling import DoublingGap

log = structlog.get_logger(__name__)

REAP_INTERVAL_MS = 1000  # fixed in C
# After the announcement at start, the next comes this long after, each next one twice as
# long after the one before (`DoublingGap`), until the tower sends one back (every node has
# it then), or up to beacon/interval. The PUB drops what it sends before the tower's
# subscription has reached it, which may be just after the welcome: the first announcement
# was often lost, and the other nodes heard of a new one (a fresh gateway's writers, whose
# first records the stores then missed) a beacon/interval later (1 s).
FIRST_ANNOUNCE_GAP_MS = 50
CONNECT = "CONNECT"
DISCONNECT = "DISCONNECT"

Event = tuple[str, str]  # ("CONNECT" | "DISCONNECT", "tcp://host:port")


class TowerUnreachable(Exception):
    """No tower welcomed the beacon within the ready timeout."""


def now_ms() -> int:
    """The clock of `tick` and `next_deadline_ms`: monotonic milliseconds."""
    return time.monotonic_ns() // 1_000_000


def format_endpoint(host: str, port: int | str) -> str:
    """`tcp://host:port`, with IPv6 literals bracketed (C forgets the brackets)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def parse_endpoints(spec: str) -> list[tuple[bool, str]]:
    """CZMQ `zsock_attach` lists: comma-separated, `@` = bind, `>` or nothing = connect.
    Returns (bind?, endpoint) pairs."""
    result: list[tuple[bool, str]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry[0] in "@>":
            result.append((entry[0] == "@", entry[1:].strip()))
        else:
            result.append((False, entry))
    return result


def _wants_ipv6(endpoint: str) -> bool:
    return "[" in endpoint


def attach(sock: zmq.Socket, spec: str, setting: str) -> list[str]:
    """Bind/connect `sock` to every endpoint of `spec`; returns the endpoints.
    Raises ValueError naming the config `setting` on an empty list or a bad endpoint."""
    endpoints = parse_endpoints(spec)
    if not endpoints:
        raise ValueError(f"{setting} is empty: no tower endpoint to use")
    if any(_wants_ipv6(endpoint) for _, endpoint in endpoints):
        sock.setsockopt(zmq.IPV6, 1)
    for bind, endpoint in endpoints:
        try:
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as exc:
            action = "bind" if bind else "connect"
            raise ValueError(f"cannot {action} {endpoint!r} from {setting}: {exc}") from exc
    return [endpoint for _, endpoint in endpoints]


def bind_data_socket(sock: zmq.Socket, config: Config, *subscribers: zmq.Socket) -> int:
    """Bind a node's data socket to an ephemeral port and return it (C: `tcp://*:*`).

    When `beacon/address` is an IP literal the socket binds only that address, so a node
    advertised as 127.0.0.1 is not reachable from other interfaces either. With CURVE on,
    the socket serves with the network's key and the node's `subscribers` (the SUBs it
    connects to its peers) authenticate with its own (`security.py`).
    """
    security.serve(sock, config)
    for subscriber in subscribers:
        security.join(subscriber, config)
    host = config.get("beacon/address").strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return int(sock.bind_to_random_port("tcp://*"))
    if ip.version == 6:
        sock.setsockopt(zmq.IPV6, 1)
        return int(sock.bind_to_random_port(f"tcp://[{ip}]"))
    return int(sock.bind_to_random_port(f"tcp://{ip}"))


class Beacon:
    """One node's beacon; every method must be called from the owner's thread."""

    def __init__(
        self,
        config: Config,
        sender: str,
        context: zmq.Context | None = None,
        ignore: Callable[[str], bool] | None = None,
    ) -> None:
        """`ignore(sender)` True: never connect to that peer (a node that can send its
        owner nothing it subscribes to, e.g. another producer for a producer)."""
        self.sender = sender
        self._ignore = ignore
        self._sender_bytes = sender.encode()
        self._address = config.get("beacon/address").encode()
        self._interval = max(1, config.get_int("beacon/interval"))
        self._timeout = config.get_int("beacon/timeout")
        self._ready_timeout = config.get_int("beacon/ready_timeout") / 1000
        self._verbose = config.get_bool("beacon/verbose")
        self._closed = False
        ctx = context or zmq.Context.instance()
        self._pub: zmq.Socket = ctx.socket(zmq.PUB)
        self.socket: zmq.Socket = ctx.socket(zmq.SUB)
        for sock in (self._pub, self.socket):
            sock.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"W")
        self.socket.setsockopt(zmq.SUBSCRIBE, b"B")
        try:
            security.join(self.socket, config)
            security.join(self._pub, config)
            # Naming trap (spec §2.1): our SUB listens to the tower's XPUB = pub_address.
            self.endpoints = attach(
                self.socket, config.get("beacon/pub_address"), "beacon/pub_address"
            )
            attach(self._pub, config.get("beacon/sub_address"), "beacon/sub_address")
        except ValueError:
            self.close()
            raise
        self.ready = False
        self.port = -1
        self.peers: dict[str, int] = {}  # endpoint -> expiry (now_ms clock)
        self.senders: dict[str, str] = {}  # sender uuid -> its last announced endpoint
        self._next_announce: int | None = None
        self._announce_gaps = DoublingGap(self._interval, self._interval)
        self._next_reap = now_ms() + REAP_INTERVAL_MS
        self._pending: list[Event] = []  # events read by wait_ready, handed out by tick

    # --- owner API -----------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until a tower's welcome `W` arrives (seconds; default beacon/ready_timeout)."""
        limit = self._ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self.ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.socket.poll(max(1, int(remaining * 1000))):
                if self.ready:
                    break
                raise TowerUnreachable(
                    f"no Dafka tower answered within {limit:g} s on "
                    f"{', '.join(self.endpoints)} (beacon/pub_address); is dafka-towerd running?"
                )
            self._pending.extend(self._drain(stop_at_welcome=True))

    def start(self, port: int) -> None:
        """Announce `port` now, again soon after until the tower relays one back
        (FIRST_ANNOUNCE_GAP_MS), and then every beacon/interval ms."""
        self.port = port
        self._announce()
        self._announce_gaps = DoublingGap(FIRST_ANNOUNCE_GAP_MS, self._interval)
        self._next_announce = now_ms() + self._announce_gaps.gap

    def stop(self) -> None:
        self.port = -1
        self._next_announce = None

    def handle(self) -> list[Event]:
        """Read everything the tower sent; call when `socket` is readable."""
        events, self._pending = self._pending, []
        events.extend(self._drain(stop_at_welcome=False))
        return events

    def tick(self, now: int) -> list[Event]:
        """Run due timers (announce, reap dead peers); `now` is `now_ms()`."""
        events, self._pending = self._pending, []
        if self._next_announce is not None and now >= self._next_announce:
            self._announce()
            self._next_announce = now + self._announce_gaps.double()
        if now >= self._next_reap:
            self._next_reap = now + REAP_INTERVAL_MS
            for endpoint, expiry in list(self.peers.items()):
                if now > expiry:
                    del self.peers[endpoint]
                    for sender in [s for s, e in self.senders.items() if e == endpoint]:
                        del self.senders[sender]
                    if self._verbose:
                        log.debug("beacon peer gone", sender=self.sender, endpoint=endpoint)
                    events.append((DISCONNECT, endpoint))
        return events

    def next_deadline_ms(self) -> int:
        """When `tick` next has work (now_ms clock); now if events are waiting."""
        if self._pending:
            return 0
        if self._next_announce is None:
            return self._next_reap
        return min(self._next_announce, self._next_reap)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pub.close(linger=0)
        self.socket.close(linger=0)

    # --- internals -----------------------------------------------------------------------

    def _announce(self) -> None:
        if self.port < 0:
            return
        frames = [b"B", self._sender_bytes, self._address, str(self.port).encode()]
        # zmq.Again: no tower subscribed yet; the next interval announces again.
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(frames, zmq.NOBLOCK)

    def _drain(self, stop_at_welcome: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return events
            if frames == [b"W"]:
                self.ready = True
                if stop_at_welcome:
                    return events
            elif len(frames) == 3 and frames[0] == b"B":
                event = self._on_beacon(frames[1], frames[2])
                if event is not None:
                    events.append(event)
            elif self._verbose:
                log.debug("beacon ignored a malformed message", frames=frames[:4])

    def _on_beacon(self, sender_bytes: bytes, endpoint_bytes: bytes) -> Event | None:
        if sender_bytes == self._sender_bytes:
            if self._announce_gaps.quick and self._next_announce is not None:
                # Our own, back from the tower: heard by every node; no more quick repeats.
                self._announce_gaps.settle()
                self._next_announce = now_ms() + self._interval
            return None
        try:
            sender = sender_bytes.decode()
            endpoint = endpoint_bytes.decode()
        except UnicodeDecodeError:
            return None
        if not endpoint.startswith("tcp://"):
            return None
        if self._ignore is not None and self._ignore(sender):
            return None
        self.senders[sender] = endpoint
        known = endpoint in self.peers
        self.peers[endpoint] = now_ms() + self._timeout
        if known:
            return None
        if self._verbose:
            log.debug("beacon new peer", sender=self.sender, peer=sender, endpoint=endpoint)
        # Answer at once so the newcomer learns about us within one round trip.
        self._announce()
        return (CONNECT, endpoint)


def apply_events(events: list[Event], *sockets: zmq.Socket) -> None:
    """Connect/disconnect the owner's data SUB socket(s) as the beacon says (spec §2.3.6)."""
    for kind, endpoint in events:
        for sock in sockets:
            if kind == CONNECT:
                if _wants_ipv6(endpoint):
                    sock.setsockopt(zmq.IPV6, 1)
                try:
                    sock.connect(endpoint)
                except zmq.ZMQError as exc:
                    log.warning("cannot connect to peer", endpoint=endpoint, error=str(exc))
            else:
                # ENOENT: never connected (e.g. the connect failed); nothing to undo.
                with contextlib.suppress(zmq.ZMQError):
                    sock.disconnect(endpoint)


def subscription_events(xpub: zmq.Socket) -> Iterator[proto.XpubEvent]:
    """Drain an XPUB's pending (un)subscription events (spec §1.5). A verbose XPUB reports
    every subscription, but an unsubscription only when no subscriber is left for it
    (e.g. the SUB of a node whose uuid it names disconnected)."""
    while True:
        try:
            frame = xpub.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        event = proto.decode_xpub_event(frame)
        if event is not None:
            yield event


def new_subscribers(xpub: zmq.Socket, msg_id: int) -> Iterator[bytes]:
    """Drain an XPUB's pending subscription events and yield, for each new subscription to
    `msg_id` messages, the rest of its prefix (the subscriber's uuid in Dafka's handshakes,
    spec §1.5). Unsubscriptions and other ids are consumed and ignored."""
    for event in subscription_events(xpub):
        if event.is_subscribe and event.id == msg_id:
            yield event.rest
