"""The servers tests, e2e and benches start (redis-server, Tansu, `rafka` with its Dafka
tower and store, an embedded Dafka network) die when their owner dies, even by SIGKILL.

Each case runs a small Python owner that starts real servers through the real helpers of
tests/support, as a test or a bench does, and prints `ready`. The test SIGKILLs the owner
(no cleanup code of it runs) and waits, with a bound, until every process below it is gone.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from backends.process import start
from tests.support.processes import descendants, pid_gone
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]


def growth_reference(engine: str, script: str, *others: str) -> str:
    """An owner running bench/growth.py's reference on `engine` in one shape, ready once
    `script` and what names `others` (the processes it starts) run below it."""
    names = (script, *others)
    return f"""
        import argparse, os, sys, threading
        sys.path.insert(0, os.path.abspath("bench"))
        import growth
        from tests.support.processes import descendants
        from tests.support.waiting import wait_until
        args = argparse.Namespace(
            records=10**9,
            deliveries=10**9,
            bound=3600.0,
            kafka_document={{}},
            dafka_settings={{}},
            partitions=1,
        )
        threading.Thread(target=growth.direct, args=({engine!r}, 1, 1, args), daemon=True).start()
        def all_running():
            # An argument ending with each name: a child forked but not yet exec'd has
            # this owner's command line, which mentions the script too.
            missing = set({[name.encode() for name in names]!r})
            for pid in descendants(os.getpid()):
                try:
                    argv = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")
                except OSError:
                    continue
                missing -= {{name for name in missing for arg in argv if arg.endswith(name)}}
            return not missing
        wait_until(all_running, 120, "{" and ".join(names)} to start")
        """


OWNERS = {
    # The common case: a fixture or a bench starts it on the main thread.
    "redis-server": """
        from tests.support.redis_server import RedisServer
        server = RedisServer()
        server.start()
        assert server.client().ping()
        """,
    # Started on a thread that has ended before the kill: a parent-death signal tied to
    # the forking thread would have killed it then (create_topic checks it still serves).
    "tansu": """
        import threading
        from tests.support.tansu import TansuBroker
        broker = TansuBroker()
        thread = threading.Thread(target=broker.start)
        thread.start()
        thread.join()
        broker.create_topic(1)
        """,
    # The e2e tests' and benches' gateway, on the embedded Dafka engine: rafka, and below
    # it the tower and the store it started.
    "rafka": """
        import tempfile
        from pathlib import Path
        from tests.support.rafka_process import start_rafka
        start_rafka(Path(tempfile.mkdtemp()), {"gateway": {}}, "--engine", "dafka")
        """,
    # A bench's load generator, mid-run (and the redis-server it loads).
    "redis-benchmark": """
        import os, threading
        from tests.support.processes import child_running
        from tests.support.redis_server import RedisServer, redis_benchmark
        server = RedisServer()
        server.start()
        threading.Thread(target=redis_benchmark, args=(server.port, 10**9, "PING_INLINE")).start()
        while child_running(os.getpid(), "redis-benchmark") is None:
            pass
        """,
    # bench/growth.py's references, mid-run: on Kafka the direct client
    # (bench/growth_direct.py) and the Tansu broker it runs against; on Dafka the engine
    # without the gateway (bench/growth_engine.py) and its tower and store.
    "growth-direct": growth_reference("kafka", "growth_direct.py"),
    "growth-engine": growth_reference("dafka", "growth_engine.py", "towerd", "stored"),
    # bench/run.py's latency run: its gateway, and the paced producer it starts with
    # multiprocessing (no helper: it ends when its connection to the dead gateway breaks).
    "bench-producer": """
        import multiprocessing, sys, tempfile
        from pathlib import Path
        import redis
        sys.path.insert(0, "bench")
        import run
        from tests.support.rafka_process import start_rafka
        from tests.support.waiting import wait_until
        _, port = start_rafka(Path(tempfile.mkdtemp()), {"gateway": {}}, "--engine", "dafka")
        context = multiprocessing.get_context("spawn")
        achieved = context.Value("d", 0.0)
        arguments = (port, "owner", 1000, 10**9, achieved)
        context.Process(target=run.paced_produce, args=arguments, daemon=True).start()
        stats = redis.Redis(port=port)
        wait_until(
            lambda: int(stats.hgetall("stats").get(b"producer.delivered.messages", 0)) > 0,
            60,
            "the paced producer to deliver a record",
        )
        """,
    # A Spark session as e2e/test_spark.py and the Spark bench make it: its JVM, and the
    # Python workers a job starts below it (PySpark's own stdin-pipe watch, no helper).
    "spark": """
        from pyspark.sql import SparkSession
        spark = (
            SparkSession.builder.master("local[1]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        assert spark.sparkContext.parallelize(range(10), 1).map(lambda x: x * 2).sum() == 90
        """,
    # The Dafka engine factory's network (tests/support/engines.py).
    "dafka-network": """
        import tempfile
        from pathlib import Path
        from backends.dafka.embedded import EmbeddedNetwork
        EmbeddedNetwork(Path(tempfile.mkdtemp()) / "dafka", stores=1).start()
        """,
}

# What must be running below the owner before the kill: a program's file or module name.
EXPECTED = {
    "redis-server": ["redis-server"],
    "tansu": ["tansu"],
    "rafka": ["rafka", "towerd", "stored"],
    "redis-benchmark": ["redis-benchmark", "redis-server"],
    "bench-producer": ["rafka", "towerd", "stored", "--multiprocessing-fork"],
    "growth-direct": ["tansu", "growth_direct.py"],
    "growth-engine": ["growth_engine.py", "towerd", "stored"],
    "spark": ["java", "pyspark.daemon"],
    "dafka-network": ["towerd", "stored"],
}


MARKS = {
    "tansu": [pytest.mark.kafka],
    "growth-direct": [pytest.mark.kafka],
    "spark": [pytest.mark.slow],
}


def owner_program(setup: str) -> list[str]:
    code = textwrap.dedent(setup) + "print('ready', flush=True)\nimport sys\nsys.stdin.read()\n"
    return [sys.executable, "-c", code]


def runs(program: str, command: str) -> bool:
    """`command` runs `program` (`/usr/bin/<program>` or `python -m <package>.<program>`)."""
    return any(program in (arg, Path(arg).name, arg.rsplit(".", 1)[-1]) for arg in command.split())


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (FileNotFoundError, ProcessLookupError):
        return "(gone)"


@pytest.mark.parametrize(
    "server",
    [pytest.param(name, marks=MARKS.get(name, [])) for name in OWNERS],
)
def test_servers_die_when_their_owner_is_sigkilled(
    server: str, request: pytest.FixtureRequest
) -> None:
    if server in ("tansu", "growth-direct") and request.config.getoption("no_broker"):
        pytest.skip("needs a Kafka broker (--no-broker)")
    owner = start(
        owner_program(OWNERS[server]),
        name=f"owner of {server}",
        ready=r"^ready$",
        timeout=120,
        stdin=True,
        cwd=REPO,
        env={"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable},
    )
    below: set[int] = set()
    try:
        below = descendants(owner.pid)
        running = {pid: command_line(pid) for pid in below}
        for program in EXPECTED[server]:
            assert any(runs(program, line) for line in running.values()), (
                f"no {program} running below the owner: {running}"
            )
        owner.kill()
        assert owner.wait(10) == -signal.SIGKILL
        try:
            wait_until(
                lambda: all(pid_gone(pid) for pid in below),
                30,  # a loaded machine: the JVM takes seconds to exit
                f"the processes the SIGKILLed owner of {server} started to die",
            )
        except AssertionError as late:
            alive = {pid: line for pid, line in running.items() if not pid_gone(pid)}
            raise AssertionError(f"{late}; still running: {alive}") from None
    finally:
        owner.stop()
        for pid in below:  # a failed test must not leave them behind
            if not pid_gone(pid):
                os.kill(pid, signal.SIGKILL)
