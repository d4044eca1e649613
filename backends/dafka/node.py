"""The thread-and-socket set-up every Dafka actor of ours repeats, in one place.

`Actor`: one thread owning its sockets (spec §2.1), a beacon that announces its data
socket, and the inproc PAIR its owner wakes it through. The constructor returns once the
beacon heard the tower (or raises what went wrong, every socket closed); `_shut_down()`
wakes the thread with `T`, joins it and closes the pipe, exactly once (subclasses name it
`close()`, with what their users need around it). A subclass opens its
sockets (`_open`), runs its loop (`_serve`) and may clean up its own state (`_stopped`).
The producer, the consumer and the store's writer and reader are actors.

`Node`: an actor of the gateway's own kind (the consumer, the observer, the reader): a
SUB it connects to its peers and an XPUB it binds as its data socket. Subclasses say what
the SUB subscribes to (`_subscriptions`) and run the loop (`_loop`).
"""

from __future__ import annotations

import contextlib
import itertools
import resource
import threading
import uuid
from collections.abc import Callable, Iterator

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, bind_data_socket
from backends.dafka.config import Config
from backends.dafka.held_send import held_sender
from backends.dafka.scheduling import SETTING as BATCH_SETTING
from backends.dafka.scheduling import run_as_batch

log = structlog.get_logger(__name__)

_instances = itertools.count()

# Makes a socket of the given type owned by the actor thread (linger 0, closed at its end).
SocketFactory = Callable[[int], zmq.Socket]


def messages(sock: zmq.Socket, limit: int | None = None) -> Iterator[proto.Message]:
    """The messages waiting on `sock`, decoded, until none is left (or `limit` were read);
    malformed ones are dropped, as C drops them (spec §1.6)."""
    read = 0
    while limit is None or read < limit:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        read += 1
        try:
            msg = proto.decode(frames)
        except proto.MalformedMessage:
            continue
        yield msg


def allow_sockets(context: zmq.Context | None = None) -> int:
    """Let `context` (the shared instance by default) open as many sockets as the process
    may open files, instead of libzmq's 1,023: a gateway holds about six per partition it
    writes, so the default stopped it at ~170 partitions ("Too many open files"). Takes
    effect only before the context's first socket. Returns the limit set."""
    ctx = context or zmq.Context.instance()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = ctx.get(zmq.SOCKET_LIMIT)
    limit = cap if soft == resource.RLIM_INFINITY else max(1023, min(soft, cap))
    ctx.set(zmq.MAX_SOCKETS, limit)
    return limit


class Actor:
    kind = "actor"  # for thread names, pipe endpoints and log lines
    # Peers (by address) whose beacons this actor ignores: ones that can send it nothing it
    # subscribes to. A subclass sets it before calling __init__.
    _ignore_peers: Callable[[str], bool] | None = None

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None,
        lock: threading.Lock | threading.Condition | None = None,
        *,
        address: str | None = None,
    ) -> None:
        """Subclasses set what their loop needs before calling this: the thread starts
        here. `lock` (default: a new one) guards `_closed` and the owner's end of the
        pipe; a subclass may share its own. `address` defaults to a new uuid."""
        self.address = address if address is not None else uuid.uuid4().hex.upper()
        self.port = 0  # the data socket's, once the constructor returned
        self._config = config
        self._context = context or zmq.Context.instance()
        self._lock = lock or threading.Lock()
        self._closed = False
        self._pipe_endpoint = f"inproc://dafka-{self.kind}-{self.address}-{next(_instances)}"
        self._pipe = self._context.socket(zmq.PAIR)
        self._pipe.linger = 0
        self._pipe.bind(self._pipe_endpoint)
        # The owner (mostly the event loop) wakes the thread holding the GIL: pyzmq's send
        # gave it up, and the loop then waited for it behind the thread it had just woken
        # (a reader draining its socket): 7% of the loop's time at 10,000 records/s.
        self._pipe_send = held_sender(self._pipe)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=self._thread_name(), daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._pipe.close()
            self._closed = True
            raise self._error

    def _thread_name(self) -> str:
        return f"dafka-{self.kind}"

    def _wake(self, command: bytes) -> None:
        """Tell the thread (the caller holds `_lock`); never blocks on a dead thread."""
        if self._pipe.closed:  # `_join` closes it under `_lock`: a raw send would crash
            return
        with contextlib.suppress(zmq.Again):
            self._pipe_send(command, zmq.NOBLOCK)

    def _shut_down(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake(b"T")
        self._join()

    def _join(self) -> None:
        """After `_closed` was set and the thread told to stop: wait for it to end."""
        self._thread.join()
        with self._lock:  # not while an owner's call wakes the thread (`_wake`)
            self._pipe.close()

    # -- the thread -----------------------------------------------------------------------

    def _open(self, socket: SocketFactory) -> int:
        """Make (through `socket`) and bind this actor's sockets; the data socket's port."""
        raise NotImplementedError

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        """The loop, until the owner's `T` on `pipe` (or an error)."""
        raise NotImplementedError

    def _stopped(self, error: BaseException | None) -> None:
        """On the thread once the loop ended (`error`: what ended it), sockets still open."""

    def _run(self) -> None:
        if self._config.get_bool(BATCH_SETTING):
            run_as_batch()
        sockets: list[zmq.Socket] = []

        def socket(kind: int) -> zmq.Socket:
            sock = self._context.socket(kind)
            sock.linger = 0
            sockets.append(sock)
            return sock

        beacon: Beacon | None = None
        try:
            pipe = socket(zmq.PAIR)
            pipe.connect(self._pipe_endpoint)
            self.port = self._open(socket)
            beacon = Beacon(self._config, self.address, self._context, self._ignore_peers)
            beacon.wait_ready()
            beacon.start(self.port)
        except BaseException as error:  # handed to the constructor, which re-raises it
            self._error = error
            if beacon is not None:
                beacon.close()
            for sock in sockets:
                sock.close()
            self._ready.set()
            return
        self._ready.set()
        failure: BaseException | None = None
        try:
            self._serve(pipe, beacon)
        except BaseException as error:
            failure = self._error = error
            log.exception(f"dafka {self.kind} stopped on an error", node=self.address)
        finally:
            try:
                self._stopped(failure)
            finally:
                beacon.stop()
                beacon.close()
                for sock in sockets:
                    sock.close()


class Node(Actor):
    kind = "node"
    # Both sockets' high-water mark, when a subclass sets one (else ZeroMQ's default).
    _hwm: int | None = None

    def _subscriptions(self) -> list[bytes]:
        raise NotImplementedError

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        raise NotImplementedError

    def _open(self, socket: SocketFactory) -> int:
        self._sub = sub = socket(zmq.SUB)
        self._xpub = xpub = socket(zmq.XPUB)
        if self._hwm is not None:
            sub.rcvhwm = self._hwm
            xpub.sndhwm = self._hwm
        # A SUB sends only its subscriptions, and drops those past its send high-water
        # mark (1,000 by default): a node subscribing 500 topics at once (M and H each)
        # lost some for good. Unbounded: at most its own subscriptions are queued.
        sub.sndhwm = 0
        xpub.setsockopt(zmq.XPUB_VERBOSE, 1)
        port = bind_data_socket(xpub, self._config, sub)
        for prefix in self._subscriptions():
            sub.setsockopt(zmq.SUBSCRIBE, prefix)
        return port

    def _serve(self, pipe: zmq.Socket, beacon: Beacon) -> None:
        self._loop(pipe, self._sub, self._xpub, beacon)

    def close(self) -> None:
        self._shut_down()
