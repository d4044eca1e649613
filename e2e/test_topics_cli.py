"""`rafka-topics` as a real process against (a) a `rafka` on the embedded Dafka engine (its
data directory, with the gateway running and without), (b) a Dafka network of
dafka-towerd and two dafka-stored, (c) Tansu; keyed records produced through gateways
land on exactly the created partitions."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from backends.ports import free_port
from e2e.helpers import dafka_document, store_entries
from tests.support.dafka_programs import BIN, Program, zpl
from tests.support.rafka_process import RafkaProcess, write_config
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

TOPICS = BIN / "rafka-topics"
WAIT = 20.0


def topics(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """rafka-topics with `args`; its exit status, stdout and stderr."""
    return subprocess.run(
        [str(TOPICS), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def ok(*args: str) -> str:
    done = topics(*args)
    assert done.returncode == 0, f"rafka-topics {' '.join(args)}: {done.stderr}"
    assert done.stderr == "", f"rafka-topics wrote on stderr: {done.stderr}"
    return done.stdout


def fails(*args: str, match: str) -> None:
    done = topics(*args)
    assert done.returncode == 1, f"rafka-topics {' '.join(args)} did not fail: {done.stdout}"
    assert done.stdout == ""
    assert re.search(f"^rafka-topics: .*{match}", done.stderr), done.stderr


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document, indent=2))
    return path


def produce_keys(port: int, topic: str, keys: int) -> None:
    client = redis.Redis(port=port, socket_timeout=WAIT)
    for key in range(keys):
        assert client.execute_command("RPUSHX", f"topics:{topic}:key-{key}", f"v{key}") == 1
    assert client.execute_command("DUMP", "10000") == 0, "records not durable after DUMP"
    client.close()


def consume(port: int, group: str, topic: str, count: int) -> list[tuple[int, int]]:
    """`count` records as (partition, offset), each acked."""
    client = redis.Redis(port=port, client_name=f"{group}:c", socket_timeout=WAIT)
    got: list[tuple[int, int]] = []
    for _ in range(count):
        reply = client.blpop([f"topics:{topic}"], 10)
        assert reply is not None, f"only {len(got)} of {count} records: {got}"
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        record = (int(fields[b"partition"]), int(fields[b"offset"]))
        got.append(record)
        client.execute_command("RPUSH", "acks", f"{topic}:{record[0]}:{record[1]}")
    client.execute_command("QUIT")
    client.close()
    return got


def partitions(described: str) -> dict[int, tuple[int, int]]:
    """partition -> (first, next) of a --describe output."""
    found = re.findall(r"\tPartition: (\d+)\tFirst: (\d+)\tNext: (\d+)", described)
    return {int(p): (int(first), int(nxt)) for p, first, nxt in found}


def group_lines(described: str, group: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed, lag) of a group in a --describe output."""
    found = re.findall(
        rf"\tGroup: {group}\tTopic: \S+\tPartition: (\d+)\tCommitted: (\d+)\tLag: (\d+)",
        described,
    )
    return {int(p): (int(committed), int(lag)) for p, committed, lag in found}


def records_of(db: Path, topic: str) -> int | None:
    """How many records of `topic` a store's RocksDB holds; None while it cannot be opened."""
    entries = store_entries(db, b"M" + topic.encode() + b"\0")
    return None if entries is None else len(entries)


def wait_records(db: Path, topic: str, count: int) -> None:
    wait_until(lambda: records_of(db, topic) == count, WAIT, f"{db}: not {count} of {topic}")


# --- (a) a rafka on the embedded Dafka engine: its data directory -------------------------


