"""Faults under the gateway, with real processes: the embedded Dafka store killed under
load (the gateway restarts it), a full or read-only data directory, and the Kafka broker
stopped and restarted under load. What must hold: a DUMP answers 0 only for records that
are stored (they are consumable afterwards), and answers within its bound meanwhile."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from backends.ports import free_port
from e2e.helpers import WAIT, DafkaDeployment, Producing, dafka_document, drain, produce
from tests.support.processes import child_running, pid_gone
from tests.support.rafka_process import RAFKA, RafkaProcess, write_config
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until

STORE = "backends.dafka.tools.stored"
# KEYS with the broker down: Rafka's metadata error with librdkafka's cause.
METADATA_DOWN = (
    r"^Error getting metadata: Local: "
    r"(Broker transport failure|All broker connections are down|Timed out)$"
)


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[RafkaProcess]:
    server = RafkaProcess(DafkaDeployment().write_config(tmp_path / "rafka.json"))
    server.start()
    yield server
    server.kill()


def store_pid(server: RafkaProcess) -> int:
    assert server.child is not None
    pid = server.child.pid
    found = wait_until(
        lambda: child_running(pid, STORE), WAIT, "the gateway runs no dafka-stored child"
    )
    assert found is not None
    return found


def kill_store(server: RafkaProcess) -> int:
    """SIGKILL the gateway's store; returns once it is dead."""
    pid = store_pid(server)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid_gone(pid), WAIT, f"store {pid} still runs after SIGKILL")
    return pid


def test_store_killed_under_load_is_restarted_and_loses_no_dumped_record(
    embedded: RafkaProcess,
) -> None:
    topic = DafkaDeployment().new_topic(2)
    producing = Producing(embedded.port, topic, "s", dump_ms=1000)
    producing.start()
    probe = redis.Redis(port=embedded.port, socket_timeout=WAIT)
    try:
        for round_ in range(3):
            before = producing.batches
            wait_until(lambda b=before: producing.batches >= b + 5, WAIT, "no batch produced")  # type: ignore[misc]
            killed = kill_store(embedded)
            # The store is down (its restart waits 0.1 s, then a process starts): a DUMP
            # meanwhile answers within its bound, and not 0.
            assert probe.execute_command("RPUSHX", f"topics:{topic}", f"probe{round_}") == 1
            started = time.monotonic()
            assert probe.execute_command("DUMP", "100") == 1, "DUMP counted an unstored record"
            assert time.monotonic() - started < 2, "DUMP overran its 100 ms bound"
            restarted = wait_until(
                lambda k=killed: (p := store_pid(embedded)) != k and p,  # type: ignore[misc]
                WAIT,
                f"the gateway did not restart its store (round {round_})",
            )
            assert restarted != killed
            # The restarted store fetches what it missed: the probe becomes durable.
            assert probe.execute_command("DUMP", str(int(WAIT * 1000))) == 0
            confirmed = len(producing.confirmed)
            wait_until(
                lambda c=confirmed: len(producing.confirmed) > c,  # type: ignore[misc]
                WAIT,
                f"no DUMP answered 0 after the store restarted (round {round_})",
            )
    finally:
        producing.stopping.set()
        producing.join(WAIT)
        probe.close()
    assert not producing.is_alive(), "the producer is stuck"
    assert not producing.errors, producing.errors[:3]
    assert producing.slowest_dump < 1 + 2, f"a DUMP took {producing.slowest_dump:.1f}s"
    wanted = {*producing.confirmed, b"probe0", b"probe1", b"probe2"}
    got = drain(embedded.port, "after-store-kills", topic, wanted)
    missing = wanted - set(got)
    assert not missing, f"{len(missing)} DUMP-confirmed records lost: {sorted(missing)[:5]}"
    assert "embedded dafka child restarted" in embedded.stderr()


# --- the Kafka engine: the broker stopped and restarted under load ------------------------


