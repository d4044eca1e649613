"""`scheduling.py`: the gateway's Dafka threads and its embedded stores run under
SCHED_BATCH (woken, they do not preempt its event loop), the loop itself does not, and
`threads/batch = 0` keeps the default. Read from /proc, as `chrt -p` reads it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import zmq

from backends.dafka.config import Config
from backends.dafka.scheduling import SETTING, io_threads_as_batch, run_as_batch
from tests.dafka.test_engine import engine_on, network, run
from tests.support.rafka_process import RafkaProcess
from tests.support.waiting import wait_until

__all__ = ["network"]  # the fixture, used by name

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")

SCHED_OTHER = 0


def policy(tid: int, pid: int | None = None) -> int:
    """The scheduling policy of thread `tid` of process `pid` (this one by default)."""
    stat = Path(f"/proc/{pid or os.getpid()}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[38])  # field 41, `policy`


def threads(pid: int) -> dict[int, str]:
    """Thread id -> name (comm) of every thread of `pid`."""
    named: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            named[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:  # ended meanwhile
            continue
    return named


def test_a_thread_that_runs_as_batch_passes_it_on_and_leaves_its_starter_alone() -> None:
    seen: dict[str, int] = {}

    def helper() -> None:
        assert run_as_batch()
        seen["helper"] = os.sched_getscheduler(0)
        child = threading.Thread(target=lambda: seen.update(child=os.sched_getscheduler(0)))
        child.start()
        child.join()

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert seen == {"helper": os.SCHED_BATCH, "child": os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == SCHED_OTHER, "the starting thread changed policy"


def test_zmq_io_threads_start_as_batch_only_when_asked() -> None:
    def io_threads(context: zmq.Context) -> dict[int, int]:
        before = set(threads(os.getpid()))
        sock = context.socket(zmq.PAIR)  # the context's threads start with its first socket
        sock.close()

        def started() -> dict[int, int]:
            # An I/O thread takes its policy, then its name, once it runs: named, it is set.
            new = threads(os.getpid()).items()
            return {
                tid: policy(tid)
                for tid, name in new
                if tid not in before and name.startswith("ZMQbg/IO")
            }

        return wait_until(started, 10, "the context's I/O threads to start")

    asked = zmq.Context()
    plain = zmq.Context()
    try:
        assert io_threads_as_batch(asked)
        batch = io_threads(asked)
        default = io_threads(plain)
    finally:
        asked.term()
        plain.term()
    assert batch and set(batch.values()) == {os.SCHED_BATCH}, batch
    assert default and set(default.values()) == {SCHED_OTHER}, default


ENGINE_ACTORS = {"dafka-publisher", "dafka-reader", "dafka-observer"}


def actor_policies() -> dict[str, int]:
    """Policy of each of the engine's actor threads in this process, by thread name (the
    test's own store runs here too, with the default)."""
    return {
        thread.name: policy(thread.native_id)
        for thread in threading.enumerate()
        if thread.name in ENGINE_ACTORS and thread.native_id is not None
    }


def test_the_engines_actors_run_as_batch_and_its_loop_does_not(network: Config) -> None:
    async def body() -> None:
        async with engine_on(network) as engine:
            producer = engine.producer("s")
            producer.produce("t", None, b"v")  # the publisher's thread starts with it
            assert await producer.flush(10) == 0
            actors = actor_policies()
            assert set(actors) == ENGINE_ACTORS
            assert set(actors.values()) == {os.SCHED_BATCH}, actors
            assert os.sched_getscheduler(0) == SCHED_OTHER, "the event loop's thread"

    run(body())


def test_threads_batch_0_keeps_the_default_policy(network: Config) -> None:
    async def body() -> None:
        settings = dict(network.items()) | {SETTING: "0"}
        async with engine_on(network, settings=settings) as engine:
            producer = engine.producer("s")
            producer.produce("t", None, b"v")
            assert await producer.flush(10) == 0
            actors = actor_policies()
            assert set(actors) == ENGINE_ACTORS
            assert set(actors.values()) == {SCHED_OTHER}, actors

    run(body())


def test_a_gateways_store_and_zmq_threads_run_as_batch_its_loop_not(tmp_path: Path) -> None:
    config = tmp_path / "rafka.json"
    config.write_text(json.dumps({"gateway": {"data_dir": str(tmp_path / "data")}}))
    gateway = RafkaProcess(config)
    gateway.start()
    try:
        assert gateway.child is not None
        pid = gateway.child.popen.pid
        assert policy(pid, pid) == SCHED_OTHER, "the gateway's event loop"
        named = threads(pid)
        zmq_threads = {tid: policy(tid, pid) for tid, name in named.items() if "ZMQ" in name}
        assert zmq_threads and set(zmq_threads.values()) == {os.SCHED_BATCH}, zmq_threads
        store = store_pid(pid)
        store_threads = {tid: policy(tid, store) for tid in threads(store)}
        assert set(store_threads.values()) == {os.SCHED_BATCH}, store_threads
    finally:
        gateway.kill()


def store_pid(gateway: int) -> int:
    """The embedded dafka-stored of the gateway `gateway` (running: it answers PING only
    once its engine has started)."""
    for task in Path(f"/proc/{gateway}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            if b"backends.dafka.tools.stored" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    raise AssertionError(f"rafka {gateway} runs no dafka-stored")