def test_embedded_gateway_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    where = ("--data-dir", str(data))
    fails(*where, "--list", match=f"{data} is not the data directory of a rafka")
    assert not data.exists(), "a mistyped directory must not be created"
    config = write(tmp_path / "rafka.json", dafka_document(data))

    gateway = RafkaProcess(config)
    gateway.start()  # running before the create
    try:
        created = ok(*where, "--create", "--topic", "live", "--partitions", "3")
        assert created == "Created topic live.\n"
        wait_until(
            lambda: (
                "topic created (rafka-topics)" in gateway.stderr()
                and "topic=live" in gateway.stderr()
            ),
            WAIT,
            "the running gateway did not follow the create",
        )
        fails(*where, "--create", "--topic", "live", "--partitions", "2", match="already exists")
        fails(*where, "--describe", "--topic", "nothing", match="'nothing' does not exist")
        bad = ("--create", "--topic", "x", "--partitions", "1", "--config", "a=1")
        fails(*where, *bad, match="topic setting a is not supported")
        produce_keys(gateway.port, "live", 30)
        got = consume(gateway.port, "billing", "live", 20)
        assert {p for p, _ in got} <= {0, 1, 2}

        def described() -> str:
            out = ok(*where, "--describe", "--topic", "live")
            acked = group_lines(out, "billing")
            return out if sum(c for c, _ in acked.values()) == 20 else ""

        out = wait_until(described, WAIT, "describe did not show the group's 20 acks")
        assert set(partitions(out)) == {0, 1, 2}, f"not exactly the 3 partitions created: {out}"
        assert sum(nxt for _, nxt in partitions(out).values()) == 30
        assert all(first == 0 for first, _ in partitions(out).values())
        assert sum(lag for _, lag in group_lines(out, "billing").values()) == 10
        assert ok(*where, "--list", "--exclude-internal") == "live\n"
        assert gateway.terminate() == 0, gateway.stderr()

        # No gateway: rafka-topics runs the directory's tower and store for the command.
        ok(*where, "--create", "--topic", "later", "--partitions", "2")
        gateway = RafkaProcess(config, gateway.port)
        gateway.start()  # started after the create
        produce_keys(gateway.port, "later", 20)
        assert {p for p, _ in consume(gateway.port, "g", "later", 20)} == {0, 1}

        assert ok(*where, "--delete", "--topic", "live") == "Deleted topic live.\n"
        assert records_of(data / "store-0" / "db", "live") == 0, "records left in the store"
        wait_until(
            lambda: "topic deleted (rafka-topics)" in gateway.stderr(),
            WAIT,
            "the running gateway did not follow the delete",
        )
        # Reads by offset of what the deletion took, as of records retention took: none
        # held, the offsets go on (no wait for a head record the stores no longer hold).
        reader = redis.Redis(port=gateway.port, socket_timeout=WAIT)
        for partition, (_, following) in partitions(out).items():
            assert reader.llen(f"topics:live:{partition}") == following
            gone = rf"offsets 0 to {following - 1} of live:{partition} are no longer held"
            with pytest.raises(redis.ResponseError, match=gone):
                reader.lrange(f"topics:live:{partition}", 0, -1)
            assert reader.lrange(f"topics:live:{partition}", following, -1) == []
        assert ok(*where, "--list", "--exclude-internal") == "later\n"
        fails(*where, "--describe", "--topic", "live", match="'live' does not exist")
        fails(*where, "--delete", "--topic", "live", match="'live' does not exist")
        assert records_of(data / "store-0" / "db", "later") == 20, "another topic lost records"
        # Created again: what the deletion took stays gone, still answered at once.
        creates = gateway.stderr().count("topic created (rafka-topics)")
        assert ok(*where, "--create", "--topic", "live", "--partitions", "3")
        wait_until(
            lambda: gateway.stderr().count("topic created (rafka-topics)") > creates,
            WAIT,
            "the running gateway did not follow the second create",
        )
        for partition, (_, following) in partitions(out).items():
            assert reader.llen(f"topics:live:{partition}") == following
        reader.close()
    finally:
        gateway.kill()


# --- (b) a Dafka network of programs ----------------------------------------------------


