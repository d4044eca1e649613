"""A gateway writing many partitions (embedded Dafka): each partition writer is a Dafka
producer of its own, so what each costs the process must stay constant. Before: every
writer connected to every other (N² TCP connections), and libzmq's default of 1,023
sockets per process stopped the gateway at about 170 writers ("Too many open files")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from backends.process import Child
from tests.support.rafka_process import start_rafka

WRITERS = 200  # topics of one partition: 200 partition writers
# Files the process holds per writer: its sockets, their connections to the stores, the
# tower and the gateway's readers, libzmq's mailboxes (about 22 here); 2 per other writer
# more when they connect to each other.
FILES_PER_WRITER = 40


@pytest.fixture
def rafka(tmp_path: Path) -> Iterator[tuple[Child, int]]:
    document = {"dafka": {"partitions": 1}}
    child, port = start_rafka(tmp_path, document, "--engine", "dafka")
    yield child, port
    assert child.stop(60) == 0, child.stderr_lines[-5:]


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def produce(client: redis.Redis, topics: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    for topic in topics:
        pipe.execute_command("RPUSHX", f"topics:{topic}", f"record of {topic}")
    assert pipe.execute() == [1] * len(topics)
    left = client.execute_command("DUMP", "60000")
    assert left == 0, f"{left} records not held by a store after DUMP"


def test_two_hundred_partition_writers_store_everything_at_a_constant_cost_each(
    rafka: tuple[Child, int],
) -> None:
    child, port = rafka
    client = redis.Redis(port=port, socket_timeout=90)
    produce(client, ["many-0000"])
    before = open_files(child.pid)
    topics = [f"many-{i:04d}" for i in range(1, WRITERS)]
    produce(client, topics)
    per_writer = (open_files(child.pid) - before) / len(topics)
    assert per_writer <= FILES_PER_WRITER, (
        f"each partition writer holds {per_writer:.0f} files of the gateway "
        f"(bound {FILES_PER_WRITER}): the cost grows with the number of writers"
    )
    # Every record can be read back by a group.
    consumer = redis.Redis(port=port, socket_timeout=90, client_name="many:reader")
    key = "topics:" + ",".join(["many-0000", *topics])
    replies = [consumer.execute_command("BLPOP", key, 30) for _ in range(WRITERS)]
    values = {reply[7] for reply in replies}
    assert values == {f"record of many-{i:04d}".encode() for i in range(WRITERS)}
    client.close()
    consumer.close()
