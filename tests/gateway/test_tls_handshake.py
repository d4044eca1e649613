"""The TLS handshake inside the connection (gateway.connection, `loop.start_tls`) at its
edges, over real sockets, on both event loops, on the in-memory engine: commands that
come with the end of the handshake, and clients that reset during it. Each test failed on
the first version of the change (found in its review)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runner import ServerThread
from tests.gateway.test_tls import memory_config, tls_raw, tls_settings
from tests.support import resp
from tests.support.certs import Certs, make_certs
from tests.support.fixtures import EngineFactories
from tests.support.gateway import running
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(params=["asyncio", "uvloop"])
def tls_gateway(
    request: pytest.FixtureRequest, engines: EngineFactories, certs: Certs
) -> Iterator[ServerThread]:
    config = memory_config(engines, event_loop=request.param, **tls_settings(certs, "no"))
    with running(config) as server:
        yield server


class BioClient:
    """A TLS client over a MemoryBIO: what it sends is put on the wire only when asked,
    so that the end of its handshake, its first commands and its close_notify can go
    out in one write (as a fast client on a busy server has them read at once)."""

    def __init__(
        self, port: int, certs: Certs, cert: Path | None = None, key: Path | None = None
    ) -> None:
        context = ssl.create_default_context(cafile=str(certs.ca))
        if cert is not None:
            context.load_cert_chain(str(cert), str(key))
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def handshake(self) -> None:
        """Run the client's side of the handshake; its last flight stays unsent."""
        while True:
            try:
                self.tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                pending = self.outgoing.read()
                if pending:
                    self.sock.sendall(pending)
                chunk = self.sock.recv(65536)
                assert chunk, "the server closed the connection during the handshake"
                self.incoming.write(chunk)

    def close_notify(self) -> None:
        with contextlib.suppress(ssl.SSLWantReadError):  # ours is sent; theirs not awaited
            self.tls.unwrap()

    def flush(self) -> None:
        self.sock.sendall(self.outgoing.read())

    def read_all(self, seconds: float = 10) -> bytes:
        """Decrypted bytes until the server closes (reset or EOF)."""
        self.sock.settimeout(seconds)
        got = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                self.incoming.write(chunk)
            else:
                self.incoming.write_eof()
            while True:
                try:
                    data = self.tls.read(65536)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    break
                if not data:
                    break
                got += data
            if not chunk:
                return got

    def close(self) -> None:
        self.sock.close()


def test_commands_sent_with_the_end_of_the_handshake_and_a_close_notify_are_run(
    tls_gateway: ServerThread, certs: Certs, engines: EngineFactories
) -> None:
    """A client that sends its commands right behind its handshake and closes at once
    (TLS close_notify), read by the server in one go (as a busy server reads a fast
    client). Before 3d07f90 (handshake in create_server) the session was open when the
    commands were decrypted and they ran, as on the plaintext port. On asyncio's loop
    they now reach the connection before _start_tls has opened the session (parked in
    the parser), and the close_notify decrypted in the same callback ends the connection
    and cancels that task: the commands never run, the record is lost, no reply."""
    topic = engines("memory").new_topic(1)
    client = BioClient(tls_gateway.tls_port, certs)
    try:
        client.handshake()
        client.tls.write(resp.command("RPUSHX", f"topics:{topic}", "sent") + resp.command("PING"))
        client.close_notify()
        client.flush()
        got = client.read_all()
    finally:
        client.close()
    # What a consumer finds on the topic: the record, then a marker produced after it.
    with tls_raw(tls_gateway.tls_port, certs) as other:
        other.command("RPUSHX", f"topics:{topic}", "marker")
        other.expect(b":1\r\n")
        other.command("CLIENT", "SETNAME", "review-group:one")
        other.expect(b"$2\r\nOK\r\n")
        other.command("BLPOP", f"topics:{topic}", "10")
        first = other.read_reply()
    assert first[-1] == b"sent", (
        "RPUSHX sent right behind the handshake and followed by close_notify was not run: "
        f"the first record on the topic is {first!r}, not b'sent' (the client got {got!r})"
    )
    assert got == b":1\r\n+PONG\r\n", (
        "RPUSHX and PING sent right behind the handshake and followed by close_notify "
        f"got {got!r} (expected their replies, as over plaintext or before 3d07f90)"
    )


def _client_hello(port: int, certs: Certs) -> bytes:
    client = BioClient(port, certs)
    with contextlib.suppress(ssl.SSLWantReadError):
        client.tls.do_handshake()
    hello = client.outgoing.read()
    client.close()
    return hello


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_a_client_reset_in_its_handshake_gives_its_max_clients_slot_back(
    engines: EngineFactories, certs: Certs, event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that send their ClientHello and reset the connection (a scanner, a client
    killed, a load balancer's probe), read by the server after the reset. On uvloop, the
    failed handshake's log line calls raw.get_extra_info("peername") on the closed
    transport, which raises AttributeError (uvloop has no socket object left to ask):
    _start_tls dies before _end(), and the Connection stays in `live` for good, holding a
    max_clients slot and server.connections.current. max_clients such clients lock
    everyone out (here max_clients is large, so that the check below is not raced by
    connections still in their handshake when the good client comes)."""
    import gateway.connection

    # Nothing is waiting for these connections any more: not even the handshake timeout.
    monkeypatch.setattr(gateway.connection, "HANDSHAKE_TIMEOUT", 1.0)
    resets = 10
    config = memory_config(
        engines, event_loop=event_loop, max_clients=100, **tls_settings(certs, "no")
    )
    with running(config) as server:
        hello = _client_hello(server.tls_port, certs)
        for _ in range(resets):
            sock = socket.create_connection(("127.0.0.1", server.tls_port), timeout=10)
            sock.sendall(hello)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # RST
        # Served once the listener has taken every connection queued before it.
        with tls_raw(server.tls_port, certs) as good:
            good.command("PING")
            good.expect(b"+PONG\r\n")
        try:
            wait_until(lambda: not server.server.live, 5, "every connection is released")
        except AssertionError:
            current = server.server.ctx.stats.get("server.connections.current")
            pytest.fail(
                f"event_loop={event_loop}: {len(server.server.live)} of {resets} "
                "connections reset during their TLS handshake are still held 5 s later "
                f"(handshake timeout 1 s; server.connections.current={current}), each "
                "holding a max_clients slot"
            )
