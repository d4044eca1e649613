"""What the end-to-end tests share: the deployments a `rafka` process runs on, and a
Rafka client's steps over redis-py. The processes themselves are in tests/support."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from abc import ABC, abstractmethod
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rocksdict import AccessType, Options, Rdict

from tests.support.rafka_process import RafkaProcess, write_config
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


def drain(
    port: int,
    group: str,
    topic: str,
    wanted: set[bytes] | None = None,
    client: redis.Redis | None = None,
) -> list[bytes]:
    """Records the group gets, acked, until every `wanted` value came (then until none
    comes for a second), or until WAIT seconds pass with nothing new. On `client` (a
    consumer of `group` already, closed at the end) or a new connection."""
    if client is None:
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


def store_entries(db: Path, prefix: bytes) -> list[tuple[bytes, bytes]] | None:
    """The (key, value) pairs under `prefix` in a Dafka store's RocksDB, read without
    disturbing the store (read-only mode takes no lock); None while it cannot be opened."""
    if not (db / "CURRENT").exists():
        return None
    try:
        store = Rdict(str(db), options=Options(raw_mode=True), access_type=AccessType.read_only())
    except Exception:  # rocksdict raises plain Exception, e.g. a WAL rotated while opening
        return None
    try:
        entries = []
        for key, value in store.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break  # the keys under a prefix are adjacent
            entries.append((key, value))
        return entries
    finally:
        store.close()


def kill_and_restart(server: RafkaProcess) -> RafkaProcess:
    """kill -9 the gateway, then start another on its port and configuration."""
    assert server.child is not None
    os.kill(server.child.pid, signal.SIGKILL)
    server.child.wait(WAIT)
    again = RafkaProcess(server.config_path, server.port)
    again.start()
    return again


class Producing(threading.Thread):
    """Produces batches with RPUSHX + DUMP until stopped (at most `max_batches`); remembers
    what DUMP confirmed. A batch whose DUMP did not answer 0 (the gateway died under it, or
    its engine could not store it within `dump_ms`) is not confirmed. An error reply is
    remembered and the thread goes on; a lost connection ends it."""

    def __init__(
        self,
        port: int,
        topic: str,
        tag: str,
        *,
        dump_ms: int = 5000,
        batch: int = 20,
        max_batches: int = 100_000,
    ) -> None:
        super().__init__(daemon=True)
        self.port, self.topic, self.tag = port, topic, tag
        self.dump_ms, self.batch, self.max_batches = dump_ms, batch, max_batches
        self.confirmed: list[bytes] = []
        self.batches = 0
        self.unconfirmed = 0  # batches whose DUMP answered more than 0
        self.errors: list[str] = []  # error replies, in order
        self.slowest_dump = 0.0  # seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        # No retry: a DUMP redis-py re-sent on a new connection would answer for another
        # session, and count records the killed gateway never confirmed.
        client = redis.Redis(port=self.port, socket_timeout=WAIT, retry=Retry(NoBackoff(), 0))
        try:
            while not self.stopping.is_set() and self.batches < self.max_batches:
                values = [f"{self.tag}-{self.batches}-{i}".encode() for i in range(self.batch)]
                self.batches += 1
                try:
                    client.execute_command("RPUSHX", f"topics:{self.topic}", *values)
                    started = time.monotonic()
                    left = client.execute_command("DUMP", str(self.dump_ms))
                    self.slowest_dump = max(self.slowest_dump, time.monotonic() - started)
                except redis.ResponseError as error:
                    self.errors.append(str(error))
                    self.stopping.wait(0.05)  # an error answers at once: do not spin
                    continue
                if left == 0:
                    self.confirmed += values
                else:
                    self.unconfirmed += 1
        except (redis.ConnectionError, redis.TimeoutError):
            return  # the gateway was killed under us
        finally:
            client.close()
