"""The `rafka` command with TLS only (client certificates required) and users, on each
engine (embedded Dafka; Kafka on a real Tansu broker): records produced and consumed by
redis-cli --tls, redis-py `ssl=True` and Ruby's redis-rb `ssl: true`, every one
authenticated as a user of the configuration file."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from backends.ports import free_port
from backends.process import Child, start
from e2e.helpers import Deployment
from tests.support.certs import Certs, make_certs
from tests.support.rafka_process import RAFKA, REPO

RUBY_CLIENT = REPO / "clients" / "ruby-example" / "rafka_example.rb"
USERS = {"producer": "p-secret", "consumer": "c-secret"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_redis(port: int, certs: Certs, user: str, password: str, **kwargs: Any) -> redis.Redis:
    """redis-py over TLS with the client certificate, authenticated as `user` (its default
    handshake: HELLO 3 AUTH user password), without retries."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        ssl=True,
        ssl_ca_certs=str(certs.ca),
        ssl_certfile=str(certs.client_cert),
        ssl_keyfile=str(certs.client_key),
        username=user,
        password=password,
        retry=Retry(NoBackoff(), 0),
        **kwargs,
    )


class TlsRafka:
    def __init__(self, child: Child, port: int, certs: Certs) -> None:
        self.child = child
        self.port = port
        self.certs = certs

    def redis_py(self, user: str, **kwargs: Any) -> redis.Redis:
        return tls_redis(self.port, self.certs, user, USERS[user], socket_timeout=30, **kwargs)


def answers_over_tls(port: int, certs: Certs) -> bool:
    try:
        with tls_redis(port, certs, "producer", USERS["producer"], socket_timeout=1) as client:
            return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError):
        return False


@pytest.fixture(scope="module")
def rafka(
    deployment: Deployment, certs: Certs, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsRafka]:
    path = deployment.write_config(tmp_path_factory.mktemp("rafka") / "rafka.json")
    document = json.loads(path.read_text())
    document.setdefault("gateway", {}).update(
        {
            "users": USERS,
            "tls-cert-file": str(certs.server_cert),
            "tls-key-file": str(certs.server_key),
            "tls-ca-cert-file": str(certs.ca),
            "tls-auth-clients": "yes",
        }
    )
    path.write_text(json.dumps(document))
    port = free_port()
    argv = [str(RAFKA), "-c", str(path), "--host", "127.0.0.1", "--tls-port", str(port)]
    child = start(
        argv,
        name="rafka",
        ready=lambda: answers_over_tls(port, certs),
        timeout=30,
        cwd=REPO,
        env={"PYTHONUNBUFFERED": "1"},
        keep_lines=None,
    )
    try:
        yield TlsRafka(child, port, certs)
        code = child.stop(30)
        stderr = "\n".join(child.stderr_lines)
        assert code == 0, f"rafka exited with {code} after SIGTERM: {stderr}"
        assert "Traceback" not in stderr, stderr
        # No password in anything the gateway wrote.
        output = stderr + "\n".join(child.stdout_lines)
        assert all(secret not in output for secret in USERS.values())
    finally:
        child.kill()


def test_tls_only_listens_on_the_tls_port(rafka: TlsRafka) -> None:
    banner = next(line for line in rafka.child.stdout_lines if "listening on" in line)
    assert f"listening on 127.0.0.1:{rafka.port} (TLS)," in banner, banner


def redis_cli(rafka: TlsRafka, *args: str) -> str:
    certs = rafka.certs
    command = [
        "redis-cli",
        "--tls",
        "--cacert",
        str(certs.ca),
        "--cert",
        str(certs.client_cert),
        "--key",
        str(certs.client_key),
        "-h",
        "127.0.0.1",
        "-p",
        str(rafka.port),
        "--user",
        "producer",
        "--pass",
        USERS["producer"],
        "--no-auth-warning",
    ]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"redis-cli {args} failed: {done.stderr}"
    return done.stdout


def test_produce_and_consume_over_tls_with_three_clients(
    rafka: TlsRafka, deployment: Deployment
) -> None:
    topic = deployment.new_topic(1)
    # redis-cli produces and flushes.
    assert redis_cli(rafka, "RPUSHX", f"topics:{topic}", "cli-0", "cli-1") == "2\n"
    assert redis_cli(rafka, "DUMP", "10000") == "0\n"
    # redis-py (default RESP3 handshake: HELLO 3 AUTH producer ...) produces and flushes.
    producer = rafka.redis_py("producer")
    try:
        assert producer.execute_command("RPUSHX", f"topics:{topic}", "py-0") == 1
        assert producer.execute_command("DUMP", "10000") == 0
    finally:
        producer.close()
    # redis-rb consumes the three, acking each, as the consumer user.
    env = {
        **os.environ,
        "RAFKA_TLS_CA_FILE": str(rafka.certs.ca),
        "RAFKA_TLS_CERT_FILE": str(rafka.certs.client_cert),
        "RAFKA_TLS_KEY_FILE": str(rafka.certs.client_key),
        "RAFKA_USERNAME": "consumer",
        "RAFKA_PASSWORD": USERS["consumer"],
    }
    done = subprocess.run(
        ["ruby", str(RUBY_CLIENT), "consume", str(rafka.port), topic, "tls-rb", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, f"ruby consume failed: {done.stderr}"
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["value"] for r in records] == ["cli-0", "cli-1", "py-0"]
    # redis-py consumes too, in another group, over TLS.
    consumer = rafka.redis_py("consumer", client_name="tls-py:reader")
    try:
        got = [consumer.blpop([f"topics:{topic}"], 10) for _ in range(3)]
        assert [reply[-1] if reply else None for reply in got] == [b"cli-0", b"cli-1", b"py-0"]
    finally:
        consumer.close()


def test_a_wrong_password_is_refused_over_tls(rafka: TlsRafka) -> None:
    client = tls_redis(rafka.port, rafka.certs, "consumer", USERS["producer"], socket_timeout=30)
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()
