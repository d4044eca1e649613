"""TLS and authentication against hostile clients: a client without credentials cannot
make the gateway hold a large request; connections in their TLS handshake count against
max_clients, cannot starve the plaintext port and are closed by a shutdown. Over real
sockets, on the in-memory engine (as tests/gateway/test_tls.py and test_auth.py)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.ports import answers_ping, free_port
from gateway.runner import ServerThread
from tests.gateway.test_tls import memory_config, tls_raw, tls_settings
from tests.support.certs import Certs, make_certs
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import running
from tests.support.rafka_process import RafkaProcess

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _refused_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server answered before closing (b"" for a bare close or reset), or None
    when the connection is still open and silent after `seconds`."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except ConnectionResetError:
        return got
    except TimeoutError:
        return None


# --- 1. an unauthenticated client makes the server buffer a huge request -----------------


@pytest.fixture(scope="module")
def locked(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    config = gateway_config("memory", password="pw", auth_failure_delay=0)
    with running(config) as server:
        yield server


@pytest.mark.parametrize(
    ("header", "body"),
    [
        # One 30 MB argument (Redis: `-ERR Protocol error: unauthenticated bulk length`).
        (b"*3\r\n$6\r\nRPUSHX\r\n$8\r\ntopics:t\r\n$30000000\r\n", b"x" * 64 * 1024),
        # A million one-byte arguments (Redis: `... unauthenticated multibulk length`).
        (b"*1000000\r\n", b"$1\r\na\r\n" * 9000),
    ],
    ids=["bulk", "multibulk"],
)
def test_an_unauthenticated_client_cannot_make_the_server_hold_a_huge_request(
    locked: ServerThread, header: bytes, body: bytes
) -> None:
    """Redis (6.2.6+, CVE-2021-32675) refuses, before AUTH, a bulk over 16 KiB and more
    than 10 arguments, so that a client without the password cannot make it allocate.
    The gateway buffers what any authenticated client may send (up to max_query_buffer,
    64 MiB, per connection): without credentials, max_clients connections hold 64 MiB
    each."""
    sock = socket.create_connection(("127.0.0.1", locked.port), timeout=10)
    with sock:
        sent = 0
        try:
            sock.sendall(header)
            while sent < 4 * MiB:
                sock.sendall(body)
                sent += len(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were sending: what we want
        answer = _refused_within(sock, 5)
        held = max((c.unparsed for c in list(locked.server.live)), default=0)
        assert answer is not None, (
            f"an unauthenticated client sent {sent + len(header)} bytes of one unfinished "
            f"command and the server still holds {held} bytes of it, with no reply and the "
            "connection open (Redis refuses at once: unauthenticated bulk/multibulk length)"
        )


# --- 2. TLS handshakes in progress are not counted against max_clients ---------------------


def test_connections_in_their_tls_handshake_count_toward_max_clients(
    engines: EngineFactories, certs: Certs
) -> None:
    """max_clients bounds the connections the gateway holds (docs/gateway.md: one
    connection too many is refused and closed; the open-files limit is sized for
    max_clients + 128). Redis counts a TLS client from its accept, before the handshake.
    The gateway counts it only once its handshake is done: every TCP connection to the
    TLS port that never sends its ClientHello is held for the 10 s handshake timeout,
    however many there are."""
    config = memory_config(engines, max_clients=2, **tls_settings(certs, "no"))
    with running(config) as server:
        stalled = [socket.create_connection(("127.0.0.1", server.tls_port)) for _ in range(20)]
        try:
            deadline = time.monotonic() + 3
            held = 0
            for sock in stalled:
                if _refused_within(sock, max(0.05, deadline - time.monotonic())) is None:
                    held += 1
            assert held <= 2, (
                f"with max_clients=2, {held} of 20 connections that never start their TLS "
                "handshake are still held open 3 s later (a plaintext connection past "
                "max_clients is refused at once)"
            )
        finally:
            for sock in stalled:
                sock.close()


# --- 3. a stopped gateway (asyncio loop) leaves handshaking sockets open ------------------


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_stopping_the_gateway_closes_connections_still_in_their_tls_handshake(
    engines: EngineFactories, certs: Certs, event_loop: str
) -> None:
    config = memory_config(engines, event_loop=event_loop, **tls_settings(certs, "no"))
    server = ServerThread(config).start()
    try:
        stalled = socket.create_connection(("127.0.0.1", server.tls_port), timeout=10)
        # The gateway is serving (and has accepted the stalled connection before this one).
        with tls_raw(server.tls_port, certs) as other:
            other.command("PING")
            other.expect(b"+PONG\r\n")
    finally:
        server.stop()
    with stalled:
        answer = _refused_within(stalled, 5)
    assert answer is not None, (
        f"event_loop={event_loop}: the gateway has stopped, but a connection accepted on "
        "its TLS port and still in its handshake is left open (5 s after stop())"
    )


# --- 4. end to end: the TLS port flooded with silent connections (rafka process) ----------


def test_silent_tls_connections_do_not_deny_service(certs: Certs, tmp_path: Path) -> None:
    """docs/gateway.md: a client that has not finished its handshake "holds no session
    and delays no one". `rafka` sizes its open-files limit for max_clients + 128; 200
    TCP connections to the TLS port that send nothing exhaust it, and every client is
    then refused (reset) although the gateway has no session at all."""
    max_clients = 10
    limit = max_clients + 128  # gateway.limits.RESERVED_FILES
    path = tmp_path / "rafka.json"
    path.write_text(json.dumps({"gateway": {"max_clients": max_clients}}))
    tls_port = free_port()
    rafka = RafkaProcess(
        path,
        None,
        "--data-dir",
        str(tmp_path / "data"),
        *certs.server_flags(tls_port),
        wrapper=["prlimit", f"--nofile={limit}:{limit}"],
    )
    rafka.start()
    try:
        assert answers_ping(rafka.port)
        stalled = [socket.create_connection(("127.0.0.1", tls_port)) for _ in range(200)]
        try:
            with socket.create_connection(("127.0.0.1", rafka.port), timeout=5) as plain:
                try:
                    plain.sendall(b"PING\r\n")
                    reply = plain.recv(100)
                except (ConnectionResetError, BrokenPipeError) as error:
                    reply = repr(error).encode()
            # Served, or refused with max_clients' error: either is an answer.
            assert reply in (b"+PONG\r\n", b"-ERR max number of clients reached\r\n"), (
                f"with 200 silent connections on the TLS port (no session open), a "
                f"plaintext PING got {reply!r}"
            )
        finally:
            for sock in stalled:
                sock.close()
    finally:
        rafka.kill()
