"""Start real processes for the end-to-end tests: a rafka gateway on a Tansu broker."""

from __future__ import annotations

import json
import signal
import socket
import sys
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

import redis

from backends.process import Child, spawn, start
from tests.support.kafka import kafka_document
from tests.support.tansu import TansuBroker, free_port

RAFKA = Path(sys.executable).parent / "rafka"
REPO = Path(__file__).resolve().parent.parent


def port_answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16) == b"+PONG\r\n"
    except OSError:
        return False


class RafkaProcess:
    """`rafka -c <file> -p <port>` as a child process (dies with the test run), stopped
    with SIGTERM."""

    def __init__(self, config_path: Path, port: int | None = None, *args: str) -> None:
        self.port = port or free_port()
        self.config_path = config_path
        self.args = args
        self.child: Child | None = None

    def start(self) -> None:
        argv = [str(RAFKA), "-c", str(self.config_path), "--host", "127.0.0.1"]
        self.child = start(
            [*argv, "-p", str(self.port), *self.args],
            name="rafka",
            ready=lambda: port_answers_ping(self.port),
            timeout=20,
            cwd=REPO,
            env={"PYTHONUNBUFFERED": "1"},
            keep_lines=None,
        )

    def stderr(self) -> str:
        return "\n".join(self.child.stderr_lines) if self.child is not None else ""

    def kill(self) -> None:
        """Make sure the process is gone (a failed test must not leave it running)."""
        if self.child is not None:
            self.child.kill()
            self.child.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.child is not None
        code = self.child.stop(timeout)
        if code == -signal.SIGKILL:
            raise AssertionError(
                f"rafka did not exit within {timeout}s of SIGTERM: {self.stderr()}"
            )
        return code


def write_config(path: Path, bootstrap: str) -> Path:
    """The tests' Kafka configuration (tests/support/kafka.py) as a `rafka -c` file."""
    path.write_text(json.dumps(kafka_document(bootstrap), indent=2))
    return path


class Deployment(ABC):
    """What a `rafka` process runs on, for the tests that hold for every engine."""

    name: str

    @abstractmethod
    def write_config(self, path: Path) -> Path:
        """A `rafka -c` file for a gateway of this deployment (a fresh data directory)."""

    @abstractmethod
    def new_topic(self, partitions: int = 4) -> str: ...


class KafkaDeployment(Deployment):
    name = "kafka"

    def __init__(self, broker: TansuBroker) -> None:
        self.broker = broker

    def write_config(self, path: Path) -> Path:
        return write_config(path, self.broker.bootstrap)

    def new_topic(self, partitions: int = 4) -> str:
        return self.broker.create_topic(partitions)


def dafka_document(data_dir: Path, **dafka: object) -> dict[str, object]:
    """An embedded Dafka gateway over `data_dir`; topics named `p<n>-...` have n
    partitions (see new_topic), others 4."""
    return {
        "gateway": {"engine": "dafka", "data_dir": str(data_dir)},
        "dafka": {
            "topic_partitions": {f"p{n}-*": n for n in range(1, 17)},
            "commit_interval": 0.2,
            **dafka,
        },
    }


class DafkaDeployment(Deployment):
    """Each gateway embeds its own network, over its own data directory."""

    name = "dafka"

    def write_config(self, path: Path) -> Path:
        path.write_text(json.dumps(dafka_document(path.parent / "rafka-data"), indent=2))
        return path

    def new_topic(self, partitions: int = 4) -> str:
        return f"p{partitions}-{uuid.uuid4().hex[:6]}"


BIN = Path(sys.executable).parent  # the venv's programs


