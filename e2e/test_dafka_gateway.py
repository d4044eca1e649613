"""The `rafka` command on the Dafka engine, as real processes: what only this engine does
(its own tower and stores, a data directory, joining a network of Dafka programs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from backends.ports import free_port
from e2e.helpers import WAIT, consume, dafka_document, drain, produce, store_entries
from tests.support.dafka_programs import Program, zpl
from tests.support.processes import children
from tests.support.rafka_process import RAFKA, RafkaProcess
from tests.support.waiting import wait_until


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document, indent=2))
    return path


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[RafkaProcess]:
    server = RafkaProcess(write(tmp_path / "rafka.json", dafka_document(tmp_path / "data")))
    server.start()
    yield server
    server.kill()


def test_restart_keeps_records_partitions_and_commits(tmp_path: Path) -> None:
    config = write(tmp_path / "rafka.json", dafka_document(tmp_path / "data"))
    server = RafkaProcess(config)
    server.start()
    try:
        produce(server.port, "orders", [f"v{i}" for i in range(10)], key="customer-7")
        first = consume(server.port, "billing", "orders", 4)
        assert server.terminate() == 0, server.stderr()
        server = RafkaProcess(config, server.port)
        server.start()
        produce(server.port, "orders", ["v10"], key="customer-7")
        rest = consume(server.port, "billing", "orders", 7)
    finally:
        server.kill()
    assert [value for _, _, value in first + rest] == [b"v%d" % i for i in range(11)]
    assert len({partition for partition, _, _ in first + rest}) == 1, "the key moved"
    offsets = [offset for _, offset, _ in first + rest]
    assert offsets == list(range(11)), "offsets continue after the restart, none reused"


def test_a_store_wide_retention_in_bytes_keeps_a_quiet_groups_commit(tmp_path: Path) -> None:
    """`__rafka_offsets` goes by time only: a store-wide `store/retention/bytes` once took
    a quiet group's last commit when other groups committed more, and after a restart
    that group got every record it had acked again."""
    data = tmp_path / "data"
    settings = {"store/retention/bytes": "2000", "store/retention/check_interval": "100"}
    config = write(tmp_path / "rafka.json", dafka_document(data, settings=settings))
    db = data / "store-0" / "db"

    def commits() -> list[bytes]:
        return [value for _, value in store_entries(db, b"M__rafka_offsets\0") or []]

    server = RafkaProcess(config)
    server.start()
    try:
        produce(server.port, "p1-quiet", [f"q{i}" for i in range(10)])
        assert [offset for _, offset, _ in consume(server.port, "quiet", "p1-quiet", 5)] == [
            *range(5)
        ]
        wait_until(
            lambda: any(b'"quiet"' in value for value in commits()),
            WAIT,
            "the quiet group's commit never reached the store",
        )
        # A busy group with a long name commits a round per consume (each QUIT commits).
        busy = "busy-" + "x" * 300
        produce(server.port, "p1-busy", [f"b{i}" for i in range(12)])
        for _ in range(12):
            consume(server.port, busy, "p1-busy", 1)
        # A retention pass that began after every commit was stored: it trims a topic
        # written after them (`__rafka_offsets` sorts before it in the same pass).
        produce(server.port, "p1-marker", ["m" * 1000 for _ in range(4)])
        wait_until(
            lambda: len(store_entries(db, b"Mp1-marker\0") or [None] * 4) < 4,
            WAIT,
            "retention never ran after the commits",
        )
        assert server.terminate() == 0, server.stderr()
        server = RafkaProcess(config, server.port)
        server.start()
        again = consume(server.port, "quiet", "p1-quiet", 1)
    finally:
        server.kill()
    assert [offset for _, offset, _ in again] == [5], f"the quiet group's commit was lost: {again}"


def test_kill_9_loses_no_dumped_record_and_leaves_no_orphan(tmp_path: Path) -> None:
    config = write(tmp_path / "rafka.json", dafka_document(tmp_path / "data"))
    server = RafkaProcess(config)
    server.start()
    assert server.child is not None
    produced: set[bytes] = set()
    delivered: list[bytes] = []
    try:
        for round_ in range(3):
            kids = children(server.child.pid)
            assert len(kids) == 2, f"expected a tower and a store, got {kids}"
            values = [f"r{round_}-{i}" for i in range(50)]
            produce(server.port, "kills", values)  # DUMP returned 0 for all of them
            produced.update(v.encode() for v in values)
            delivered += [value for _, _, value in consume(server.port, "g", "kills", 20)]
            os.kill(server.child.pid, signal.SIGKILL)
            server.child.wait(WAIT)
            wait_until(
                lambda kids=kids: not any(alive(kid) for kid in kids),  # type: ignore[misc]
                WAIT,
                f"the tower and store outlived the gateway killed in round {round_}",
            )
            server = RafkaProcess(config, server.port)
            server.start()
            assert server.child is not None
        delivered += drain(server.port, "g", "kills")
    finally:
        server.kill()
    assert produced <= set(delivered), f"lost: {sorted(produced - set(delivered))}"
    # At least once: only acks the killed gateway had not committed yet come back.
    assert len(delivered) - len(produced) <= 3 * 20


def test_data_directory_locked_or_unusable_is_a_clear_error(
    embedded: RafkaProcess, tmp_path: Path
) -> None:
    taken = json.loads(embedded.config_path.read_text())
    second = write(tmp_path / "second.json", taken)
    result = subprocess.run(
        [str(RAFKA), "-c", str(second), "-p", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot start the dafka engine" in result.stderr
    assert taken["gateway"]["data_dir"] in result.stderr, result.stderr
    assert str(embedded.child.pid if embedded.child else "") in result.stderr

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [str(RAFKA), "--data-dir", str(blocker / "data"), "-p", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "cannot start the dafka engine" in result.stderr
    assert str(blocker) in result.stderr, result.stderr


@pytest.mark.parametrize(
    "bound",
    [{"start_timeout": 1}, {"settings": {"beacon/ready_timeout": "1000"}}],
    ids=["start_timeout", "beacon-ready_timeout"],
)
def test_a_tower_that_never_answers_is_a_clear_error_in_time(
    tmp_path: Path, bound: dict[str, Any]
) -> None:
    """Whichever bound passes first: one line, no traceback (the beacon's own bound
    ended in one)."""
    nobody = f"tcp://127.0.0.1:{free_port()}"
    document = {"dafka": {"tower_sub_address": nobody, "tower_pub_address": nobody, **bound}}
    result = subprocess.run(
        [str(RAFKA), "-c", str(write(tmp_path / "r.json", document)), "-p", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "rafka: cannot start the dafka engine: " in result.stderr, result.stderr
    assert "no Dafka tower answered within 1 s" in result.stderr, result.stderr


def test_a_store_setting_the_embedded_network_owns_is_one_line(tmp_path: Path) -> None:
    """`store/db` copied from deploy/dafka-stored-*.cfg into `dafka.settings`."""
    document = {"dafka": {"settings": {"store/db": str(tmp_path / "db")}}}
    result = subprocess.run(
        [str(RAFKA), "-c", str(write(tmp_path / "r.json", document)), "-p", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "rafka: cannot start the dafka engine: store settings store/db: set by the embedded"
        " network itself"
    ), result.stderr


def test_acks_of_partitions_that_do_not_exist_are_refused(embedded: RafkaProcess) -> None:
    produce(embedded.port, "p1-acks", ["x"])
    client = redis.Redis(port=embedded.port, client_name="ga:c", socket_timeout=WAIT)
    assert client.blpop(["topics:p1-acks"], 10) is not None
    with pytest.raises(redis.ResponseError, match=r"^CONS Local: Erroneous state$"):
        client.execute_command("RPUSH", "acks", "p1-acks:7:0")
    with pytest.raises(redis.ResponseError, match=r"^CONS Local: Erroneous state$"):
        client.execute_command("RPUSH", "acks", "unknown-topic:0:0")
    assert client.execute_command("RPUSH", "acks", "p1-acks:0:0") == 1
    client.close()


def test_a_member_leaving_hands_its_unacked_records_to_the_group(
    embedded: RafkaProcess,
) -> None:
    produce(embedded.port, "p1-group", [f"m{i}" for i in range(6)])
    first = redis.Redis(port=embedded.port, client_name="grp:one", socket_timeout=WAIT)
    second = redis.Redis(port=embedded.port, client_name="grp:two", socket_timeout=WAIT)
    taken = [first.blpop(["topics:p1-group"], 10) for _ in range(3)]
    assert all(taken), "the first member got the records"
    first.execute_command("RPUSH", "acks", "p1-group:0:0")  # m0 acked, m1 and m2 not
    assert second.blpop(["topics:p1-group"], 0.3) is None, "one partition: one owner"
    first.close()  # the connection goes: its partition and unacked records go to `two`
    again = [second.blpop(["topics:p1-group"], 10) for _ in range(5)]
    assert [reply[-1] for reply in again if reply] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    second.close()


@pytest.fixture
def network(tmp_path: Path) -> Iterator[tuple[Path, list[Program], int, int]]:
    """A tower and two stores of the Dafka programs, loopback only."""
    sub, pub = free_port(), free_port()
    common = tmp_path / "dafka.cfg"
    common.write_text(zpl(sub, pub))
    programs = [Program("dafka-towerd", "-c", str(common))]
    try:
        programs[0].child.wait_line("listening", WAIT)
        for name in ("a", "b"):
            cfg = tmp_path / f"store-{name}.cfg"
            cfg.write_text(zpl(sub, pub, tmp_path / f"db-{name}"))
            store = Program("dafka-stored", "-c", str(cfg))
            store.child.wait_line("dafka-stored: store", WAIT)
            programs.append(store)
        yield common, programs, sub, pub
    finally:
        for program in reversed(programs):
            program.stop()


def joined(tmp_path: Path, sub: int, pub: int, **dafka: object) -> RafkaProcess:
    document = dafka_document(
        tmp_path / "unused",
        tower_sub_address=f"tcp://127.0.0.1:{sub}",
        tower_pub_address=f"tcp://127.0.0.1:{pub}",
        settings={"beacon/address": "127.0.0.1", "beacon/timeout": "2000"},
        **dafka,
    )
    server = RafkaProcess(write(tmp_path / "joined.json", document))
    server.start()
    return server


def test_joined_gateway_serves_a_console_producers_records(
    network: tuple[Path, list[Program], int, int], tmp_path: Path
) -> None:
    common, _, sub, pub = network
    server = joined(tmp_path, sub, pub)
    try:
        producer = Program("dafka-console-producer", "-c", str(common), "console", stdin=True)
        producer.write_lines(["one", "two", "three"])
        producer.close_stdin()
        assert producer.wait_exit(WAIT) == 0, producer.stderr()
        records = consume(server.port, "cg", "console", 3)
        assert [value for _, _, value in records] == [b"one", b"two", b"three"]
        partition = records[0][0]
        assert 2**30 <= partition < 2**31, "a foreign partition: a stable number of its own"
        keys = redis.Redis(port=server.port).keys("topics:")
        assert b"topics:console" in keys
        assert (tmp_path / "unused").exists() is False, "joined mode starts nothing"
    finally:
        server.kill()


def test_joined_with_acks_all_survives_losing_a_store(
    network: tuple[Path, list[Program], int, int], tmp_path: Path
) -> None:
    _, programs, sub, pub = network
    server = joined(tmp_path, sub, pub, acks="all", min_stores=2)
    try:
        produce(server.port, "p1-safe", [f"s{i}" for i in range(100)])
        programs[1].stop(signal.SIGKILL)  # store a: gone, with whatever it held
        records = consume(server.port, "sg", "p1-safe", 100)
        assert [value for _, _, value in records] == [b"s%d" % i for i in range(100)]
    finally:
        server.kill()
