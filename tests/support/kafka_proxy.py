"""Stands in for a broker that never answers one kind of request (a hung or overloaded
broker), which a test cannot provoke on Tansu otherwise: a TCP proxy that forwards a
broker's traffic and swallows the requests whose API key is in `drop` (the broker never
sees them, so the client never gets an answer).

The broker must advertise the proxy's address (`TansuBroker(advertised=proxy.port)`), so
that every connection librdkafka makes after bootstrapping goes through here."""

from __future__ import annotations

import socket
import struct

from tests.support.proxy import TcpProxy, shut_down


class KafkaProxy(TcpProxy):
    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.drop: set[int] = set()  # API keys of the requests swallowed
        self.dropped: list[int] = []

    def _upstream(self, client: socket.socket, server: socket.socket) -> None:
        buffer = b""
        try:
            while data := client.recv(65536):
                buffer += data
                while len(buffer) >= 6:  # a request: int32 size, then int16 API key
                    (size,) = struct.unpack(">i", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    request, buffer = buffer[: 4 + size], buffer[4 + size :]
                    (api_key,) = struct.unpack(">h", request[4:6])
                    if api_key in self.drop:
                        self.dropped.append(api_key)
                    else:
                        server.sendall(request)
        except OSError:
            pass
        shut_down(client, server)
