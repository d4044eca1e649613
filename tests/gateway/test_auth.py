"""Authentication on the RESP port over real sockets: several users, the old single
password, HELLO AUTH, nothing served before AUTH, the pause after a failure (that
connection only), passwords never logged. Pure gateway behaviour: the in-memory engine."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.config import REDACTED, ConfigError, from_dict
from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import Raw, client, running
from tests.support.waiting import wait_until

WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
NOAUTH = b"-NOAUTH Authentication required.\r\n"
USERS = {"alice": "alice-pw", "bob": "bob pw with spaces"}
DELAY = 1.0


@pytest.fixture(scope="module")
def locked(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    """Without the pause after a failure, so that failures are quick to test."""
    config = gateway_config("memory", password="default-pw", users=USERS, auth_failure_delay=0)
    with running(config) as server:
        yield server


@pytest.fixture(scope="module")
def pausing(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    config = gateway_config("memory", users=USERS, auth_failure_delay=DELAY)
    with running(config) as server:
        yield server


def authenticated(server: ServerThread) -> Raw:
    raw = Raw(server.port)
    raw.command("AUTH", "alice", "alice-pw")
    raw.expect(b"+OK\r\n")
    return raw


def test_users_and_the_default_password(locked: ServerThread) -> None:
    for credentials in (("alice", "alice-pw"), ("bob", USERS["bob"]), ("default-pw",)):
        with Raw(locked.port) as raw:
            raw.command("AUTH", *credentials)
            raw.expect(b"+OK\r\n")
            raw.command("PING")
            raw.expect(b"+PONG\r\n")
    with Raw(locked.port) as raw:
        raw.command("AUTH", "default", "default-pw")
        raw.expect(b"+OK\r\n")


@pytest.mark.parametrize(
    "credentials",
    [
        ("alice", "bob pw with spaces"),  # another user's password
        ("alice", "alice-pw "),
        ("carol", "alice-pw"),  # unknown user
        ("alice-pw",),  # a user's password as the default user's
        ("default", "alice-pw"),
    ],
)
def test_wrong_credentials(locked: ServerThread, credentials: tuple[str, ...]) -> None:
    with Raw(locked.port) as raw:
        raw.command("AUTH", *credentials)
        raw.expect(WRONGPASS)
        raw.command("PING")
        raw.expect(NOAUTH)


def test_hello_auth_with_a_user(locked: ServerThread) -> None:
    with Raw(locked.port) as raw:
        raw.command("HELLO", "3", "AUTH", "bob", "wrong")
        raw.expect(WRONGPASS)
        raw.command("HELLO", "3", "AUTH", "bob", USERS["bob"], "SETNAME", "g:bob")
        hello = raw.read_reply()
        assert hello[b"proto"] == 3 and hello[b"server"] == b"rafka"
        raw.command("CLIENT", "GETNAME")
        assert raw.read_reply() == b"g:bob"


def test_redis_py_username_and_password(locked: ServerThread) -> None:
    for protocol in (2, 3):  # AUTH alice pw (RESP2), HELLO 3 AUTH alice pw (RESP3)
        good = client(locked, protocol=protocol, username="alice", password="alice-pw")
        assert good.ping() is True
        good.close()
        bad = client(
            locked, protocol=protocol, username="carol", password="x", retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            bad.ping()
        bad.close()


def test_nothing_but_auth_hello_quit_before_auth(locked: ServerThread) -> None:
    with Raw(locked.port) as raw:
        for command in (
            ("PING",),
            ("RPUSHX", "topics:t", "v"),
            ("BLPOP", "topics:t", "1"),
            ("RPUSH", "acks", "t:0:0"),
            ("CLIENT", "SETNAME", "g:x"),
            ("CLIENT", "ID"),
            ("HGETALL", "stats"),
            ("MONITOR",),
            ("DUMP", "10"),
            ("KEYS", "topics:"),
            ("COMMAND",),
            ("SELECT", "0"),
            ("NOSUCHCOMMAND",),
        ):
            raw.command(*command)
            raw.expect(NOAUTH)
        raw.command("HELLO", "3")
        assert raw.read_line().startswith(b"-NOAUTH HELLO must be called with the client")
        raw.command("QUIT")
        raw.expect(b"$2\r\nOK\r\n")
        raw.assert_closed()


def test_a_failed_auth_pauses_that_connection_only(pausing: ServerThread) -> None:
    with authenticated(pausing) as other, Raw(pausing.port) as failing:
        started = time.monotonic()
        failing.command("AUTH", "alice", "wrong")
        failing.command("PING")  # pipelined behind: waits its turn
        # Meanwhile another connection is served at once, and the failing one has had
        # no answer yet.
        for _ in range(5):
            other.command("PING")
            other.expect(b"+PONG\r\n")
        other_took = time.monotonic() - started
        failing.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            failing.sock.recv(1)
        failing.sock.setblocking(True)
        assert other_took < DELAY / 2, f"another client waited {other_took:.3f}s"
        failing.expect(WRONGPASS)
        failed_after = time.monotonic() - started
        failing.expect(NOAUTH)
        assert failed_after >= DELAY * 0.95, f"WRONGPASS came after {failed_after:.3f}s"
        # A later success is not delayed.
        started = time.monotonic()
        failing.command("AUTH", "alice", "alice-pw")
        failing.expect(b"+OK\r\n")
        assert time.monotonic() - started < DELAY / 2


def test_a_client_leaving_during_the_pause_is_released(pausing: ServerThread) -> None:
    failing = Raw(pausing.port)
    failing.command("AUTH", "alice", "wrong")
    wait_until(lambda: pausing.server.waiting_commands == 1, 5, "the failed AUTH pauses")
    failing.close()
    # Released at once (the pause is cancelled), not when the pause ends.
    wait_until(
        lambda: pausing.server.connections == 0, DELAY / 2, "the left connection is released"
    )


def test_passwords_are_never_logged(
    gateway_config: GatewayConfig, caplog: pytest.LogCaptureFixture
) -> None:
    config = gateway_config("memory", users=USERS, auth_failure_delay=0)
    assert config.redacted()["users"] == {"alice": REDACTED, "bob": REDACTED}
    caplog.set_level(logging.DEBUG)
    with running(config) as server, Raw(server.port) as raw:
        for credentials in (("alice", "s3cret-guess"), ("mistyped-pw", "s3cret-guess")):
            raw.command("AUTH", *credentials)
            raw.expect(WRONGPASS)
        raw.command("AUTH", "alice", "alice-pw")
        raw.expect(b"+OK\r\n")
    failures = [r for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failures) == 2, caplog.text
    # The known user is named; an unknown name (maybe a mistyped password) is not.
    assert "user=alice" in failures[0].getMessage()
    assert "user=(unknown)" in failures[1].getMessage()
    for secret in ("s3cret-guess", "mistyped-pw", "alice-pw", USERS["bob"]):
        assert secret not in caplog.text


def test_only_users_configured_disables_the_default_user(gateway_config: GatewayConfig) -> None:
    config = gateway_config("memory", users={"alice": "alice-pw"}, auth_failure_delay=0)
    with running(config) as server, Raw(server.port) as raw:
        raw.command("PING")
        raw.expect(NOAUTH)
        raw.command("AUTH", "anything")
        raw.expect(WRONGPASS)
        raw.command("AUTH", "default", "")
        raw.expect(WRONGPASS)


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({"users": ["alice"]}, "gateway.users must be an object of user name -> password"),
        ({"users": {"alice": 12}}, "gateway.users.alice must be a string (the password)"),
        ({"users": {"a b": "x"}}, "gateway.users: bad user name 'a b'"),
        (
            {"password": "x", "users": {"default": "y"}},
            "gateway.password and gateway.users.default both set a password",
        ),
        ({"auth_failure_delay": -1}, "gateway.auth_failure_delay must be a finite number >= 0"),
    ],
)
def test_bad_user_settings(gateway: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_dict({"gateway": gateway})
    assert str(caught.value).startswith(message)