@pytest.fixture
def dafka_network(tmp_path: Path) -> Iterator[tuple[str, str, list[Path]]]:
    """dafka-towerd and two dafka-stored; (tower sub, tower pub, the stores' DBs)."""
    sub, pub = free_port(), free_port()
    programs = [Program("dafka-towerd", "-c", str(write_zpl(tmp_path / "t.cfg", sub, pub)))]
    dbs = [tmp_path / "db-a", tmp_path / "db-b"]
    try:
        programs[0].child.wait_line("listening", 20)
        for index, db in enumerate(dbs):
            cfg = write_zpl(tmp_path / f"s{index}.cfg", sub, pub, db)
            programs.append(Program("dafka-stored", "-c", str(cfg)))
        for store in programs[1:]:
            store.child.wait_line("dafka-stored: store", 20)
        yield f"tcp://127.0.0.1:{sub}", f"tcp://127.0.0.1:{pub}", dbs
    finally:
        for program in reversed(programs):
            program.stop()


def write_zpl(path: Path, sub: int, pub: int, db: Path | None = None) -> Path:
    path.write_text(zpl(sub, pub, db))
    return path


def test_dafka_network_of_programs(
    tmp_path: Path, dafka_network: tuple[str, str, list[Path]]
) -> None:
    sub, pub, dbs = dafka_network
    where = ("--tower-sub", sub, "--tower-pub", pub)
    ok(*where, "--create", "--topic", "net", "--partitions", "2")
    document = {
        "gateway": {"engine": "dafka"},
        "dafka": {
            "tower_sub_address": sub,
            "tower_pub_address": pub,
            "settings": {"beacon/address": "127.0.0.1", "beacon/interval": "100"},
        },
    }
    gateway = RafkaProcess(write(tmp_path / "rafka.json", document))
    gateway.start()
    try:
        produce_keys(gateway.port, "net", 20)
        assert {p for p, _ in consume(gateway.port, "g", "net", 20)} == {0, 1}
        for db in dbs:
            wait_records(db, "net", 20)
        ok(*where, "--delete", "--topic", "net")
        for db in dbs:
            assert records_of(db, "net") == 0, f"the deleted topic's records are still in {db}"
        assert "net" not in ok(*where, "--list").split()
    finally:
        gateway.kill()
    nowhere = ("--tower-sub", f"tcp://127.0.0.1:{free_port()}")
    fails(*nowhere, "--timeout", "1", "--list", match="cannot reach .*no tower|Dafka network")


# --- (c) Kafka (Tansu) -------------------------------------------------------------------


def test_kafka_on_tansu(tmp_path: Path, tansu: TansuBroker) -> None:
    where = ("--bootstrap-server", tansu.bootstrap)
    name = f"cli-{uuid.uuid4().hex[:6]}"
    ok(*where, "--create", "--topic", name, "--partitions", "3", "--config", "retention.ms=3600000")
    fails(*where, "--create", "--topic", name, "--partitions", "3", match="already exists")
    assert name in ok(*where, "--list").split()
    gateway = RafkaProcess(write_config(tmp_path / "rafka.json", tansu.bootstrap))
    gateway.start()
    try:
        produce_keys(gateway.port, name, 30)
        got = consume(gateway.port, "billing", name, 30)
        assert {p for p, _ in got} == {0, 1, 2}, f"not exactly the 3 partitions created: {got}"
        acked = consume(gateway.port, "audit", name, 25)

        def described() -> str:
            out = ok(*where, "--describe", "--topic", name)
            committed = group_lines(out, "audit")
            return out if sum(c for c, _ in committed.values()) == 25 else ""

        out = wait_until(described, WAIT, "describe did not show the audit group's 25 acks")
    finally:
        gateway.kill()
    assert len(acked) == 25
    assert "Retention.ms: 3600000" in out
    assert sum(nxt for _, nxt in partitions(out).values()) == 30, out
    assert sum(lag for _, lag in group_lines(out, "audit").values()) == 5, out
    ok(*where, "--delete", "--topic", name)
    assert name not in ok(*where, "--list").split()
    fails(*where, "--describe", "--topic", name, match="does not exist")
    nowhere = ("--bootstrap-server", f"127.0.0.1:{free_port()}", "--timeout", "1")
    fails(*nowhere, "--list", match="cannot reach the Kafka cluster")
