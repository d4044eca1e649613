"""Bad input to `rafka-topics` (gateway/topics_cli.py) as a real process (`python -m
gateway.topics_cli` from this tree) against each real engine: the session's Dafka
network (a tower and a store, processes) and the session's Tansu broker, pointed at with
`-c` and the engine's configuration document, as a user points it at rafka's file."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import running

ROOT = Path(__file__).resolve().parents[2]


def topics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.topics_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def config_file(engines: EngineFactories, engine: str, tmp_path: Path) -> str:
    document = {**engines(engine).document(), "gateway": {"engine": engine}}
    path = tmp_path / "rafka.json"
    path.write_text(json.dumps(document))
    return str(path)


def assert_clear_failure(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 1, f"{what}: exit status {done.returncode}, stdout {done.stdout!r}"
    assert "Traceback" not in done.stderr, f"{what}: a traceback, not an error:\n{done.stderr}"
    assert done.stderr.startswith("rafka-topics: "), f"{what}: stderr {done.stderr!r}"
    assert done.stdout == "", f"{what}: printed {done.stdout!r}"


def test_an_empty_topic_name_is_refused_not_read_as_every_topic(
    engine_name: str, engines: EngineFactories, tmp_path: Path
) -> None:
    """`--describe --topic ""` names a topic that cannot exist: an error (as `--create`
    and `--delete` give for it), not the description of every topic of the cluster."""
    config = config_file(engines, engine_name, tmp_path)
    engines(engine_name).new_topic(1)
    done = topics("-c", config, "--describe", "--topic", "")
    assert_clear_failure(done, '--describe --topic ""')


@pytest.mark.parametrize("timeout", ["inf", "2592000"])
def test_bad_timeout_is_a_usage_error(
    engine_name: str, engines: EngineFactories, tmp_path: Path, timeout: str
) -> None:
    """`--timeout inf` passed the `> 0` check and the Dafka engine died on it; 30 days
    overflowed librdkafka's milliseconds, and a reachable broker was "unreachable"."""
    config = config_file(engines, engine_name, tmp_path)
    done = topics("-c", config, "--list", "--timeout", timeout)
    assert_clear_failure(done, f"--timeout {timeout}")
    assert "--timeout" in done.stderr, done.stderr


def test_more_partitions_than_a_broker_counts_is_a_clear_error(
    engine_name: str, engines: EngineFactories, tmp_path: Path
) -> None:
    """Kafka counts partitions in a 32-bit int: 3,000,000,000 was an OverflowError."""
    config = config_file(engines, engine_name, tmp_path)
    done = topics("-c", config, "--create", "--topic", "many", "--partitions", "3000000000")
    assert_clear_failure(done, "--partitions 3000000000")
    assert "partitions" in done.stderr, done.stderr


def test_a_malformed_tower_address_is_a_clear_error(tmp_path: Path) -> None:
    """A typo in --tower-sub/--tower-pub: `rafka-topics: <message>`, not a traceback."""
    done = topics(
        "--list",
        "--tower-sub",
        "tcp//127.0.0.1:5556",
        "--tower-pub",
        "tcp//127.0.0.1:5557",
        "--timeout",
        "2",
    )
    assert_clear_failure(done, "--tower-sub tcp//127.0.0.1:5556")
    assert "tcp//127.0.0.1:555" in done.stderr, done.stderr


@pytest.mark.parametrize("name", ["orders:eu", "orders,eu", "orders\neu"])
def test_create_refuses_names_the_gateway_cannot_address(
    engine_name: str, engines: EngineFactories, tmp_path: Path, name: str
) -> None:
    """A topic named with `:` or `,` can never be produced or consumed through a gateway
    (`topics:<topic>[:<key>]`, `BLPOP topics:<t1,t2>`); a newline splits it into two
    names in `--list`'s one-name-a-line output. Kafka refuses such names; so must Dafka,
    rather than answer `Created topic ...` and create nothing usable."""
    config = config_file(engines, engine_name, tmp_path)
    done = topics("-c", config, "--create", "--topic", name, "--partitions", "1")
    assert_clear_failure(done, f"--create --topic {name!r}")
    listed = topics("-c", config, "--list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert name not in lines and "eu" not in lines, f"{name!r} was created: --list {lines}"


@pytest.mark.parametrize(
    "prefix",
    [
        "team-\U0001f469\u200d\U0001f4bb",  # 👩‍💻: an emoji ZWJ sequence (U+200D is a format char)
        "mood-\U0001fae8",  # 🫨 SHAKING FACE, Unicode 15 (unassigned in Python 3.11's tables)
        "soft\u00adhyphen",  # U+00AD SOFT HYPHEN, a format character
    ],
)
def test_create_takes_names_a_gateway_addresses(
    engines: EngineFactories, gateway_config: GatewayConfig, tmp_path: Path, prefix: str
) -> None:
    """The name holds no ':', ',', whitespace or control character (docs/rafka-topics.md's
    rule), and a Dafka gateway produces to it and reads it: `--create` must create it.
    check_new_name refuses every character str.isprintable() rejects: format characters
    (U+200D in every emoji ZWJ sequence, U+00AD) and code points newer than the
    interpreter's Unicode tables."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    config = config_file(engines, "dafka", tmp_path)
    done = topics("-c", config, "--create", "--topic", name, "--partitions", "2")
    assert done.returncode == 0, (
        f"--create --topic {name!r} refused a name the gateway addresses: "
        f"exit {done.returncode}, stderr {done.stderr.strip()!r}"
    )
    with running(gateway_config("dafka")) as gateway:
        client = redis.Redis(port=gateway.port, socket_timeout=30)
        assert client.execute_command("RPUSHX", f"topics:{name}:k", "v") == 1
        assert client.execute_command("DUMP", 10_000) == 0
        # Both created partitions are addressable through the gateway.
        heads = [client.llen(f"topics:{name}:{p}") for p in (0, 1)]
        assert sum(heads) == 1, heads
        client.close()
