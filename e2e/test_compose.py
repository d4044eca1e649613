"""docker-compose.yml and the Dockerfile, checked without Docker (there is no Docker engine
on our machines; docs/deployment.md says what that leaves unchecked).

- `docker-compose config` (Debian's docker-compose 1.29.2 needs no daemon) checks the file
  against the Compose schema, with each profile, and refuses bad overrides with a message
  naming the problem.
- The services of the default profile and of the `dafka` profile, and the gateway of the
  `kafka` profile, run as local processes, mapped onto this machine as
  e2e/compose_local.py says, and serve clients as the deployment promises.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from backends.dafka.storage import Storage
from e2e.compose_local import COMPOSE_FILE, REPO, Local, compose, seconds
from gateway.config import Config as GatewayConfig
from gateway.server import ABANDON_GRACE

DEFAULT_SERVICES = {"rafka"}
DAFKA_SERVICES = {"dafka-towerd", "dafka-stored-1", "dafka-stored-2", "rafka-dafka"}
KAFKA_SERVICES = {"kafka", "rafka-kafka"}


def docker_compose(*args: str, files: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    program = shutil.which("docker-compose")
    if program is None:
        pytest.fail("docker-compose is not installed: `make system-packages` installs it")
    options = [arg for path in (COMPOSE_FILE, *files) for arg in ("-f", str(path))]
    return subprocess.run(
        [program, *options, *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    topology = Local(compose(), tmp_path)
    yield topology
    for service in topology.order:  # pytest shows it when the test failed
        print(f"--- {service}:\n{topology.output(service)}")
    topology.kill_all()


def produce(client: redis.Redis, topic: str, values: list[str]) -> None:
    assert client.execute_command("RPUSHX", f"topics:{topic}", *values) == len(values)
    assert client.execute_command("DUMP", "10000") == 0, "records not durable after DUMP"


def consume(client: redis.Redis, key: str, count: int) -> list[bytes]:
    """`count` records of `key` (`topics:<t>[:<json>]`), each acked."""
    topic = key.split(":")[1]
    values: list[bytes] = []
    for _ in range(count):
        reply = client.blpop([key], 20)
        assert reply is not None, f"only {len(values)} of {count} records: {values}"
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        value = fields[b"value"]
        assert isinstance(value, bytes), reply
        values.append(value)
        ack = f"{topic}:{int(fields[b'partition'])}:{int(fields[b'offset'])}"
        assert client.execute_command("RPUSH", "acks", ack) == 1
    return values


def round_trip(local: Local, service: str, group: str, topic: str, consumer: str = "") -> None:
    values = [f"{service}-{i}" for i in range(10)]
    with local.redis(service) as producer:
        produce(producer, topic, values)
    with local.redis(service) as client:
        assert client.execute_command("CLIENT", "SETNAME", f"{group}:c1")
        got = consume(client, f"topics:{topic}{consumer}", len(values))
    assert sorted(got) == sorted(v.encode() for v in values)


# --- docker-compose config --------------------------------------------------------------


@pytest.mark.parametrize("profile", [None, "dafka", "kafka", "spark"])
def test_compose_file_is_valid_with_each_profile(profile: str | None) -> None:
    result = docker_compose(*(["--profile", profile] if profile else []), "config", "-q")
    assert result.returncode == 0, result.stderr


def test_profiles_hold_the_services_of_issue_10() -> None:
    listed = docker_compose("config", "--profiles")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["dafka", "kafka", "spark"]
    services = compose()["services"]
    by_profile: dict[str, set[str]] = {}
    for name, spec in services.items():
        for profile in spec.get("profiles", ["default"]):
            by_profile.setdefault(profile, set()).add(name)
    assert by_profile == {
        "default": DEFAULT_SERVICES,
        "dafka": DAFKA_SERVICES,
        "kafka": KAFKA_SERVICES,
        "spark": {"spark-pipeline"},
    }


def test_the_spark_profile_runs_the_pipeline_against_the_default_gateway() -> None:
    # The pipeline needs Spark in the image; a local run of it is e2e/test_spark_pipeline.py.
    spec = compose()["services"]["spark-pipeline"]
    stages = re.findall(r"^FROM \S+ AS (\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert spec["build"]["target"] in stages
    command = spec["command"]
    assert command[0] == "python" and (REPO / command[1]).is_file(), command
    assert command[command.index("--url") + 1] == "redis://rafka:6380"
    assert spec["depends_on"] == {"rafka": {"condition": "service_healthy"}}


BAD_OVERRIDES = {
    "misspelled key": (
        "services:\n  rafka:\n    comand: [rafka]\n",
        "Unsupported config option for services.rafka: 'comand'",
    ),
    "wrong type": (
        "services:\n  rafka:\n    stop_grace_period: [45]\n",
        "services.rafka.stop_grace_period contains an invalid type, it should be a string",
    ),
    "undeclared volume": (
        "services:\n  rafka:\n    volumes:\n      - rafka-dta:/var/lib/rafka\n",
        'Named volume "rafka-dta:/var/lib/rafka:rw" is used in service "rafka" but no '
        "declaration was found in the volumes section.",
    ),
    "unknown dependency": (
        "services:\n  rafka-dafka:\n    depends_on:\n      dafka-tower:\n"
        "        condition: service_healthy\n",
        "Service 'rafka-dafka' depends on service 'dafka-tower' which is undefined.",
    ),
    "not YAML": ("services:\n  rafka: [\n", "while parsing a flow node"),
}


@pytest.mark.parametrize("case", list(BAD_OVERRIDES))
def test_a_bad_override_is_refused_with_a_message_naming_the_problem(
    case: str, tmp_path: Path
) -> None:
    text, message = BAD_OVERRIDES[case]
    override = tmp_path / "bad-override.yml"
    override.write_text(text)
    result = docker_compose("config", "-q", files=(override,))
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr


def test_stop_grace_periods_cover_the_gateway_shutdown() -> None:
    # The drain is bounded by gateway.shutdown_timeout; after it, connections and then the
    # engine get ABANDON_GRACE each (gateway/server.py).
    bound = GatewayConfig().shutdown_timeout + 2 * ABANDON_GRACE
    local = Local(compose(), Path("/nonexistent"))
    gateways = [
        name
        for name, spec in local.services.items()
        if "build" in spec and local.command(name)[0] == "rafka"
    ]
    assert set(gateways) == {"rafka", "rafka-dafka", "rafka-kafka"}
    for name in gateways:
        grace = seconds(local.services[name].get("stop_grace_period", "10s"))
        assert grace > bound, f"{name}: stop_grace_period {grace:g} s <= {bound:g} s"


def test_the_kafka_broker_advertises_what_the_gateway_connects_to() -> None:
    # The broker cannot run here (apache/kafka is a JVM image): its settings are checked
    # against the gateway's, which runs on Tansu below.
    services = compose()["services"]
    broker = services["kafka"]["environment"]
    gateway_config = REPO / "deploy" / "rafka-kafka.json"
    mount = f"./deploy/{gateway_config.name}:/etc/rafka/rafka.json:ro"
    assert mount in services["rafka-kafka"]["volumes"]
    bootstrap = json.loads(gateway_config.read_text())["general"]["bootstrap.servers"]
    assert broker["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{bootstrap}"
    host, port = bootstrap.split(":")
    assert host == "kafka" and port in services["kafka"]["expose"]
    listeners = dict(item.split("://") for item in broker["KAFKA_LISTENERS"].split(","))
    assert listeners["PLAINTEXT"] == f":{port}"
    voter_port = broker["KAFKA_CONTROLLER_QUORUM_VOTERS"].rsplit(":", 1)[1]
    assert listeners[broker["KAFKA_CONTROLLER_LISTENER_NAMES"]] == f":{voter_port}"
    assert broker["KAFKA_LOG_DIRS"] in [v.split(":")[1] for v in services["kafka"]["volumes"]]


# --- the services as local processes ----------------------------------------------------


def test_default_profile_the_embedded_gateway_keeps_its_log_on_its_volume(
    local: Local,
) -> None:
    assert "command" not in local.services["rafka"], "the image's CMD is what runs"
    local.up("rafka")
    assert local.health_output["rafka"] == "PONG"
    topic = f"t{uuid.uuid4().hex[:6]}"
    round_trip(local, "rafka", "g1", topic)
    assert local.down() == {"rafka": 0}

    volume = local.tmp / "volumes" / "rafka-data"
    assert (volume / "store-0" / "db").is_dir(), "the embedded store's log is on the volume"
    local.up("rafka")  # the container recreated on the same volume
    with local.redis("rafka", client_name="g2:c1") as client:
        again = consume(client, f"topics:{topic}", 10)
    assert len(again) == 10, "a new group reads the log kept on the volume"
    assert local.down() == {"rafka": 0}


def test_dafka_profile_a_tower_two_stores_and_a_joined_gateway(local: Local) -> None:
    local.up("rafka-dafka")  # and, through depends_on, the tower and both stores
    assert local.order == ["dafka-towerd", "dafka-stored-1", "dafka-stored-2", "rafka-dafka"]
    assert local.health_output["dafka-towerd"] == ""
    assert local.health_output["rafka-dafka"] == "PONG"
    topic = f"t{uuid.uuid4().hex[:6]}"
    round_trip(local, "rafka-dafka", "g1", topic)
    add_subscription(local, "rafka-dafka")
    assert local.down() == dict.fromkeys(DAFKA_SERVICES, 0)

    # acks=all: DUMP returned once both stores held every record, each on its own volume.
    for volume in ("dafka-store-1", "dafka-store-2"):
        with Storage(local.tmp / "volumes" / volume / "db") as storage:
            heads = storage.heads(topic.encode())
        assert sum(head + 1 for _, head in heads) == 10, f"{volume}: {heads}"
    assert_subscription_kept(local, "rafka-dafka")
    assert local.down() == dict.fromkeys(DAFKA_SERVICES, 0)


def add_subscription(local: Local, service: str) -> None:
    """A push subscription added at run time: kept in the gateway's data directory."""
    never_reached = "http://127.0.0.1:9/orders"  # being kept is what counts here
    subscription = {"name": "kept", "topic": "orders", "group": "kept", "urls": [never_reached]}
    with local.redis(service) as client:
        assert client.execute_command("RAFKA.PUSH", "ADD", json.dumps(subscription))


