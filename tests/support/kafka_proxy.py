"""Stands in for a broker that never answers one kind of request (a hung or overloaded
broker), which a test cannot provoke on Tansu otherwise: a TCP proxy that forwards a
broker's traffic and swallows the requests whose API key is in `drop` (the broker never
sees them, so the client never gets an answer).

The broker must advertise the proxy's address (`TansuBroker(advertised=proxy.port)`), so
that every connection librdkafka makes after bootstrapping goes through here."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class KafkaProxy:
    def __init__(self, target_port: int, listen_port: int = 0) -> None:
        self.drop: set[int] = set()
        self.dropped: list[int] = []
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> KafkaProxy:
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
                return
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._socks += [client, server]
            self._spawn(self._requests, client, server)
            self._spawn(self._raw, server, client)

    def _requests(self, source: socket.socket, sink: socket.socket) -> None:
        buffer = b""
        try:
            while data := source.recv(65536):
                buffer += data
                while len(buffer) >= 6:
                    (size,) = struct.unpack(">i", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                    (api_key,) = struct.unpack(">h", frame[4:6])
                    if api_key in self.drop:
                        self.dropped.append(api_key)
                        continue
                    sink.sendall(frame)
        except OSError:
            pass
        self._shut(source, sink)

    def _raw(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        self._shut(source, sink)

    @staticmethod
    def _shut(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            self._shut(sock)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=5)
