"""The Dafka programs as separate processes on 127.0.0.1: a tower, two stores, a console
producer and console consumers. A store is SIGKILLed mid-stream and restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from rocksdict import AccessType, Options, Rdict

from tests.support.tansu import free_port
from tests.waiting import wait_until

BIN = Path(sys.executable).parent


def zpl(tower_sub: int, tower_pub: int, db: Path | None = None) -> str:
    """A ZPL config on loopback only: nothing ever connects to another interface."""
    text = (
        "beacon\n"
        "    interval = 100\n"
        "    timeout = 2000\n"
        f"    sub_address = tcp://127.0.0.1:{tower_sub}\n"
        f"    pub_address = tcp://127.0.0.1:{tower_pub}\n"
        "    address = 127.0.0.1\n"
        "tower\n"
        f"    sub_address = tcp://127.0.0.1:{tower_sub}\n"
        f"    pub_address = tcp://127.0.0.1:{tower_pub}\n"
        "producer\n"
        "    head_interval = 100\n"
    )
    if db is not None:
        text += f"store\n    db = {db}\n"
    return text


class Program:
    """A Dafka program whose stdout lines are collected by a reader thread."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        # stderr is drained too: a program blocked on a full pipe would look like a hang.
        self._errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines)),
            threading.Thread(target=self._read, args=(self.process.stderr, self._errors)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    @staticmethod
    def _read(stream: IO[bytes] | None, sink: list[str]) -> None:
        assert stream is not None
        for raw in stream:
            sink.append(raw.decode(errors="replace").rstrip("\n"))

    def write_lines(self, lines: list[str]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("".join(f"{line}\n" for line in lines).encode())
        self.process.stdin.flush()

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.args[0]} did not exit within {timeout}s") from None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stderr(self) -> str:
        """What the program logged so far (for failure messages)."""
        return "\n".join(self._errors) or "(nothing on stderr)"


def stored_heads(db: Path, topic: str) -> list[int] | None:
    """Head sequences of `topic` in a store's database, read without disturbing the store
    (RocksDB read-only mode takes no lock); None while the database cannot be opened yet."""
    if not (db / "CURRENT").exists():
        return None
    prefix = b"H" + topic.encode() + b"\0"
    try:
        store = Rdict(str(db), options=Options(raw_mode=True), access_type=AccessType.read_only())
    except Exception:  # rocksdict raises plain Exception, e.g. a WAL rotated while opening
        return None
    try:
        heads = []
        for key, value in store.items(from_key=prefix):
            if not (isinstance(key, bytes) and key.startswith(prefix)):
                break  # head keys of one subject are adjacent (spec §5.2)
            heads.append(int.from_bytes(value, "big"))
        return heads
    finally:
        store.close()


def contents(consumer: Program) -> list[str]:
    """The content column of the console consumer's `subject address content` lines."""
    return [line.split(" ", 2)[2] for line in list(consumer.lines)]


@pytest.fixture
def network(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A tower, and one config file per store (each with its own db)."""
    tower_sub, tower_pub = free_port(), free_port()
    common = tmp_path / "dafka.cfg"
    common.write_text(zpl(tower_sub, tower_pub))
    store_a = tmp_path / "store-a.cfg"
    store_a.write_text(zpl(tower_sub, tower_pub, tmp_path / "db-a"))
    store_b = tmp_path / "store-b.cfg"
    store_b.write_text(zpl(tower_sub, tower_pub, tmp_path / "db-b"))
    tower = Program("dafka-towerd", "-c", str(common))
    try:
        yield common, store_a, store_b
    finally:
        tower.stop()


@pytest.mark.slow
def test_store_killed_mid_stream_loses_nothing_and_backfills_after_restart(
    network: tuple[Path, Path, Path],
) -> None:
    common, a_cfg, b_cfg = network
    topic = "e2e-orders"
    expected = [f"record-{i:05d}" for i in range(2000)]
    programs: list[Program] = []
    try:
        store_a = Program("dafka-stored", "-c", str(a_cfg))
        store_b = Program("dafka-stored", "-c", str(b_cfg))
        consumer = Program("dafka-console-consumer", topic, "--from-beginning", "-c", str(common))
        producer = Program("dafka-console-producer", "-c", str(common), topic, stdin=True)
        programs += [store_a, store_b, consumer, producer]

        db_a, db_b = (Path(cfg.read_text().split("db = ")[1].strip()) for cfg in (a_cfg, b_cfg))
        last = len(expected) - 1

        producer.write_lines(expected[:1000])
        wait_until(lambda: len(consumer.lines) >= 500, 30, "consumer got < 500 of the first half")
        store_a.stop(signal.SIGKILL)
        killed_at = stored_heads(db_a, topic)
        assert killed_at is not None and len(killed_at) <= 1 and all(h < 1000 for h in killed_at)
        producer.write_lines(expected[1000:])
        wait_until(lambda: len(consumer.lines) >= 2000, 30, "consumer did not get all 2000")
        assert contents(consumer) == expected, "records lost, duplicated or out of order"
        wait_until(
            lambda: stored_heads(db_b, topic) == [last], 30, "store B did not store all 2000"
        )
        # The producer exits only once a store acknowledged every record; B did.
        producer.close_stdin()
        assert producer.wait_exit(30) == 0, producer.stderr()

        # Store A restarts on its data directory, behind by the records sent while it was
        # dead, with no producer left to HEAD the partition: it learns the head from store
        # B's reader (hello handshake / GET_HEADS) and FETCHes the rest from it.
        store_a = Program("dafka-stored", "-c", str(a_cfg))
        programs.append(store_a)
        wait_until(
            lambda: stored_heads(db_a, topic) == [last],
            30,
            f"restarted store A did not back-fill from {killed_at} to {last} without a producer",
        )

        # B goes away: a consumer started after the producer exited reads everything from A
        # alone, so A holds the whole partition, in order.
        store_b.stop()
        late = Program("dafka-console-consumer", topic, "--from-beginning", "-c", str(common))
        programs.append(late)
        wait_until(lambda: len(late.lines) >= 2000, 30, "late consumer did not get all 2000")
        assert contents(late) == expected, "the restarted store lost or reordered records"
    finally:
        for program in reversed(programs):
            program.stop()
