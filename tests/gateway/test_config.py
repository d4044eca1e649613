"""Configuration file and command line: merging, typing, errors, redaction, exit codes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import redis

from backends.dafka.settings import DafkaSettings
from backends.kafka.settings import KafkaSettings
from backends.ports import answers_ping, free_port
from backends.process import spawn
from backends.registry import ENGINES
from gateway import __version__
from gateway.config import REDACTED, Config, ConfigError, from_args, from_dict
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

# The console script installed with the package (pyproject [project.scripts]).
RAFKA = [str(Path(sys.executable).parent / "rafka")]


def kafka_settings(config: Config) -> KafkaSettings:
    assert isinstance(config.engine_settings, KafkaSettings), config.engine_settings
    return config.engine_settings


def write(tmp_path: Path, document: object) -> str:
    path = tmp_path / "librdkafka.json"
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return str(path)


def test_general_is_merged_under_each_section_without_overriding(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "general": {"bootstrap.servers": "a:1", "session.timeout.ms": 6000, "x": "g"},
            "consumer": {"x": "c", "enable.auto.commit": True, "go.events.channel.enable": False},
            "producer": {"go.delivery.reports": True, "go.events.channel.size": 1000},
        },
    )
    settings = kafka_settings(from_args(["-c", path]))
    assert dict(settings.consumer) == {
        "bootstrap.servers": "a:1",
        "session.timeout.ms": "6000",
        "x": "c",
        "enable.auto.commit": "true",
    }
    assert dict(settings.producer) == {
        "bootstrap.servers": "a:1",
        "session.timeout.ms": "6000",
        "x": "g",
    }
    assert from_args(["-c", path]).config_path == path


def test_numbers_keep_their_literal_text_and_missing_sections_are_empty(tmp_path: Path) -> None:
    path = write(tmp_path, '{"consumer": {"a": 1.50, "b": 12345678901234567890, "c": 1e3}}')
    settings = kafka_settings(from_args(["-c", path]))
    assert dict(settings.consumer) == {"a": "1.50", "b": "12345678901234567890", "c": "1e3"}
    assert dict(settings.producer) == {}
    assert kafka_settings(from_args(["-c", write(tmp_path, {"producer": {}})])).consumer == {}


def test_gateway_section_and_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "gateway": {
                "host": "127.0.0.2",
                "port": 7000,
                "password": "pw",
                "max_clients": 3,
                "idle_timeout": 1.5,
                "blpop_default_timeout": 2,
                "log_format": "json",
                "max_arguments": 20,
                "consume_batch": 10,
                "partial_command_timeout": 0,
                "monitor_queue_bytes": 4096,
            }
        },
    )
    config = from_args(["-c", path])
    assert (config.host, config.port, config.password) == ("127.0.0.2", 7000, "pw")
    assert (config.max_clients, config.idle_timeout, config.blpop_default_timeout) == (3, 1.5, 2)
    assert (config.log_format, config.max_arguments, config.consume_batch) == ("json", 20, 10)
    assert (config.partial_command_timeout, config.monitor_queue_bytes) == (0, 4096)
    # Flags win over the file.
    flagged = from_args(["-c", path, "--host", "::1", "-p", "7001"])
    assert (flagged.host, flagged.port) == ("::1", 7001)
    assert from_args(["--config", write(tmp_path, {}), "--log-json"]).log_format == "json"
    defaults = from_args(["-c", write(tmp_path, {})])
    assert (defaults.host, defaults.port, defaults.engine) == ("0.0.0.0", 6380, "dafka")
    assert (defaults.blpop_default_timeout, defaults.producer_close_timeout) == (5.0, 5.0)
    assert defaults.consume_batch == 500
    assert (defaults.partial_command_timeout, defaults.monitor_queue_bytes) == (300, 16 * 2**20)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"consumer": {"a": {"b": 1}}}, "consumer.a: nested objects and arrays are not allowed"),
        ({"general": {"a": [1]}}, "general.a: nested objects and arrays are not allowed"),
        ({"producer": {"a": None}}, "producer.a: must be a string, a number or a boolean"),
        # confluent-kafka's keys for Python objects: a string there failed every poll.
        ({"general": {"logger": "x"}}, "general.logger: not a librdkafka property"),
        ({"consumer": {"on_commit": "f"}}, "consumer.on_commit: not a librdkafka property"),
        # librdkafka counts its waits in 32-bit milliseconds: longer failed at once.
        (
            {"gateway": {"metadata_timeout": 2592000}},
            "gateway.metadata_timeout must be at most 2147483 s, got 2592000",
        ),
        ({"consumer": []}, "section 'consumer' must be a JSON object"),
        ({"gateway": {"engine": "x"}}, "gateway.engine must be one of dafka, kafka"),
        ({"gateway": {"port": "6380"}}, "gateway.port must be an integer"),
        ({"gateway": {"port": 70000}}, "gateway.port must be >= 0 and <= 65535"),
        ({"gateway": {"idle_timeout": -1}}, "gateway.idle_timeout must be a finite number >= 0"),
        ({"gateway": {"shutdown_timeout": 0}}, "gateway.shutdown_timeout must be a finite"),
        (
            {"gateway": {"partial_command_timeout": -1}},
            "gateway.partial_command_timeout must be a finite number >= 0",
        ),
        ({"gateway": {"monitor_queue_bytes": 0}}, "gateway.monitor_queue_bytes must be >= 1"),
        ({"gateway": {"log_format": "xml"}}, "gateway.log_format must be one of console, json"),
        ({"gateway": {"colour": 1}}, "unknown setting gateway.colour"),
        ({"gateway": {"consume_batch": 0}}, "gateway.consume_batch must be >= 1"),
        ({"producer": {"go.events.channel.size": "big"}}, "go.events.channel.size must be"),
        ([], "the configuration must be a JSON object"),
    ],
)
def test_bad_documents_name_the_problem(tmp_path: Path, document: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_args(["-c", write(tmp_path, document)])
    assert message in str(caught.value)


def test_secrets_are_redacted() -> None:
    config = from_dict(
        {
            "general": {"sasl.password": "p1", "bootstrap.servers": "b:1"},
            "consumer": {"ssl.key.password": "p2", "sasl.oauthbearer.config": "p3"},
            "producer": {"my.token": "p4", "client.secret": "p5"},
            "gateway": {"password": "p6"},
        }
    )
    shown = json.dumps(config.redacted())
    for secret in ("p1", "p2", "p3", "p4", "p5", "p6"):
        assert f'"{secret}"' not in shown
    assert config.redacted()["engine_settings"]["consumer"]["bootstrap.servers"] == "b:1"
    assert config.redacted()["password"] == REDACTED


# --- the `rafka` command ---------------------------------------------------------------


def run_rafka(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAFKA, *args], capture_output=True, text=True, timeout=30, cwd="/tmp", check=False
    )


def test_version_flag() -> None:
    result = run_rafka("-v")
    assert result.returncode == 0
    assert result.stdout.strip() == f"rafka version {__version__}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", ""], "No librdkafka configuration provided"),
        (["-c", "/nonexistent/x.json"], "cannot read configuration file /nonexistent/x.json"),
        (["-p", "notaport"], "invalid int value: 'notaport'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_cli_errors_exit_non_zero_with_a_message(args: list[str], message: str) -> None:
    result = run_rafka(*args)
    assert result.returncode != 0
    assert message in result.stderr


def test_cli_bad_file_exits_non_zero(tmp_path: Path) -> None:
    result = run_rafka("-c", write(tmp_path, '{"general": {"a": 1'))
    assert result.returncode == 1
    assert "invalid JSON" in result.stderr
    result = run_rafka("-c", write(tmp_path, {"consumer": {"deep": {"x": 1}}}))
    assert result.returncode == 1
    assert "consumer.deep" in result.stderr


def test_cli_port_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_rafka("-c", write(tmp_path, {}), "--host", "127.0.0.1", "-p", str(port))
    assert result.returncode == 1
    assert "cannot listen" in result.stderr


def test_cli_serves_then_exits_0_on_sigterm(tmp_path: Path, tansu: TansuBroker) -> None:
    port = free_port()
    path = write(
        tmp_path,
        {
            "general": {"bootstrap.servers": tansu.bootstrap, "sasl.password": "hunter2"},
            "producer": {"queue.buffering.max.ms": 5},
        },
    )
    # Through backends.process: it dies with the test run, even a SIGKILLed one.
    process = spawn(
        [*RAFKA, "-c", path, "--host", "127.0.0.1", "-p", str(port), "--log-json"],
        env={"PYTHONUNBUFFERED": "1"},
        keep_lines=None,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

        def pong() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_until(pong, 15, "rafka to answer PING")
        assert client.rpushx("topics:cli-topic", "m") == 1
        assert client.execute_command("DUMP", "5000") == 0
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        process.stop()
    stderr = "\n".join(process.stderr_lines)
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert "starting" in events and "Shutting down..." in events
    assert "hunter2" not in stderr
    started = next(line for line in lines if line["event"] == "starting")
    engine = started["config"]["engine_settings"]
    assert engine["producer"]["sasl.password"] == REDACTED
    assert engine["librdkafka"] == confluent_kafka.libversion()[0]


def test_log_json_lines_are_json_while_the_broker_is_down(tmp_path: Path) -> None:
    """librdkafka's own lines (a broker refusing connections) went raw to stderr
    (`%3|...|FAIL|rdkafka#producer-1| ...`), breaking a JSON log pipeline just when it
    matters; they come as our JSON lines now."""
    port = free_port()
    path = write(tmp_path, {"general": {"bootstrap.servers": f"127.0.0.1:{free_port()}"}})
    process = spawn(
        [*RAFKA, "-c", path, "--host", "127.0.0.1", "-p", str(port), "--log-json"],
        env={"PYTHONUNBUFFERED": "1"},
        keep_lines=None,
    )
    try:
        wait_until(lambda: answers_ping(port), 15, "rafka to answer PING")
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        assert client.rpushx("topics:logs", "x") == 1
        assert client.execute_command("DUMP", "2000") == 1, "delivered to no broker?"
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        process.stop()
    lines = []
    for line in process.stderr_lines:
        try:
            lines.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    failures = [line for line in lines if line["event"] == "librdkafka"]
    assert failures, "librdkafka said nothing of the broker refusing connections"
    assert failures[0]["facility"] and "rdkafka#" in failures[0]["client"], failures[0]
    assert "Connection refused" in " ".join(line["text"] for line in failures)


def test_the_gateway_names_the_engine_and_loads_only_that_one() -> None:
    # An engine's libraries (librdkafka here) load only once the configuration chose it.
    probe = (
        "import sys, gateway.cli, gateway.runner, gateway.config as c\n"
        "assert 'confluent_kafka' not in sys.modules, 'loaded before any configuration'\n"
        "c.from_dict({'consumer': {}})\n"
        "assert 'backends.kafka' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=30)
    assert Config().engine == "dafka", "nothing configured: the embedded engine"
    assert kafka_settings(Config(engine="kafka")).producer == {}, "the engine's defaults"
    # The names come from the registry (where the tests add their in-memory engine).
    with pytest.raises(ConfigError) as unknown:
        Config(engine="x")
    assert str(unknown.value) == f"gateway.engine must be one of {', '.join(ENGINES)}, got 'x'"


def test_the_engine_follows_the_file_unless_named(tmp_path: Path) -> None:
    """Rafka's own file (librdkafka sections) keeps meaning Kafka; no file, or a `dafka`
    section, means the embedded Dafka engine; flags win over both."""
    rafka_file = write(tmp_path, {"general": {"bootstrap.servers": "b:9092"}})
    assert from_args(["-c", rafka_file]).engine == "kafka"
    assert from_args(["-c", write(tmp_path, {"dafka": {"partitions": 2}})]).engine == "dafka"
    assert from_args(["-c", rafka_file, "--engine", "dafka"]).engine == "dafka"
    both = write(tmp_path, {"consumer": {}, "dafka": {}})
    with pytest.raises(ConfigError, match="sections of several engines"):
        from_args(["-c", both])
    assert from_args(["-c", both, "--engine", "kafka"]).engine == "kafka"


def test_engine_flags_write_the_engine_section(tmp_path: Path) -> None:
    config = from_args(
        [
            "-c",
            write(tmp_path, {"dafka": {"stores": 3}}),
            "--data-dir",
            str(tmp_path / "data"),
            "--tower-sub",
            "tcp://127.0.0.1:5556",
            "--tower-pub",
            "tcp://127.0.0.1:5557",
        ]
    )
    settings = config.engine_settings
    assert isinstance(settings, DafkaSettings)
    assert (settings.tower_sub_address, settings.tower_pub_address, settings.stores) == (
        "tcp://127.0.0.1:5556",
        "tcp://127.0.0.1:5557",
        3,
    )
    assert settings.joined
    assert config.engine_options().data_dir == str(tmp_path / "data")
    with pytest.raises(ConfigError, match=r"dafka\.stores must be 1\.\.16, got 0"):
        from_args(["-c", write(tmp_path, {}), "--stores", "0"])


def test_no_file_at_all_runs_the_embedded_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no librdkafka.json here
    config = from_args([])
    assert (config.engine, config.config_path) == ("dafka", None)
    assert config.engine_options().data_dir == "rafka-data"


@pytest.mark.parametrize("where", ["file", "flag"])
def test_an_empty_data_dir_is_refused_naming_the_key(tmp_path: Path, where: str) -> None:
    """ "" was accepted, and the embedded network put rafka.lock and store-0/ in whatever
    the working directory was (found in review)."""
    path = tmp_path / "c.json"
    document = {"gateway": {"data_dir": ""}} if where == "file" else {}
    path.write_text(json.dumps(document))
    flags = ["--data-dir", ""] if where == "flag" else []
    with pytest.raises(ConfigError, match=r"^gateway\.data_dir must not be empty$"):
        from_args(["-c", str(path), *flags])


def test_a_start_timeout_no_thread_can_wait_is_refused_at_load() -> None:
    """dafka.start_timeout is also waited for in threads, which refuse more than
    threading.TIMEOUT_MAX: 1e10 passed the check and rafka died in a traceback while its
    embedded network started (found in review)."""
    with pytest.raises(ConfigError, match=r"^dafka\.start_timeout must be a finite number > 0"):
        from_dict({"dafka": {"start_timeout": 1e10}})
