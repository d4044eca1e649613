"""The Dafka programs (spec §7, §9) as real processes on loopback: dafka-towerd,
dafka-stored, dafka-console-producer/-consumer, dafka-perf-store/-consumer."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from backends.dafka.tools import (
    console_consumer,
    console_producer,
    perf_consumer,
    perf_store,
    stored,
    towerd,
)
from backends.process import ProcessError, spawn

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    """A tool run as `python -m backends.dafka.tools.<name>` (dies with the test run)."""

    def __init__(self, name: str, *args: str, stdin: bytes | None = None) -> None:
        self.name = name
        self.child = spawn(
            [sys.executable, "-m", f"backends.dafka.tools.{name}", *args],
            name=name,
            env={"PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdin=True,
            keep_lines=None,
        )
        if stdin is not None:
            self.child.write(stdin)
        self.child.close_stdin()
        self._read = 0  # stdout lines handed out by line()

    @property
    def stderr_lines(self) -> list[str]:
        return self.child.stderr_lines

    def line(self, timeout: float) -> str:
        """The next stdout line."""
        self._read += 1
        return self.child.wait_lines(self._read, timeout)[self._read - 1]

    def stderr_match(self, pattern: str, timeout: float) -> re.Match[str]:
        return self.child.wait_line(pattern, timeout, stream="stderr")

    def wait(self, timeout: float) -> int:
        try:
            return self.child.wait(timeout)
        except ProcessError:
            self.child.stop(0)
            raise AssertionError(f"{self.name} did not exit; stderr: {self.stderr_lines}") from None

    def stop(self, timeout: float = 10) -> int:
        self.child.terminate()
        return self.wait(timeout)


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tower = Proc("towerd", "--pub", "tcp://127.0.0.1:*", "--sub", "tcp://127.0.0.1:*")
        match = self.tower.stderr_match(r"listening sub=(\S+) pub=(\S+)", 10)
        self.sub, self.pub = match.group(1), match.group(2)
        self.config = tmp / "dafka.cfg"
        self.config.write_text(
            "beacon\n"
            "    address = 127.0.0.1\n"
            f"    sub_address = {self.sub}\n"
            f"    pub_address = {self.pub}\n"
            "    interval = 100\n"
            "store\n"
            f"    db = {tmp / 'storedb'}\n"
        )
        self.store = Proc("stored", "-c", str(self.config))
        self.store.stderr_match(r"dafka-stored: store [0-9A-F]{32} reader [0-9A-F]{32}", 15)

    def close(self) -> None:
        codes = {"stored": self.store.stop(), "towerd": self.tower.stop()}
        assert codes == {"stored": 0, "towerd": 0}, "servers must stop cleanly on SIGTERM"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("dafka-tools"))
    yield cluster
    cluster.close()


def test_console_producer_to_store_to_console_consumer(cluster: Cluster) -> None:
    producer = Proc(
        "console_producer",
        "-c",
        str(cluster.config),
        "greetings",
        stdin=b"one\ntwo\r\n\nthree with spaces\n",
    )
    # Exit 0 only once a store acknowledged every line (C's infinite linger).
    assert producer.wait(30) == 0, producer.stderr_lines
    consumer = Proc("console_consumer", "greetings", "--from-beginning", "-c", str(cluster.config))
    lines = [consumer.line(20) for _ in range(4)]
    partition = lines[0].split(" ")[1]
    assert re.fullmatch(r"[0-9A-F]{32}", partition)
    assert lines == [
        f"greetings {partition} one",
        f"greetings {partition} two",
        f"greetings {partition} ",  # the empty line is an empty record
        f"greetings {partition} three with spaces",
    ]
    assert consumer.stop() == 0


def test_perf_store_and_perf_consumer_report(cluster: Cluster, tmp_path: Path) -> None:
    # Earliest, so that the consumer gets all 2000 records however late it subscribes.
    earliest = tmp_path / "earliest.cfg"
    earliest.write_text(
        cluster.config.read_text() + "consumer\n    offset\n        reset = earliest\n"
    )
    consumer = Proc("perf_consumer", "-c", str(earliest), "2000", "64")
    store = Proc("perf_store", "-c", str(cluster.config), "2000", "64")
    assert store.wait(60) == 0, store.stderr_lines
    assert consumer.wait(60) == 0, consumer.stderr_lines
    store_lines = [store.line(1) for _ in range(5)]
    assert store_lines[0] == "Done publishing"
    consumer_lines = [consumer.line(1) for _ in range(5)]
    assert consumer_lines[0] == "Received first"
    for lines in (store_lines[1:], consumer_lines[1:]):
        assert lines[:2] == ["message size: 64 [B]", "message count: 2000"]
        msgs = re.fullmatch(r"mean throughput: (\d+) \[msg/s\]", lines[2])
        mbits = re.fullmatch(r"mean throughput: (\d+\.\d{3}) \[Mb/s\]", lines[3])
        assert msgs and mbits, lines
        assert int(msgs.group(1)) > 0
        assert float(mbits.group(1)) == pytest.approx(int(msgs.group(1)) * 64 * 8 / 1e6, abs=1e-3)


def test_paced_timestamped_records_give_latency_percentiles(cluster: Cluster) -> None:
    # 2000 records at 2000/s; the consumer (latest) needs only 500 of them, so joining
    # during the first half of the run is enough.
    consumer = Proc("perf_consumer", "-c", str(cluster.config), "--latency", "500", "100")
    store = Proc(
        "perf_store", "-c", str(cluster.config), "--rate", "2000", "--timestamp", "2000", "100"
    )
    assert store.wait(60) == 0, store.stderr_lines
    assert consumer.wait(60) == 0, consumer.stderr_lines
    store_lines = [store.line(1) for _ in range(5)]
    paced = re.fullmatch(r"mean throughput: (\d+) \[msg/s\]", store_lines[3])
    assert paced, store_lines
    assert 1000 < int(paced.group(1)) <= 2000, "--rate did not pace publishing"
    lines = [consumer.line(1) for _ in range(10)]
    assert lines[0] == "Received first"
    assert lines[1:3] == ["message size: 100 [B]", "message count: 500"]
    names = ["p50", "p90", "p99", "p99.9", "max"]
    figures = [
        re.fullmatch(rf"latency {name}: (\d+) \[us\]", line)
        for name, line in zip(names, lines[5:], strict=True)
    ]
    assert all(figures), lines
    micros = [int(m.group(1)) for m in figures if m]
    assert micros == sorted(micros), "percentiles must not decrease"
    assert 0 < micros[-1] < 10_000_000, "a latency is not a plausible delay"


def test_console_producer_without_tower_fails_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "none.cfg"
    config.write_text(
        "beacon\n    address = 127.0.0.1\n    ready_timeout = 200\n"
        "    sub_address = inproc://nowhere-sub\n    pub_address = inproc://nowhere-pub\n"
    )
    producer = Proc("console_producer", "-c", str(config), "t", stdin=b"x\n")
    assert producer.wait(20) == 1
    assert any(
        "dafka-console-producer: error: no Dafka tower answered within 0.2 s" in line
        for line in producer.stderr_lines
    ), producer.stderr_lines


# --- in-process: options and user errors (no sockets) ---------------------------------------


@pytest.fixture(autouse=True)
def keep_structlog_config() -> Iterator[None]:
    """The programs configure logging for their process; undo that for the test process."""
    saved = structlog.get_config()
    yield
    structlog.reset_defaults()
    structlog.configure(**saved)


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (towerd, ["-c config", "--pub tower-pub-address", "--sub tower-sub-address", "--verbose"]),
        (stored, ["-c config", "--pub tower-pub-address", "--verbose"]),
        (console_producer, ["-c config", "topic"]),
        (console_consumer, ["--from-beginning", "topic"]),
        (perf_store, ["count", "size"]),
    ],
)
def test_help_lists_the_options(
    module: object, expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert module.main(["--help"]) == 0  # type: ignore[attr-defined]
    usage = capsys.readouterr().out
    assert all(option in usage for option in expected), usage


def test_usage_errors_and_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert console_producer.main([]) == 2
    assert "the following arguments are required: topic" in capsys.readouterr().err
    assert perf_store.main(["0", "10"]) == 2
    assert "count must be >= 1" in capsys.readouterr().err
    assert perf_store.main(["--timestamp", "10", "4"]) == 2
    assert "--timestamp needs size >= 8" in capsys.readouterr().err
    bad = tmp_path / "bad.cfg"
    bad.write_text("tower\n  pub_address = x\n")
    assert towerd.main(["-c", str(bad)]) == 1
    assert "bad.cfg:2: indentation must be a multiple of 4" in capsys.readouterr().err
    assert towerd.main(["--pub", "tcp://127.0.0.1:notaport", "--sub", "tcp://127.0.0.1:*"]) == 1
    assert "cannot bind 'tcp://127.0.0.1:notaport' from tower/pub_address" in (
        capsys.readouterr().err
    )


def test_publish_all_stamps_each_record_with_its_publish_time() -> None:
    published: list[bytes] = []
    before = time.monotonic_ns()
    perf_store.publish_all(published.append, 50, 100, rate=0, timestamp=True)
    after = time.monotonic_ns()
    assert [len(record) for record in published] == [100] * 50
    stamps = [perf_store.STAMP.unpack_from(record)[0] for record in published]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= after
    assert all(record[8:] == bytes(92) for record in published)


def test_latency_percentiles_are_nearest_rank() -> None:
    ordered = list(range(1, 1001))
    assert [perf_consumer.percentile(ordered, p) for p in (50, 99, 99.9, 100)] == [
        500,
        990,
        999,
        1000,
    ]
    assert perf_consumer.percentile([7], 50) == 7
