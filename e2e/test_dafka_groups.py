"""Consumer groups on the embedded Dafka engine through a real `rafka`.

Acks: an ack of an offset never handed out (a client's typo, an offset of another topic)
must not move the group past records it never delivered. It was accepted as it came:
committed as far as the stores held (and further as records came), or, after a restart
(the clamp to what the stores hold covers only partitions this run wrote), past the
head, where the group's next member waited for ever. Kafka answers such a commit with
OFFSET_OUT_OF_RANGE and resets; here the ack counts up to what was handed out.

`latest`: a group starts after the heads the stores hold when it joins, and partitions
found later at their beginning."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from e2e.helpers import WAIT, dafka_document, drain, produce
from tests.support.rafka_process import RafkaProcess
from tests.support.waiting import wait_until

BOGUS = 1_000_000  # an offset never handed out


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "rafka.json"
    path.write_text(json.dumps(dafka_document(tmp_path / "rafka-data")))
    return path


@pytest.fixture
def gateway(config: Path) -> Iterator[RafkaProcess]:
    server = RafkaProcess(config)
    server.start()
    yield server
    server.kill()


def member(port: int, name: str) -> redis.Redis:
    return redis.Redis(
        port=port, client_name=f"g:{name}", socket_timeout=WAIT, retry=Retry(NoBackoff(), 0)
    )


def offset_of(client: redis.Redis, topic: str, timeout: float) -> int | None:
    reply = client.blpop([f"topics:{topic}"], timeout)
    return None if reply is None else int(reply[reply.index(b"offset") + 1])


def commits(port: int) -> int:
    with redis.Redis(port=port, socket_timeout=WAIT, protocol=2) as client:
        return int(client.hgetall("stats")[b"consumer.committed.offsets"])


def bogus_ack_then(server: RafkaProcess, topic: str, later: list[str], wanted: list[str]) -> None:
    """A member takes offset 0 and acks BOGUS; `later` is produced and committed over;
    then the group's next member gets exactly `wanted` (the records after offset 0)."""
    first = member(server.port, "a")
    assert offset_of(first, topic, WAIT) == 0
    assert first.execute_command("RPUSH", "acks", f"{topic}:0:{BOGUS}") == 1
    before = commits(server.port)
    wait_until(lambda: commits(server.port) > before, WAIT, "the ack was never committed")
    produce(server.port, topic, later)
    first.execute_command("QUIT")
    first.close()
    expected = [value.encode() for value in wanted]
    got = drain(server.port, "g", topic, set(expected))
    assert got == expected, f"the group skipped records: {got}"


def test_an_ack_past_what_was_handed_out_skips_nothing(gateway: RafkaProcess) -> None:
    topic = f"p1-{uuid.uuid4().hex[:6]}"
    produce(gateway.port, topic, ["v0"])
    later = [f"later{i}" for i in range(20)]
    bogus_ack_then(gateway, topic, later, later)


def test_an_ack_past_the_head_after_a_restart_skips_nothing(config: Path) -> None:
    topic = f"p1-{uuid.uuid4().hex[:6]}"
    server = RafkaProcess(config)
    server.start()
    try:
        produce(server.port, topic, [f"v{i}" for i in range(5)])
        assert server.terminate() == 0, server.stderr()
        server = RafkaProcess(config, server.port)
        server.start()  # the partition was written by the run before
        bogus_ack_then(server, topic, ["after"], ["v1", "v2", "v3", "v4", "after"])
    finally:
        server.kill()


def test_a_latest_group_gets_the_first_records_of_partitions_found_after_it_joined(
    gateway: RafkaProcess,
) -> None:
    """For a settling time after a `latest` join, a partition found (its first records,
    written after the join) was taken for one that existed and started past its head:
    those records never reached the group. The heads are asked before the join now."""
    topic = f"p4-{uuid.uuid4().hex[:6]}"
    produce(gateway.port, topic, ["old"], key="k0")  # one partition exists
    client = member(gateway.port, "late")
    key = f'topics:{topic}:{{"auto.offset.reset":"latest"}}'
    assert client.execute_command("BLMPOP", "0.01", "1", key, "LEFT", "COUNT", "10") is None
    new = [f"new{k}" for k in range(1, 16)]  # 15 keys: most of the other 3 partitions
    for k, value in enumerate(new, start=1):
        produce(gateway.port, topic, [value], key=f"k{k}")
    got: list[bytes] = []
    while reply := client.execute_command("BLMPOP", "2", "1", key, "LEFT", "COUNT", "100"):
        got += [record[record.index(b"value") + 1] for record in reply[1]]
    client.close()
    assert sorted(got) == sorted(value.encode() for value in new)
