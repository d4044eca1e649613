"""HTTP push subscriptions: the configuration's checks, and run-time management with
the `rafka-subscriptions` command on a running gateway (docs/push.md).

Managing subscriptions is the gateway's, not the engine's (the list lives in the data
directory): it runs on the Dafka engine only; delivery itself is tested on both engines
in test_push.py.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.ports import free_port
from gateway.config import ConfigError, from_dict
from gateway.monitor import REDACTED_ARG, redact
from gateway.push.spec import parse_subscriptions
from gateway.runner import ServerThread
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import client, running
from tests.support.http_sink import HttpSink
from tests.support.rafka_process import RAFKA
from tests.support.waiting import wait_until

TOOL = Path(sys.executable).parent / "rafka-subscriptions"

GOOD = {"name": "hook", "topic": "t", "group": "g", "urls": ["http://127.0.0.1:9/x"]}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"urls": []}, "subscriptions[0].urls must be a non-empty list of URLs, got []"),
        (
            {"urls": ["ftp://x/"]},
            "subscriptions[0].urls[0] must be an http:// or https:// URL, got 'ftp://x/'",
        ),
        ({"concurrency": 0}, "subscriptions[0].concurrency must be >= 1 and <= 10000, got 0"),
        ({"timeout": 0}, "subscriptions[0].timeout must be > 0 and <= 3600, got 0"),
        ({"retry": {"attempts": "3"}}, "subscriptions[0].retry.attempts must be an integer"),
        ({"retry": {"jitter": 2}}, "subscriptions[0].retry.jitter must be >= 0 and <= 1, got 2"),
        (
            {"retry": {"backoff_base": 5, "backoff_max": 1}},
            "subscriptions[0].retry.backoff_max (1) must be >= subscriptions[0].retry.backoff_base",
        ),
        ({"retry": {"tries": 3}}, "unknown setting subscriptions[0].retry.tries"),
        ({"headers": {"Content-Type": "x"}}, "subscriptions[0].headers.Content-Type is set by"),
        ({"headers": {"X-A": "a\r\nB: c"}}, "subscriptions[0].headers.X-A must be a one-line"),
        ({"name": "no spaces"}, "subscriptions[0].name must be 1-100 letters"),
        ({"dead_letter_topic": "t"}, "subscriptions[0].dead_letter_topic must differ"),
        ({"url": "http://x/"}, "unknown setting subscriptions[0].url (known: name, topic"),
    ],
)
def test_a_malformed_subscription_is_refused_naming_the_key(
    change: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        from_dict({"subscriptions": [{**GOOD, **change}]})
    assert str(raised.value).startswith(error), str(raised.value)


def test_the_subscriptions_section_shape_and_names_are_checked() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"subscriptions": {}}, "section 'subscriptions' must be a JSON array, got {}"),
        ({"subscriptions": [{"name": "x"}]}, "subscriptions[0].topic is required"),
        (
            {"subscriptions": [GOOD, GOOD]},
            "subscriptions[1].name: a subscription named 'hook' exists already",
        ),
    ]
    for document, error in cases:
        with pytest.raises(ConfigError) as raised:
            from_dict(document)
        assert str(raised.value) == error


def test_defaults_and_secrets_kept_out_of_the_log() -> None:
    config = from_dict({"subscriptions": [{**GOOD, "headers": {"Authorization": "Bearer k"}}]})
    [hook] = config.subscriptions
    assert (hook.concurrency, hook.timeout, hook.retry.attempts) == (1, 10.0, 5)
    assert hook.dead_letter_topic == "t.dead-letter"
    assert "Bearer k" not in json.dumps(config.redacted())


def test_monitor_does_not_show_a_subscription_being_added() -> None:
    added = [b"rafka.push", b"add", b'{"headers": {"Authorization": "Bearer k"}}']
    assert redact(added) == [b"rafka.push", b"add", REDACTED_ARG]
    assert redact([b"RAFKA.PUSH", b"REMOVE", b"x"]) == [b"RAFKA.PUSH", b"REMOVE", b"x"]


def test_rafka_exits_with_the_error_for_a_malformed_subscription(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"subscriptions": [{**GOOD, "concurrency": -1}]}))
    done = subprocess.run(
        [str(RAFKA), "-c", str(path), "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "rafka: subscriptions[0].concurrency must be >= 1 and <= 10000, got -1" in done.stderr, (
        done.stderr
    )


def tool(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOL), "-p", str(port), *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def test_add_list_remove_on_a_running_gateway_and_after_a_restart(
    gateway_config: GatewayConfig, engines: EngineFactories, sink: HttpSink, tmp_path: Path
) -> None:
    topic = engines("dafka").new_topic(1)
    fixed = {**GOOD, "name": "fixed", "topic": topic, "urls": [sink.url("/fixed")]}
    config = dataclasses.replace(
        gateway_config("dafka", data_dir=str(tmp_path)),
        subscriptions=parse_subscriptions([fixed]),
    )
    with ServerThread(config) as server:
        port = server.port
        added = tool(
            port, "add", "cli-hook", "--topic", topic, "--group", "gcli",
            "--url", sink.url("/cli"), "--header", "X-Key: abc", "--attempts", "2",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        assert added.stdout == "added subscription cli-hook\n"

        listed = tool(port, "list")
        assert listed.returncode == 0, listed.stderr
        rows = [line.split() for line in listed.stdout.splitlines()]
        assert rows[0][:2] == ["NAME", "SOURCE"]
        assert [row[:3] for row in rows[1:]] == [
            ["fixed", "config", topic],
            ["cli-hook", "runtime", topic],
        ]

        with client(server) as c:
            c.execute_command("RPUSHX", f"topics:{topic}", b"one", b"two")
        wait_until(lambda: len(sink.delivered("/cli")) == 2, 30, "records pushed to the new hook")
        assert [b["value"] for b in sink.delivered("/cli")] == ["one", "two"]
        assert sink.received("/cli")[0].headers["X-Key"] == "abc"

        for args, error in [
            (("remove", "fixed"), "comes from the configuration file; remove it there"),
            (("remove", "ghost"), "no subscription named 'ghost'"),
            (
                ("add", "cli-hook", "--topic", topic, "--group", "g", "--url", sink.url("/x")),
                "a subscription named 'cli-hook' exists already",
            ),
            (
                ("add", "other", "--topic", topic, "--group", "g", "--url", "nope"),
                "push: subscription.urls[0] must be an http:// or https:// URL, got 'nope'",
            ),
        ]:
            refused = tool(port, *args)
            assert refused.returncode == 1, refused
            assert error in refused.stderr, refused.stderr

    state = json.loads((tmp_path / "push-subscriptions.json").read_text())
    assert [s["name"] for s in state] == ["cli-hook"]

    with ServerThread(config) as server:
        listed = tool(server.port, "list", "--json")
        kept = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(s["name"], s["source"]) for s in kept] == [
            ("fixed", "config"),
            ("cli-hook", "runtime"),
        ]
        assert kept[1]["headers"] == {"X-Key": "abc"} and kept[1]["retry"]["attempts"] == 2
        with client(server) as c:
            c.execute_command("RPUSHX", f"topics:{topic}", b"three")
            wait_until(lambda: len(sink.delivered("/cli")) == 3, 30, "pushed after the restart")
            assert tool(server.port, "remove", "cli-hook").returncode == 0
            assert not [k for k in c.hgetall("stats") if k.startswith(b"push.cli-hook.")]
            c.execute_command("RPUSHX", f"topics:{topic}", b"four")
            wait_until(lambda: len(sink.delivered("/fixed")) == 4, 30, "the fixed hook goes on")
        assert len(sink.delivered("/cli")) == 3, "a removed subscription still delivered"
        assert [
            json.loads(line)["name"]
            for line in tool(server.port, "list", "--json").stdout.splitlines()
        ] == ["fixed"]
    assert json.loads((tmp_path / "push-subscriptions.json").read_text()) == []


def test_a_gateway_that_cannot_be_reached_is_a_clear_error() -> None:
    port = free_port()
    done = tool(port, "list")
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"rafka-subscriptions: cannot reach the gateway at 127.0.0.1:{port}"
    )


def test_a_wrong_password_and_a_silent_gateway_are_clear_errors(
    gateway_config: GatewayConfig,
) -> None:
    """A wrong password was reported as 'cannot reach the gateway'; a gateway that never
    answers ended in a traceback (redis-py's TimeoutError is no ConnectionError)."""
    with running(gateway_config("memory", password="right")) as server:
        done = tool(server.port, "-a", "wrong", "list")
        assert done.returncode == 1
        assert done.stderr.startswith(
            f"rafka-subscriptions: the gateway at 127.0.0.1:{server.port} refused: "
        ), done.stderr
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        done = tool(port, "--reply-timeout", "0.5", "list")
    assert done.returncode == 1
    assert done.stderr == (
        f"rafka-subscriptions: no answer from the gateway at 127.0.0.1:{port} in 0.5 s\n"
    ), done.stderr


def test_an_unreadable_subscriptions_file_stops_the_start(
    gateway_config: GatewayConfig, tmp_path: Path
) -> None:
    (tmp_path / "push-subscriptions.json").write_text('[{"name": "x"}]')
    with pytest.raises(ConfigError) as raised:
        ServerThread(gateway_config("dafka", data_dir=str(tmp_path))).start()
    assert str(raised.value) == (
        f"{tmp_path}/push-subscriptions.json: subscription 0.topic is required"
    )


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_reply_timeout_is_a_usage_error(value: str) -> None:
    """argparse took any float for --reply-timeout (and --connect-timeout), and
    socket.settimeout then raised ValueError / OverflowError: a traceback, not a usage
    error naming the option (found in review)."""
    done = tool(free_port(), f"--reply-timeout={value}", "list")
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    assert done.returncode == 2 and "--reply-timeout" in done.stderr, done.stderr
