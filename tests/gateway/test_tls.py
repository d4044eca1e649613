"""TLS on the RESP port, over real sockets, on the in-memory engine (TLS is the gateway's
alone; one produce/consume per real engine is in e2e/test_tls.py): redis-py `ssl=True`
with its default RESP3 handshake, redis-cli --tls, client certificates (mTLS), the
plaintext port off unless asked, and clear start-up errors for bad files."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.config import Config, ConfigError, from_args, from_dict
from gateway.runner import ServerThread
from gateway.tls import server_context
from tests.support.certs import Certs, make_certs
from tests.support.fixtures import EngineFactories
from tests.support.gateway import Raw, running
from tests.support.rafka_process import RAFKA
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_settings(certs: Certs, auth_clients: str = "no") -> dict[str, Any]:
    return {
        "tls-port": 0,
        "tls-cert-file": str(certs.server_cert),
        "tls-key-file": str(certs.server_key),
        "tls-ca-cert-file": str(certs.ca),
        "tls-auth-clients": auth_clients,
    }


def memory_config(engines: EngineFactories, **gateway: Any) -> Config:
    """A gateway on the in-memory engine; unlike `gateway_config`, `port` is only set when
    given (a TLS port alone turns the plaintext listener off)."""
    section = {"engine": "memory", "host": "127.0.0.1", **gateway}
    return from_dict({**engines("memory").document(), "gateway": section})


@pytest.fixture(scope="module")
def tls_server(engines: EngineFactories, certs: Certs) -> Iterator[ServerThread]:
    """TLS only (no plaintext port), client certificates checked when given."""
    with running(memory_config(engines, **tls_settings(certs, "optional"))) as server:
        yield server


def tls_client(server: ServerThread, certs: Certs, **kwargs: Any) -> redis.Redis:
    """redis-py with `ssl=True` and its default handshake (HELLO 3)."""
    return redis.Redis(
        host="127.0.0.1",
        port=server.tls_port,
        ssl=True,
        ssl_ca_certs=str(certs.ca),
        socket_timeout=10,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


def tls_raw(port: int, certs: Certs, cert: Path | None = None, key: Path | None = None) -> Raw:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    raw = Raw(port)
    raw.sock = context.wrap_socket(raw.sock, server_hostname="127.0.0.1")
    return raw


def assert_refused(port: int, certs: Certs, cert: Path | None, key: Path | None) -> None:
    """The server refuses the client's certificate (or its lack of one). With TLS 1.3
    the client's handshake ends before the server checks it: the refusal comes as an
    alert or a closed connection on the first read, and never a reply."""
    try:
        with tls_raw(port, certs, cert, key) as refused:
            refused.command("PING")
            refused.sock.settimeout(10)
            data = refused.sock.recv(65536)
    except (ssl.SSLError, ConnectionError):
        return
    assert data == b"", f"a refused client got {data!r}"


def test_redis_py_ssl_with_resp3_handshake(
    tls_server: ServerThread, certs: Certs, engines: EngineFactories
) -> None:
    topic = engines("memory").new_topic(1)
    client = tls_client(tls_server, certs)
    with tls_raw(tls_server.tls_port, certs) as monitor:
        monitor.command("MONITOR")
        monitor.expect(b"+OK\r\n")
        assert client.ping() is True
        # redis-py's own handshake on connect, seen by a monitor (over TLS too).
        assert b'"HELLO" "3"' in monitor.read_line()
    try:
        # RESP3 replies over TLS: `HGETALL stats` is a map.
        stats = client.execute_command("HGETALL", "stats")
        assert isinstance(stats, dict) and b"server.connections.current" in stats
        assert client.execute_command("RPUSHX", f"topics:{topic}", "over tls") == 1
        assert client.execute_command("DUMP", "5000") == 0
        assert client.execute_command("CLIENT", "SETNAME", "tls-group:py") == b"OK"
        record = client.execute_command("BLPOP", f"topics:{topic}", "10")
        assert record[-1] == b"over tls"
    finally:
        client.close()


def test_plaintext_is_off_when_only_tls_port_is_set(tls_server: ServerThread, certs: Certs) -> None:
    assert tls_server.server.port is None
    with pytest.raises(RuntimeError, match="no plaintext listener"):
        _ = tls_server.port
    # A client speaking plaintext RESP to the TLS port gets no reply: the handshake fails
    # and the connection is closed.
    with Raw(tls_server.tls_port) as raw:
        raw.send(b"*1\r\n$4\r\nPING\r\n")
        raw.sock.settimeout(10)
        try:
            data = raw.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        assert b"PONG" not in data


def test_plaintext_port_given_explicitly_listens_too(
    engines: EngineFactories, certs: Certs
) -> None:
    config = memory_config(engines, port=0, **tls_settings(certs))
    with running(config) as server:
        assert server.port != server.tls_port
        with Raw(server.port) as plain:
            plain.send(b"PING\r\n")
            plain.expect(b"+PONG\r\n")
        with tls_raw(server.tls_port, certs) as secure:
            secure.command("PING")
            secure.expect(b"+PONG\r\n")


def test_client_certificates_required(engines: EngineFactories, certs: Certs) -> None:
    config = memory_config(engines, **tls_settings(certs, "yes"))
    with running(config) as server:
        with tls_raw(server.tls_port, certs, certs.client_cert, certs.client_key) as good:
            good.command("PING")
            good.expect(b"+PONG\r\n")
        assert_refused(server.tls_port, certs, None, None)
        assert_refused(server.tls_port, certs, certs.stranger_cert, certs.stranger_key)
        assert server.server.connections == 0
        without = tls_client(server, certs)
        with pytest.raises(redis.ConnectionError):
            without.ping()
        with_cert = tls_client(
            server, certs, ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key)
        )
        assert with_cert.ping() is True
        with_cert.close()


def test_client_certificates_optional(tls_server: ServerThread, certs: Certs) -> None:
    with tls_raw(tls_server.tls_port, certs) as anonymous:
        anonymous.command("PING")
        anonymous.expect(b"+PONG\r\n")
    assert_refused(tls_server.tls_port, certs, certs.stranger_cert, certs.stranger_key)


def _redis_cli(port: int, certs: Certs, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["redis-cli", "--tls", "--cacert", str(certs.ca), "-h", "127.0.0.1"]
    return subprocess.run(
        [*command, "-p", str(port), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli not installed")
def test_redis_cli_tls(engines: EngineFactories, certs: Certs) -> None:
    config = memory_config(engines, **tls_settings(certs, "yes"))
    with running(config) as server:
        mtls = ["--cert", str(certs.client_cert), "--key", str(certs.client_key)]
        done = _redis_cli(server.tls_port, certs, *mtls, "PING")
        assert (done.returncode, done.stdout) == (0, "PONG\n"), done.stderr
        done = _redis_cli(server.tls_port, certs, *mtls, "-3", "HELLO", "3")
        assert "rafka" in done.stdout, done.stderr
        # Without a client certificate the server refuses it.
        refused = _redis_cli(server.tls_port, certs, "PING")
        assert "PONG" not in refused.stdout
        assert refused.returncode != 0 or "error" in refused.stdout.lower() + refused.stderr


# --- bad files: a clear error at start-up -------------------------------------------------


def _start_error(engines: EngineFactories, **settings: Any) -> str:
    with pytest.raises(ConfigError) as caught, running(memory_config(engines, **settings)):
        pass
    return str(caught.value)


def test_bad_files_are_clear_start_up_errors(
    engines: EngineFactories, certs: Certs, tmp_path: Path
) -> None:
    base = tls_settings(certs, "yes")
    missing = str(tmp_path / "nope.pem")
    message = _start_error(engines, **{**base, "tls-cert-file": missing})
    assert message == f"tls-cert-file {missing}: no such file"
    message = _start_error(engines, **{**base, "tls-ca-cert-file": missing})
    assert message == f"tls-ca-cert-file {missing}: no such file"
    # The client's key with the server's certificate.
    message = _start_error(engines, **{**base, "tls-key-file": str(certs.client_key)})
    assert message == (
        f"tls-key-file {certs.client_key} does not match the certificate of "
        f"tls-cert-file {certs.server_cert}"
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    message = _start_error(engines, **{**base, "tls-cert-file": str(garbage)})
    assert message.startswith(f"tls-cert-file {garbage} / tls-key-file {certs.server_key}: ")
    assert "not a PEM certificate and its private key" in message
    message = _start_error(engines, **{**base, "tls-ca-cert-file": str(garbage)})
    assert message.startswith(f"tls-ca-cert-file {garbage}: no PEM CA certificate in it")
    message = _start_error(engines, **{**base, "tls-key-file": str(tmp_path)})
    assert message == f"tls-key-file {tmp_path}: not a file"


def test_encrypted_key_is_refused_without_prompting(certs: Certs, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass phrase"),
        )
    )
    settings = {**tls_settings(certs, "no"), "tls-key-file": str(encrypted)}
    config = Config(port=None, **_as_fields(settings))
    with pytest.raises(ConfigError) as caught:
        server_context(config)
    assert str(caught.value) == (
        f"tls-key-file {encrypted}: the key is encrypted (rafka reads unencrypted PEM keys only)"
    )


def _as_fields(settings: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("-", "_"): value for key, value in settings.items()}


def test_stalled_handshake_does_not_hold_up_others(tls_server: ServerThread, certs: Certs) -> None:
    """A TCP client that never starts its handshake holds no session and delays no one."""
    stalled = socket.create_connection(("127.0.0.1", tls_server.tls_port))
    with stalled, tls_raw(tls_server.tls_port, certs) as other:
        other.command("PING")
        other.expect(b"+PONG\r\n")
        assert tls_server.server.connections == 1


# --- settings: redis.conf names in the file, --tls-* flags ---------------------------------


def test_tls_settings_from_the_file_and_flags(certs: Certs, tmp_path: Path) -> None:
    files = {k: v for k, v in tls_settings(certs, "optional").items() if k != "tls-port"}
    path = tmp_path / "rafka.json"
    path.write_text(json.dumps({"gateway": {"tls-port": 6390, **files}}))
    config = from_args(["-c", str(path)])
    assert (config.port, config.tls_port, config.tls_auth_clients) == (None, 6390, "optional")
    assert config.tls_ca_cert_file == str(certs.ca)
    # The plaintext port is on when asked for: in the file, or with -p.
    assert from_args(["-c", str(path), "-p", "7001"]).port == 7001
    path.write_text(json.dumps({"gateway": {"port": 6380, "tls_port": 6390, **files}}))
    assert (from_args(["-c", str(path)]).port, from_args(["-c", str(path)]).tls_port) == (
        6380,
        6390,
    )
    # Flags alone, and flags over the file.
    flags = certs.server_flags(7002)
    config = from_args(["-c", str(path), *flags])
    assert (config.port, config.tls_port, config.tls_auth_clients) == (6380, 7002, "no")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    config = from_args(["-c", str(empty), *flags])
    assert (config.port, config.tls_port, config.tls_cert_file) == (
        None,
        7002,
        str(certs.server_cert),
    )


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({"tls-port": 1}, "gateway.tls-port is set but gateway.tls-cert-file is not"),
        (
            {"tls-port": 1, "tls-cert-file": "c"},
            "gateway.tls-port is set but gateway.tls-key-file is not",
        ),
        (
            {"tls-port": 1, "tls-cert-file": "c", "tls-key-file": "k"},
            "gateway.tls-auth-clients is 'yes' but gateway.tls-ca-cert-file is not set",
        ),
        ({"tls-auth-clients": "maybe"}, "gateway.tls-auth-clients must be one of yes, optional"),
        ({"tls-port": 70000}, "gateway.tls-port must be >= 0 and <= 65535"),
        ({"tls-port": 1, "tls_port": 2}, "gateway.tls-port is given twice"),
        ({"tls-prot": 1}, "unknown setting gateway.tls-prot (known: "),
    ],
)
def test_bad_tls_settings(gateway: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict({"gateway": gateway})
    assert str(caught.value).startswith(message)


def test_rafka_exits_1_naming_a_missing_certificate(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    done = subprocess.run(
        [
            str(RAFKA),
            "--tls-port",
            "0",
            "--tls-cert-file",
            str(missing),
            "--tls-key-file",
            str(certs.server_key),
            "--tls-auth-clients",
            "no",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert f"rafka: tls-cert-file {missing}: no such file" in done.stderr.splitlines()
    # Refused before the engine started: nothing was written.
    assert not (tmp_path / "data").exists()


def test_a_clean_tls_close_releases_the_connection_quietly(
    tls_server: ServerThread, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    """close_notify (EOF inside TLS) ends the session like a TCP EOF, without asyncio's
    "returning true from eof_received() has no effect when using ssl" warning."""
    caplog.set_level(logging.WARNING, logger="asyncio")
    raw = tls_raw(tls_server.tls_port, certs)
    raw.command("PING")
    raw.expect(b"+PONG\r\n")
    assert isinstance(raw.sock, ssl.SSLSocket)
    raw.sock.unwrap().close()
    wait_until(lambda: tls_server.server.connections == 0, 5, "the TLS connection is released")
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


def test_a_client_cannot_renegotiate(tls_server: ServerThread, certs: Certs) -> None:
    """Each renegotiation a TLS 1.2 client asks for is a handshake the server pays for:
    refused (openssl s_client's `R` asks for one between two PINGs)."""
    ping = b"PING\r\n"
    session = subprocess.Popen(
        [
            *("openssl", "s_client", "-tls1_2", "-connect", f"127.0.0.1:{tls_server.tls_port}"),
            *("-CAfile", str(certs.ca), "-servername", "127.0.0.1"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert session.stdin is not None and session.stdout is not None
    try:
        session.stdin.write(ping)
        session.stdin.flush()
        seen = b""
        while b"+PONG" not in seen:  # s_client prints the reply: the session is up
            line = session.stdout.readline()
            assert line, f"s_client ended before the first PONG: {seen.decode()!r}"
            seen += line
        session.stdin.write(b"R\n" + ping)
        out, _ = session.communicate(timeout=30)  # closes stdin: s_client ends
    finally:
        session.kill()
    assert b"RENEGOTIATING" in out, out.decode()
    assert b"no renegotiation" in out, f"the server renegotiated: {out.decode()!r}"
    assert b"+PONG" not in out, "the session went on after a refused renegotiation"
