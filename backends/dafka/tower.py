"""The tower (spec §1.8, §2.4, §6): a stateless relay of beacons.

XSUB (`tower/sub_address`) receives `["B", sender, host, port]` from beacon PUBs; XPUB
(`tower/pub_address`, welcome message `W`) fans out `["B", sender, "tcp://host:port"]`.
An empty host is replaced by the beacon connection's peer IP, or by this machine's own
interface address when the peer is local (inproc or loopback), as C does. Subscriptions
from beacon SUBs are forwarded upstream, except the welcome `W` ones.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import socket
import struct
import threading
import uuid

import structlog
import zmq

from backends.dafka import security
from backends.dafka.beacon import attach, format_endpoint
from backends.dafka.config import Config

log = structlog.get_logger(__name__)

_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_LOCAL_PEERS = frozenset(("127.0.0.1", "::1", "::ffff:127.0.0.1"))


def own_ip() -> str:
    """The IPv4 address of the first non-loopback interface that is up (CZMQ `ziflist`).

    Read from the kernel with ioctls: nothing is sent and no socket connects anywhere.
    Falls back to 127.0.0.1 when there is no such interface.
    """
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return "127.0.0.1"
    with probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(probe, _SIOCGIFFLAGS, request), 16)[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                reply = fcntl.ioctl(probe, _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address on this interface
            address = socket.inet_ntoa(array.array("B", reply[20:24]).tobytes())
            if not address.startswith("127."):
                return address
    return "127.0.0.1"


def beacon_endpoint(host: str, port: str, peer_address: str | None, local_ip: str) -> str:
    """The endpoint the tower publishes for a beacon (spec §2.4)."""
    if not host:
        host = local_ip if peer_address is None or peer_address in _LOCAL_PEERS else peer_address
    return format_endpoint(host, port)


class Tower:
    """The tower actor: one thread owning an XSUB and an XPUB. `close()` stops and joins it."""

    def __init__(self, config: Config, context: zmq.Context | None = None) -> None:
        self._context = context or zmq.Context.instance()
        self._sub_spec = config.get("tower/sub_address")
        self._pub_spec = config.get("tower/pub_address")
        self._verbose = config.get_bool("tower/verbose")
        self._config = config
        self._control = f"inproc://dafka-tower-{uuid.uuid4().hex}"
        self._local_ip = own_ip()
        self.sub_endpoints: list[str] = []  # as bound (wildcard ports resolved)
        self.pub_endpoints: list[str] = []
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dafka-tower", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    @property
    def sub_endpoint(self) -> str:
        """The first bound XSUB endpoint (what beacons' `beacon/sub_address` points to)."""
        return self.sub_endpoints[0]

    @property
    def pub_endpoint(self) -> str:
        """The first bound XPUB endpoint (what beacons' `beacon/pub_address` points to)."""
        return self.pub_endpoints[0]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            stop = self._context.socket(zmq.PAIR)
            try:
                stop.connect(self._control)
                stop.send(b"$TERM")
            finally:
                # Bounded: should the thread have died meanwhile, nobody reads the pipe.
                stop.close(linger=2000)
        self._thread.join()

    def __enter__(self) -> Tower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        ctx = self._context
        control = ctx.socket(zmq.PAIR)
        xsub = ctx.socket(zmq.XSUB)
        xpub = ctx.socket(zmq.XPUB)
        sockets = (control, xsub, xpub)
        bound: list[tuple[zmq.Socket, str]] = []
        try:
            for sock in sockets:
                sock.setsockopt(zmq.LINGER, 0)
            xpub.setsockopt(zmq.XPUB_WELCOME_MSG, b"W")
            for sock in (xsub, xpub):
                security.serve(sock, self._config)
            control.bind(self._control)
            self.sub_endpoints = _attach_all(xsub, self._sub_spec, "tower/sub_address", bound)
            self.pub_endpoints = _attach_all(xpub, self._pub_spec, "tower/pub_address", bound)
        except BaseException as exc:  # reported to the constructor, which re-raises it
            self._error = exc
            _release(bound, sockets)
            self._started.set()
            return
        self._started.set()
        if self._verbose:
            log.info("tower started", sub=self.sub_endpoints, pub=self.pub_endpoints)
        try:
            self._loop(control, xsub, xpub)
        finally:
            _release(bound, sockets)

    def _loop(self, control: zmq.Socket, xsub: zmq.Socket, xpub: zmq.Socket) -> None:
        poller = zmq.Poller()
        for sock in (control, xsub, xpub):
            poller.register(sock, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if control in ready:
                return
            if xsub in ready:
                self._relay_beacons(xsub, xpub)
            if xpub in ready:
                self._forward_subscriptions(xpub, xsub)

    def _relay_beacons(self, xsub: zmq.Socket, xpub: zmq.Socket) -> None:
        while True:
            try:
                first = xsub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            frames = [first.bytes]
            while xsub.getsockopt(zmq.RCVMORE):
                frames.append(xsub.recv())
            if len(frames) != 4 or frames[0] != b"B":
                if self._verbose:
                    log.warning("tower dropped a malformed beacon", frames=frames[:4])
                continue
            try:
                peer: str | None = str(first.get("Peer-Address"))
            except zmq.ZMQError:
                peer = None  # inproc has no peer address
            try:
                host, port = frames[2].decode(), int(frames[3])
            except (UnicodeDecodeError, ValueError):
                if self._verbose:
                    log.warning("tower dropped a beacon with a bad host/port", frames=frames)
                continue
            endpoint = beacon_endpoint(host, str(port), peer, self._local_ip)
            xpub.send_multipart([b"B", frames[1], endpoint.encode()])

    def _forward_subscriptions(self, xpub: zmq.Socket, xsub: zmq.Socket) -> None:
        while True:
            try:
                frame = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            # Welcome subscriptions are the tower's own business; the rest (`\x01B`) make
            # the beacons' PUBs start sending to us.
            if len(frame) >= 2 and frame[1:2] == b"W":
                continue
            xsub.send(frame)


def _release(bound: list[tuple[zmq.Socket, str]], sockets: tuple[zmq.Socket, ...]) -> None:
    """Unbind, then close. Closing alone leaves the endpoints to ZeroMQ's reaper thread,
    which frees them some time later: a tower started on the same inproc endpoints right
    after `close()` returned could find them still taken. `unbind` frees an inproc
    endpoint before it returns."""
    for sock, endpoint in bound:
        with contextlib.suppress(zmq.ZMQError):  # left to the reaper, as without unbind
            sock.unbind(endpoint)
    for sock in sockets:
        sock.close(linger=0)


def _attach_all(
    sock: zmq.Socket, spec: str, setting: str, bound: list[tuple[zmq.Socket, str]]
) -> list[str]:
    """Bind (or, with a `>` prefix, connect) every endpoint of `spec`; returns them with
    wildcard ports resolved, e.g. `tcp://127.0.0.1:*` -> `tcp://127.0.0.1:41234`. Adds
    the bound ones to `bound`."""
    result: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        if entry[0] == ">":
            result.extend(attach(sock, entry, setting))
            continue
        attach(sock, "@" + entry.lstrip("@"), setting)
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        endpoint = last.decode() if isinstance(last, bytes) else str(last)
        bound.append((sock, endpoint))
        result.append(endpoint)
    if not result:
        raise ValueError(f"{setting} is empty: nothing to bind")
    return result