@pytest.mark.kafka
def test_broker_restarted_under_load_answers_errors_then_recovers(tmp_path: Path) -> None:
    broker = TansuBroker()  # this test's own: it stops it
    broker.start()
    server = RafkaProcess(write_config(tmp_path / "rafka.json", broker.bootstrap))
    producing: Producing | None = None
    try:
        topic = broker.create_topic(2)
        server.start()
        assert server.child is not None
        pid = server.child.pid
        consumer = redis.Redis(port=server.port, client_name="outage:c", socket_timeout=WAIT)
        producing = Producing(server.port, topic, "k", dump_ms=1000)
        producing.start()
        wait_until(lambda: len(producing.confirmed) >= 40, WAIT, "no batch confirmed")
        assert consumer.blpop([f"topics:{topic}"], 10) is not None, "no record before"

        broker.stop()
        # Tansu keeps records in memory: what it confirmed is gone with it (it has no
        # persistent storage engine here), so only what is confirmed later is checked.
        gone_with_broker = len(producing.confirmed)
        before = producing.batches
        wait_until(lambda: producing.batches >= before + 3, WAIT, "the producer hangs")
        assert producing.unconfirmed >= 2, "DUMP answered 0 with the broker down"
        assert len(producing.confirmed) == gone_with_broker, "DUMP confirmed with no broker"
        with pytest.raises(redis.ResponseError, match=METADATA_DOWN):
            consumer.keys("topics:")
        assert consumer.blpop([f"topics:{topic}"], 1) is None, "a record from no broker"

        broker.start()  # on the same port, empty
        broker.create_topic(2, name=topic)
        wait_until(
            lambda: len(producing.confirmed) > gone_with_broker + 40,
            60,
            "the gateway did not recover once the broker was back",
        )
        producing.stopping.set()
        producing.join(WAIT)
        assert not producing.is_alive(), "the producer is stuck"
        wanted = set(producing.confirmed[gone_with_broker:])
        got = drain(server.port, "outage", topic, wanted, client=consumer)
        assert server.child.pid == pid and server.child.running, "the gateway restarted"
    finally:
        if producing is not None:
            producing.stopping.set()
            producing.join(WAIT)
        server.kill()
        broker.stop()
    missing = wanted - set(got)
    assert not missing, f"{len(missing)} DUMP-confirmed records lost: {sorted(missing)[:5]}"
    assert not producing.errors, producing.errors[:3]
    assert producing.slowest_dump < 1 + 2, f"a DUMP took {producing.slowest_dump:.1f}s"


# --- a full or read-only data directory ---------------------------------------------------


def own_filesystem(directory: Path, options: str) -> list[str]:
    """A wrapper for RafkaProcess: rafka runs in a user and mount namespace of its own,
    with a tmpfs mounted (`options`, e.g. `size=16m`) on `directory`; no root needed where
    unprivileged user namespaces are allowed, and nothing outlives the process."""
    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"'
    unshare = ["unshare", "--user", "--map-root-user", "--mount"]
    return [*unshare, "sh", "-c", script, "sh", options, str(directory)]


@pytest.fixture(scope="module")
def namespaces() -> None:
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    if probe.returncode != 0:
        # Filling a real filesystem needs root (a loop device) or a namespace of our own.
        pytest.skip(f"no user namespaces here (unshare: {probe.stderr.decode().strip()})")


def test_full_data_directory_counts_nothing_as_stored(namespaces: None, tmp_path: Path) -> None:
    data = tmp_path / "rafka-data"
    data.mkdir()
    config = tmp_path / "rafka.json"
    config.write_text(json.dumps(dafka_document(data)))
    server = RafkaProcess(config, wrapper=own_filesystem(data, "size=16m"))
    server.start()
    assert server.child is not None
    client = redis.Redis(port=server.port, socket_timeout=WAIT, retry=Retry(NoBackoff(), 0))
    try:
        before = [f"b{i}" for i in range(50)]
        produce(server.port, "p1-full", before)
        # The tmpfs is visible in the process's own mount namespace only.
        filler = Path(f"/proc/{server.child.pid}/root") / data.relative_to("/") / "filler"
        with pytest.raises(OSError) as full, filler.open("wb") as out:
            for _ in range(16 * 16 + 1):  # 64 KiB at a time: more than the 16 MiB
                out.write(b"\0" * 65536)
                out.flush()
        assert full.value.errno == errno.ENOSPC
        # Records larger than a page: none fits in what the log file's last page has left.
        big = [b"%d" % i + b"x" * 8192 for i in range(20)]
        assert client.execute_command("RPUSHX", "topics:p1-full", *big) == 20
        started = time.monotonic()
        assert client.execute_command("DUMP", "1000") == 20, "DUMP counted unstored records"
        assert time.monotonic() - started < 1 + 2, "DUMP overran its bound"
        wait_until(
            lambda: "No space left on device" in server.stderr(),
            WAIT,
            "the gateway's log does not say the data directory is full",
        )
        assert client.ping()
        # Space back: this store's RocksDB keeps refusing writes (documented); a restarted
        # store (the gateway restarts it) fetches the records again and stores them.
        filler.unlink()
        kill_store(server)
        assert client.execute_command("DUMP", str(int(WAIT * 1000))) == 0, server.stderr()
        wanted = {v.encode() for v in before} | set(big)
        got = drain(server.port, "full", "p1-full", wanted)
    finally:
        client.close()
        server.kill()
    assert wanted <= set(got), f"lost: {len(wanted - set(got))} records"


def test_read_only_data_directory_is_a_clear_error_at_start(
    namespaces: None, tmp_path: Path
) -> None:
    data = tmp_path / "rafka-data"
    data.mkdir()
    port = free_port()
    result = subprocess.run(
        [*own_filesystem(data, "ro,size=1m"), str(RAFKA), "--data-dir", str(data), "-p", str(port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "cannot start the dafka engine" in result.stderr
    assert f"{data}: Read-only file system" in result.stderr, result.stderr
