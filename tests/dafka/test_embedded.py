"""The embedded Dafka network: a real dafka-towerd and dafka-stored as child processes."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.dafka.config import Config
from backends.dafka.consumer import Consumer
from backends.dafka.embedded import (
    TOWER,
    DataDirError,
    DataDirLocked,
    EmbeddedNetwork,
    EmbeddedNetworkError,
)
from backends.dafka.producer import Producer
from backends.process import start
from tests.support.processes import listening_addresses, pid_gone
from tests.support.waiting import wait_until

STORE = "dafka-stored-0"
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2
FAST = {"beacon/interval": 100}  # stores discover producers within 100 ms


@pytest.fixture
def network(tmp_path: Path) -> Iterator[EmbeddedNetwork]:
    network = EmbeddedNetwork(tmp_path / "data", store_settings=FAST)
    network.start()
    try:
        yield network
    finally:
        network.stop()


def actor_config(network: EmbeddedNetwork) -> Config:
    config = network.config
    config.set("beacon/interval", 100)
    config.set("producer/head_interval", 100)
    config.set("consumer/offset/reset", "earliest")
    return config


def produce_acknowledged(network: EmbeddedNetwork, topic: str, count: int) -> str:
    """Publish `count` records and close the producer once a store acknowledged them all;
    returns the partition (the producer's address)."""
    producer = Producer(actor_config(network), topic)
    for i in range(count):
        producer.publish(f"{topic}-{i}".encode())
    assert producer.close(timeout=20) == 0, "no store acknowledged every record"
    return producer.address


def consume(network: EmbeddedNetwork, topic: str, count: int) -> list[tuple[str, bytes]]:
    """`count` records of `topic` read by a new earliest consumer (no producer is left, so
    they come from a store)."""
    consumer = Consumer(actor_config(network))
    try:
        consumer.subscribe(topic)
        got: list[tuple[str, bytes]] = []
        for _ in range(count):
            record = consumer.get(timeout=20)
            assert record is not None, f"the consumer got only {len(got)} of {count} records"
            got.append((record.partition, record.content))
        return got
    finally:
        consumer.close()


def test_actors_exchange_stored_records_and_stop_leaves_no_child(tmp_path: Path) -> None:
    network = EmbeddedNetwork(tmp_path / "data", store_settings=FAST)
    network.start()
    try:
        pids = network.pids()
        assert set(pids) == {TOWER, STORE}
        for name, pid in pids.items():
            addresses = listening_addresses(pid)
            assert addresses, f"{name} listens on nothing"
            assert {host for host, _ in addresses} == {"127.0.0.1"}, f"{name}: {addresses}"
        assert (tmp_path / "data" / "store-0" / "db" / "CURRENT").exists()

        partition = produce_acknowledged(network, "orders", 20)
        expected = [(partition, f"orders-{i}".encode()) for i in range(20)]
        assert consume(network, "orders", 20) == expected
    finally:
        network.stop()
    assert network.pids() == {}
    assert [pid for pid in pids.values() if not pid_gone(pid)] == []
    network.stop()  # idempotent


def test_a_second_network_on_the_same_directory_fails_at_once(
    network: EmbeddedNetwork, tmp_path: Path
) -> None:
    running = network.pids()
    with pytest.raises(DataDirLocked) as caught:
        EmbeddedNetwork(network.data_dir).start()
    assert str(caught.value) == (
        f"Dafka data directory {network.data_dir} is in use by another rafka process "
        f"(pid {os.getpid()}); stop it or give this one another data directory"
    )
    assert network.pids() == running, "the refused network disturbed the running one"

    # Another directory: another network, on other ports.
    with EmbeddedNetwork(tmp_path / "other") as other:
        assert other.config.get("beacon/pub_address") != network.config.get("beacon/pub_address")
        assert other.config.get("beacon/sub_address") != network.config.get("beacon/sub_address")

    network.stop()
    with EmbeddedNetwork(network.data_dir) as again:  # the lock went with the first network
        assert set(again.pids()) == {TOWER, STORE}


def test_a_data_directory_that_cannot_be_created_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    network = EmbeddedNetwork(tmp_path / "file" / "data")
    with pytest.raises(DataDirError) as caught:
        network.start()
    assert str(caught.value) == (
        f"cannot create the Dafka data directory {tmp_path}/file/data: Not a directory"
    )
    assert network.pids() == {}


def obey_file_modes() -> None:
    """Between fork and exec: drop the capabilities that let root write anywhere, so the
    program obeys file modes as any other user does."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_data_directory_fails_clearly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o555)
    attempt = textwrap.dedent(
        """
        import sys
        from backends.dafka.embedded import EmbeddedNetwork, DataDirError
        try:
            EmbeddedNetwork(sys.argv[1]).start()
        except DataDirError as error:
            print(error)
        """
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", attempt, str(data)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=obey_file_modes if os.geteuid() == 0 else None,
        )
    except subprocess.SubprocessError:
        pytest.skip("root cannot drop CAP_DAC_OVERRIDE here, so every directory is writable")
    finally:
        data.chmod(0o755)
    assert result.stdout.strip() == (
        f"cannot write in the Dafka data directory {data}: Permission denied"
    ), result.stderr
    assert list(data.iterdir()) == []


def test_store_settings_reach_the_stores_and_owned_ones_are_refused(tmp_path: Path) -> None:
    network = EmbeddedNetwork(tmp_path / "data", store_settings={"store/sync": "often"})
    with pytest.raises(EmbeddedNetworkError) as caught:
        network.start()
    message = str(caught.value)
    assert f"embedded Dafka network on {tmp_path}/data did not start: {STORE}" in message
    assert "config store/sync = 'often' is not an integer" in message
    assert network.pids() == {}
    with EmbeddedNetwork(tmp_path / "data"):  # the failed start released the directory
        pass

    with pytest.raises(ValueError, match="store settings store/db: set by the embedded network"):
        EmbeddedNetwork(tmp_path, store_settings={"store/db": "/elsewhere"})
    with pytest.raises(ValueError, match="at least 1 store"):
        EmbeddedNetwork(tmp_path, stores=0)


def test_a_killed_store_is_restarted_and_still_serves_its_records(
    network: EmbeddedNetwork, caplog: pytest.LogCaptureFixture
) -> None:
    partition = produce_acknowledged(network, "payments", 50)
    killed = network.pids()[STORE]
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: network.restarts == 1, 20, "the killed store was not restarted")
    assert network.pids()[STORE] != killed
    assert pid_gone(killed)
    logged = caplog.text
    assert "embedded dafka child exited; restarting" in logged
    assert f"pid={killed}" in logged and "status='killed by SIGKILL'" in logged

    # One store, no producer left: the restarted store serves everything from its database.
    expected = [(partition, f"payments-{i}".encode()) for i in range(50)]
    assert consume(network, "payments", 50) == expected


def test_a_killed_tower_comes_back_on_the_same_ports(network: EmbeddedNetwork) -> None:
    before = network.config
    killed = network.pids()[TOWER]
    store = network.pids()[STORE]
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: network.restarts == 1, 20, "the killed tower was not restarted")
    assert network.config == before
    assert network.pids()[STORE] == store, "the store needed no restart"
    # The store found the new tower by itself: it acknowledges a new producer's records.
    partition = produce_acknowledged(network, "after-tower", 5)
    assert consume(network, "after-tower", 5)[-1] == (partition, b"after-tower-4")


def test_a_store_that_cannot_come_back_is_retried_ever_later_until_it_can(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with EmbeddedNetwork(tmp_path / "data", restart_backoff=(0.05, 0.2)) as network:
        settings = tmp_path / "data" / "store-0" / "stored.cfg"
        good = settings.read_text()
        settings.write_text(good + "store\n    sync = often\n")
        os.kill(network.pids()[STORE], signal.SIGKILL)
        wait_until(lambda: caplog.text.count("restart_in=0.2") >= 2, 30, "no crash loop at the cap")
        delays = re.findall(r"restart_in=([\d.]+)", caplog.text)
        assert delays[:4] == ["0.05", "0.1", "0.2", "0.2"]
        assert "status='exit code 1'" in caplog.text
        assert "dafka-stored: error: config store/sync = 'often' is not an integer" in caplog.text
        assert network.restarts == 0

        settings.write_text(good)
        wait_until(lambda: network.restarts == 1, 30, "the store did not come back once fixed")
        assert set(network.pids()) == {TOWER, STORE}


OWNER = """
import json, sys
from backends.dafka.embedded import EmbeddedNetwork
network = EmbeddedNetwork(sys.argv[1], stores=2)
network.start()
print(json.dumps(network.pids()), flush=True)
sys.stdin.read()
"""


def test_tower_and_stores_die_with_their_owner(tmp_path: Path) -> None:
    data = tmp_path / "data"
    owner = start([sys.executable, "-c", OWNER, str(data)], name="owner", stdin=True, ready=r"^\{")
    pids: dict[str, int] = {}
    try:
        assert owner.ready is not None
        pids = json.loads(owner.ready.string)
        assert set(pids) == {TOWER, "dafka-stored-0", "dafka-stored-1"}
        owner.kill()
        assert owner.wait(10) == -signal.SIGKILL
        wait_until(
            lambda: all(pid_gone(pid) for pid in pids.values()),
            5,
            f"children outlived their SIGKILLed owner: {pids}",
        )
    finally:
        owner.stop()
        for pid in pids.values():
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
    # The kernel released the dead owner's lock: the directory is usable at once.
    with EmbeddedNetwork(data, stores=2) as network:
        assert len(network.pids()) == 3


def test_async_start_and_stop_leave_the_event_loop_free(tmp_path: Path) -> None:
    async def scenario() -> tuple[dict[str, int], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            async with EmbeddedNetwork(tmp_path / "data") as network:
                during_start = ticks
                pids = network.pids()
        finally:
            ticker.cancel()
        return pids, during_start

    pids, ticks = asyncio.run(scenario())
    assert set(pids) == {TOWER, STORE}
    assert ticks >= 5, "the event loop was blocked while the network started"
    assert all(pid_gone(pid) for pid in pids.values())


def test_cancelling_an_async_start_stops_what_it_started(tmp_path: Path) -> None:
    network = EmbeddedNetwork(tmp_path / "data")

    async def scenario() -> dict[str, int]:
        starting = asyncio.create_task(network.start_async())
        while not network.pids():  # the tower is spawned: the start is under way
            await asyncio.sleep(0.005)
        seen = network.pids()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        return seen

    seen = asyncio.run(scenario())
    assert network.pids() == {}
    assert all(pid_gone(pid) for pid in seen.values())
    with EmbeddedNetwork(tmp_path / "data"):  # and released the directory
        pass
