"""A Dafka node of the gateway's own kind (the observer, the reader): one thread owning a
SUB it connects to its peers, an XPUB it binds as its data socket and announces through
its beacon, and the inproc PAIR its owner wakes it through.

The constructor returns once the beacon heard the tower (or raises what went wrong);
`close()` stops and joins the thread and closes its sockets, exactly once. Subclasses say
what the SUB subscribes to and run the loop.
"""

from __future__ import annotations

import contextlib
import itertools
import resource
import threading
import uuid

import structlog
import zmq

from backends.dafka.beacon import Beacon, bind_data_socket
from backends.dafka.config import Config

log = structlog.get_logger(__name__)

_instances = itertools.count()


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


class Node:
    kind = "node"  # for thread names, pipe endpoints and log lines

    def __init__(
        self,
        config: Config,
        context: zmq.Context | None,
        lock: threading.Lock | threading.Condition | None = None,
    ) -> None:
        """Subclasses set what their loop needs before calling this: the thread starts
        here. `lock` (default: a new one) guards `_closed` and the owner's end of the
        pipe; a subclass may share its own."""
        self.address = uuid.uuid4().hex.upper()
        self._config = config
        self._context = context or zmq.Context.instance()
        self._lock = lock or threading.Lock()
        self._closed = False
        self._pipe_endpoint = f"inproc://dafka-{self.kind}-{self.address}-{next(_instances)}"
        self._pipe = self._context.socket(zmq.PAIR)
        self._pipe.linger = 0
        self._pipe.bind(self._pipe_endpoint)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"dafka-{self.kind}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._pipe.close()
            self._closed = True
            raise self._error

    def _wake(self, command: bytes) -> None:
        """Tell the thread (the caller holds `_lock`); never blocks on a dead thread."""
        with contextlib.suppress(zmq.Again):
            self._pipe.send(command, zmq.NOBLOCK)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake(b"T")
        self._thread.join()
        self._pipe.close()

    # -- the thread -----------------------------------------------------------------------

    def _subscriptions(self) -> list[bytes]:
        raise NotImplementedError

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        raise NotImplementedError

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
            port = bind_data_socket(xpub, self._config, sub)
            for prefix in self._subscriptions():
                sub.setsockopt(zmq.SUBSCRIBE, prefix)
            beacon = Beacon(self._config, self.address, ctx)
            beacon.wait_ready()
            beacon.start(port)
        except BaseException as error:  # handed to the constructor, which re-raises it
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
            log.exception(f"dafka {self.kind} stopped on an error", node=self.address)
        finally:
            beacon.stop()
            beacon.close()
            for sock in (pipe, sub, xpub):
                sock.close()
