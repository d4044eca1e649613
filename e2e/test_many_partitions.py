"""A gateway writing many partitions (embedded Dafka): all its partition writers are
partitions of one producer actor (`publisher.Publisher`), so a partition costs the process
no thread and no open file. Before: every writer was a Dafka producer of its own (a thread,
four sockets and their connections, about 22 open files, a beacon the tower sent to every
node: 200 writers took ~100 s, 1,000 did not finish); earlier still, every writer
connected to every other (N² TCP connections) and libzmq's default of 1,023 sockets per
process stopped the gateway at about 170 writers ("Too many open files")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from backends.process import Child
from tests.support.rafka_process import start_rafka

WRITERS = 1000  # topics of one partition: 1,000 partition writers
# What opening 999 writers may add to the process, whatever their number: the threads of
# asyncio's default executor (writers open there; min(32, cores + 4) at most) and a few
# files for the sockets those threads' first use makes.
EXTRA_THREADS = 32
EXTRA_FILES = 40


@pytest.fixture
def rafka(tmp_path: Path) -> Iterator[tuple[Child, int]]:
    document = {"dafka": {"partitions": 1}}
    child, port = start_rafka(tmp_path, document, "--engine", "dafka")
    yield child, port
    assert child.stop(60) == 0, child.stderr_lines[-5:]


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def produce(client: redis.Redis, topics: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    for topic in topics:
        pipe.execute_command("RPUSHX", f"topics:{topic}", f"record of {topic}")
    assert pipe.execute() == [1] * len(topics)
    left = client.execute_command("DUMP", "60000")
    assert left == 0, f"{left} records not held by a store after DUMP"


def test_a_thousand_partition_writers_store_everything_with_no_thread_or_file_each(
    rafka: tuple[Child, int],
) -> None:
    child, port = rafka
    client = redis.Redis(port=port, socket_timeout=90)
    produce(client, ["many-0000"])
    files, tasks = open_files(child.pid), threads(child.pid)
    topics = [f"many-{i:04d}" for i in range(1, WRITERS)]
    produce(client, topics)
    more_files = open_files(child.pid) - files
    more_threads = threads(child.pid) - tasks
    assert more_files <= EXTRA_FILES, (
        f"{len(topics)} more partition writers hold {more_files} more files of the gateway "
        f"(bound {EXTRA_FILES}): the cost grows with the number of writers"
    )
    assert more_threads <= EXTRA_THREADS, (
        f"{len(topics)} more partition writers run {more_threads} more threads "
        f"(bound {EXTRA_THREADS}): the cost grows with the number of writers"
    )
    # Every record can be read back by a group.
    consumer = redis.Redis(port=port, socket_timeout=90, client_name="many:reader")
    key = "topics:" + ",".join(["many-0000", *topics])
    replies = [consumer.execute_command("BLPOP", key, 30) for _ in range(WRITERS)]
    values = {reply[7] for reply in replies}
    assert values == {f"record of many-{i:04d}".encode() for i in range(WRITERS)}
    client.close()
    consumer.close()