def assert_subscription_kept(local: Local, service: str) -> None:
    """The container recreated (`docker compose down`, then `up`) still has it: the data
    directory is on a named volume, not the image's anonymous one."""
    local.up(service)
    with local.redis(service) as client:
        kept = [json.loads(entry)["name"] for entry in client.execute_command("RAFKA.PUSH", "LIST")]
    assert kept == ["kept"], f"{service} lost its run-time push subscription: {kept}"


@pytest.mark.kafka  # a Tansu broker stands in for the kafka service
def test_kafka_profile_gateway_on_a_tansu_broker(local: Local) -> None:
    local.up("rafka-kafka")  # `kafka` is a Tansu broker on its port
    assert local.health_output["rafka-kafka"] == "PONG"
    # Group joins take half of session.timeout.ms on Tansu: this consumer asks for less.
    fast_join = json.dumps({"session.timeout.ms": 2000, "heartbeat.interval.ms": 500})
    round_trip(local, "rafka-kafka", "g1", f"t{uuid.uuid4().hex[:6]}", f":{fast_join}")
    add_subscription(local, "rafka-kafka")
    assert local.down() == {"rafka-kafka": 0, "kafka": 0}
    assert_subscription_kept(local, "rafka-kafka")
    assert local.down() == {"rafka-kafka": 0, "kafka": 0}
