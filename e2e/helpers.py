"""What the end-to-end tests share: the deployments a `rafka` process runs on, and a
Rafka client's steps over redis-py. The processes themselves are in tests/support."""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

import redis

from tests.support.rafka_process import write_config
from tests.support.tansu import TansuBroker


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
