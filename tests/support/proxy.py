"""A TCP proxy on 127.0.0.1 whose connections a test can cut, as a network failure would:
the client and the server both see their connection closed, the listener stays up.

With `hold_after=N`, each connection forwards only the first N bytes the client sends and
then holds the rest (the client's later commands never reach the server, their replies
never come) until the test cuts it: a client stopped mid-stream at a point the test
does not have to race for.

With `gated=N`, the connection numbered N (0-based, in the order clients connect) is held
before it is connected through, until the test sets `gate`: a point between two calls of
a client that opens a connection per call."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self


class TcpProxy:
    def __init__(
        self, target_port: int, hold_after: int | None = None, gated: int | None = None
    ) -> None:
        self._target = ("127.0.0.1", target_port)
        self.hold_after = hold_after  # read when a connection is accepted
        self.held = 0  # connections holding the client's bytes
        self._gated = gated
        self.gate = threading.Event()
        self.arrived = 0  # connections clients made, connected through or not
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.accepted = 0
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self) -> Self:
        self._spawn(self._accept)
        return self

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            number, self.arrived = self.arrived, self.arrived + 1
            if number == self._gated:
                self._spawn(self._connect_at_gate, client)
            elif not self._connect(client):
                return

    def _connect_at_gate(self, client: socket.socket) -> None:
        self.gate.wait()  # set by the test, or by close()
        self._connect(client)

    def _connect(self, client: socket.socket) -> bool:
        """Connect `client` through; False once the proxy is closed."""
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return True
        server.settimeout(None)
        with self._lock:
            if self._closed:
                client.close()
                server.close()
                return False
            self._pairs.append((client, server))
            self.accepted += 1
        self._spawn(self._upstream, client, server)
        self._spawn(self._pump, server, client, None)
        return True

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        """What the client sends, to the server (subclasses may hold some of it back)."""
        self._pump(client, server, self.hold_after)

    def _pump(self, source: socket.socket, sink: socket.socket, limit: int | None) -> None:
        forwarded = 0
        try:
            while data := source.recv(65536):
                if limit is not None and forwarded + len(data) > limit:
                    sink.sendall(data[: limit - forwarded])
                    with self._lock:
                        self.held += 1
                    return  # hold: the connection stays open until cut
                sink.sendall(data)
                forwarded += len(data)
        except OSError:
            pass
        shut_down(source, sink)

    def cut(self) -> int:
        """Close every current connection at both ends; returns how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        return len(pairs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.gate.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
        self._listener.close()
        self.cut()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def shut_down(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