def zpl(
    tower_sub: int,
    tower_pub: int,
    db: Path | None = None,
    *,
    towers: list[tuple[int, int]] | None = None,
) -> str:
    """A ZPL config on loopback only: nothing ever connects to another interface.
    `towers`: the (sub, pub) ports the beacon uses, when not just this config's tower."""
    beacon_towers = towers or [(tower_sub, tower_pub)]
    subs = ",".join(f"tcp://127.0.0.1:{sub}" for sub, _ in beacon_towers)
    pubs = ",".join(f"tcp://127.0.0.1:{pub}" for _, pub in beacon_towers)
    text = (
        "beacon\n"
        "    interval = 100\n"
        "    timeout = 2000\n"
        f"    sub_address = {subs}\n"
        f"    pub_address = {pubs}\n"
        "    address = 127.0.0.1\n"
        "tower\n"
        f"    sub_address = tcp://127.0.0.1:{tower_sub}\n"
        f"    pub_address = tcp://127.0.0.1:{tower_pub}\n"
        "producer\n"
        "    head_interval = 100\n"
    )
    if db is not None:
        text += f"store\n    db = {db}\n"
    return text


class Program:
    """A Dafka program (dies with the test run); all its output lines are kept."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        self.args = args
        self.child = spawn(
            [str(BIN / args[0]), *args[1:]],
            stdin=stdin,
            env={"PYTHONUNBUFFERED": "1"},
            keep_lines=None,
        )

    @property
    def lines(self) -> list[str]:
        """What it printed on stdout so far."""
        return self.child.stdout_lines

    def write_lines(self, lines: list[str]) -> None:
        self.child.write("".join(f"{line}\n" for line in lines).encode())

    def close_stdin(self) -> None:
        self.child.close_stdin()

    def wait_exit(self, timeout: float) -> int:
        return self.child.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if sig == signal.SIGKILL:
            self.child.kill()
        self.child.stop(15)

    def stderr(self) -> str:
        """What the program logged so far (for failure messages)."""
        return "\n".join(self.child.stderr_lines) or "(nothing on stderr)"


# --- a Rafka client's steps, over redis-py ------------------------------------------------

WAIT = 20.0


def produce(port: int, topic: str, values: list[str], key: str | None = None) -> None:
    client = redis.Redis(port=port, socket_timeout=WAIT)
    target = f"topics:{topic}" + (f":{key}" if key else "")
    assert client.execute_command("RPUSHX", target, *values) == len(values)
    assert client.execute_command("DUMP", "10000") == 0, "records not durable after DUMP"
    client.close()


def consume(
    port: int, group: str, topic: str, count: int, ack: bool = True, name: str = "c"
) -> list[tuple[int, int, bytes]]:
    """`count` records as (partition, offset, value), acked one by one if asked."""
    client = redis.Redis(port=port, client_name=f"{group}:{name}", socket_timeout=WAIT)
    got: list[tuple[int, int, bytes]] = []
    for _ in range(count):
        reply = client.blpop([f"topics:{topic}"], 10)
        assert reply is not None, f"only {len(got)} of {count} records: {got}"
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        value = fields[b"value"]
        assert isinstance(value, bytes), reply
        record = (int(fields[b"partition"]), int(fields[b"offset"]), value)
        got.append(record)
        if ack:
            client.execute_command("RPUSH", "acks", f"{topic}:{record[0]}:{record[1]}")
    client.execute_command("QUIT")
    client.close()
    return got


def drain(port: int, group: str, topic: str, wanted: set[bytes] | None = None) -> list[bytes]:
    """Records the group gets, acked, until every `wanted` value came (then until none
    comes for a second), or until WAIT seconds pass with nothing new."""
    client = redis.Redis(port=port, client_name=f"{group}:drain", socket_timeout=WAIT)
    values: list[bytes] = []
    left = set(wanted or ())
    try:
        while True:
            reply = client.blpop([f"topics:{topic}"], WAIT if left else 1)
            if reply is None:
                return values
            fields = dict(zip(reply[::2], reply[1::2], strict=True))
            value = fields[b"value"]
            assert isinstance(value, bytes), reply
            values.append(value)
            left.discard(value)
            ack = f"{topic}:{int(fields[b'partition'])}:{int(fields[b'offset'])}"
            client.execute_command("RPUSH", "acks", ack)
    finally:
        client.close()
