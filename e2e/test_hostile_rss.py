"""Hostile clients against a real `rafka` process (the embedded Dafka engine): its
resident memory stays bounded, every hostile client is closed or stalled within its
bound, and a well-behaved client's PINGs are answered promptly throughout.

The clients: pipeliners that never read their replies, slow-loris clients trickling a
partial command, oversized bulks and argument counts, a MONITOR that never reads while
big commands run, and a crowd of idle connections up to max_clients.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.helpers import dafka_document
from tests.support.gateway import Raw
from tests.support.rafka_process import RafkaProcess
from tests.support.waiting import wait_until

FLOODERS = 10
LORISES = 10
MAX_CLIENTS = 200
IDLE = MAX_CLIENTS - 1 - FLOODERS - LORISES  # with the bystander: the gateway is full
PARTIAL_TIMEOUT = 3.0
# Growth of the process's resident memory allowed for all of the above together. Each
# flooder may hold ~320 KiB of unsent replies, one read (256 KiB) and the parsed
# commands of that read (~4 MB of Python objects for COMMAND DOCS lines); the monitor
# its 1 MB queue and one batch. Without the reply batching one flooder alone held 47 MB.
RSS_GROWTH_BOUND = 120 * 1024 * 1024
PROMPT = 2.0  # a bystander's PING, on a machine shared by many test runs


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def ping_time(raw: Raw) -> float:
    started = time.monotonic()
    raw.command("PING")
    raw.expect(b"+PONG\r\n")
    return time.monotonic() - started


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RafkaProcess]:
    document = dafka_document(tmp_path / "data")
    gateway = document["gateway"]
    assert isinstance(gateway, dict)
    gateway.update(
        max_clients=MAX_CLIENTS,
        partial_command_timeout=PARTIAL_TIMEOUT,
        monitor_queue_bytes=1_000_000,
    )
    path = tmp_path / "rafka.json"
    path.write_text(json.dumps(document))
    process = RafkaProcess(path)
    process.start()
    yield process
    process.kill()


class Flooder:
    """Pipelines COMMAND DOCS without ever reading; `stalled` is set once the gateway
    stops reading it (a send makes no progress for 0.5 s)."""

    def __init__(self, port: int) -> None:
        self.raw = Raw(port)
        self.raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.raw.sock.settimeout(0.5)
        self.stalled = threading.Event()
        self.thread = threading.Thread(target=self._flood, daemon=True)
        self.thread.start()

    def _flood(self) -> None:
        block = b"COMMAND DOCS\r\n" * 20_000
        try:
            for _ in range(100):  # at most 28 MB
                self.raw.sock.sendall(block)
        except TimeoutError:
            self.stalled.set()
        except OSError:
            pass

    def close(self) -> None:
        self.raw.close()
        self.thread.join(5)


def test_hostile_clients_leave_memory_bounded_and_others_served(
    server: RafkaProcess,
) -> None:
    assert server.child is not None
    pid = server.child.pid
    with Raw(server.port) as bystander:
        bystander.command("COMMAND", "DOCS")  # warm up what a flood will use
        bystander.read_reply()
        baseline = rss(pid)
        worst = peak = 0.0

        def sample() -> None:
            nonlocal worst, peak
            worst = max(worst, ping_time(bystander))
            peak = max(peak, rss(pid))

        idle: list[Raw] = []
        lorises: list[Raw] = []
        flooders = [Flooder(server.port) for _ in range(FLOODERS)]
        try:
            # Oversized bulk and argument counts: refused at the header.
            for header in (b"*1\r\n$999999999999\r\n", b"*99999999\r\n"):
                with Raw(server.port) as oversized:
                    oversized.send(header)
                    assert oversized.read_line() in (b"-Invalid bulk size\r\n", b"-TooManyArg\r\n")
                    oversized.assert_closed()
            # A monitor that never reads, while big commands run.
            with Raw(server.port) as watcher, Raw(server.port) as sender:
                watcher.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                watcher.command("MONITOR")
                watcher.expect(b"+OK\r\n")
                for _ in range(60):  # 12 MB of monitor lines
                    sender.command("PING", b"m" * 200_000)
                    sender.expect(b"+PONG\r\n")
                    sample()
            # Slow-loris clients start a command; an idle crowd fills up to max_clients
            # and one more is refused as Redis does.
            lorises.extend(Raw(server.port) for _ in range(LORISES))
            for loris in lorises:
                loris.send(b"*2\r\n$4\r\nPING\r\n$1000\r\n")
            idle.extend(Raw(server.port) for _ in range(IDLE))
            with Raw(server.port) as refused:
                refused.expect(b"-ERR max number of clients reached\r\n")
                refused.assert_closed()

            def flooders_stalled() -> bool:
                sample()
                return all(f.stalled.is_set() for f in flooders)

            wait_until(flooders_stalled, 60, "the gateway to stop reading every flooder")
            # Slow loris: a byte every 0.25 s; each is cut PARTIAL_TIMEOUT after its start.
            started = time.monotonic()
            open_lorises = list(lorises)
            while open_lorises:
                assert time.monotonic() - started < PARTIAL_TIMEOUT + 10, "a loris lived on"
                for loris in list(open_lorises):
                    try:
                        loris.send(b"x")
                    except OSError:
                        open_lorises.remove(loris)
                sample()
                time.sleep(0.25)  # the lorises' pace, not a synchronisation
            for _ in range(10):
                sample()
        finally:
            for client in [*idle, *lorises]:
                client.close()
            for flooder in flooders:
                flooder.close()
        growth = peak - baseline
        print(
            f"\nrafka RSS: baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB "
            f"(+{growth / 2**20:.1f} MiB) with {FLOODERS} non-reading pipeliners, {LORISES} "
            f"lorises, {IDLE} idle clients, a stalled monitor; worst bystander PING "
            f"{worst * 1000:.0f} ms"
        )
        assert growth < RSS_GROWTH_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB"
        assert worst < PROMPT, f"a bystander's PING took {worst:.2f}s"
        assert ping_time(bystander) < PROMPT


KEYS = 200
KEY_SIZE = 1024 * 1024  # well under max_bulk_length (32,768,000)


def test_large_keys_are_not_kept_once_their_records_are_stored_and_the_client_left(
    server: RafkaProcess,
) -> None:
    """200 keyed RPUSHX, each with a key of its own of 1 MiB, DUMPed, then the client
    leaves: the gateway's cache of parsed RPUSHX keys (4,096 entries whatever their size)
    and the Dafka engine's cache of writers by (topic, key) kept each key, ~2 MiB a key,
    407 MiB here (with keys of 32 MB, up to 256 GiB). Keys over 1 KiB are not cached."""
    assert server.child is not None
    pid = server.child.pid
    with Raw(server.port, timeout=60) as raw:
        raw.command("RPUSHX", "topics:p4-keys:warm-up", "w")
        assert raw.read_reply() == 1
        raw.command("DUMP", "10000")
        assert raw.read_reply() == 0
    before = rss(pid)
    with Raw(server.port, timeout=120) as raw:
        for n in range(KEYS):
            raw.command("RPUSHX", b"topics:p4-keys:" + (b"%07d" % n) * (KEY_SIZE // 7), b"v")
            assert raw.read_reply() == 1
        raw.command("DUMP", "30000")
        assert raw.read_reply() == 0, "every record stored"
    # What is freed is given back at once (1 MiB objects are mmap'ed): the growth falls
    # under the bound once the connection's session is released.
    wait_until(
        lambda: rss(pid) - before < RSS_GROWTH_BOUND,
        5,
        f"the gateway still holds over {RSS_GROWTH_BOUND >> 20} MiB more once {KEYS} keyed "
        "RPUSHX of 1 MiB keys were stored and their connection closed",
    )
