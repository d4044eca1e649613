"""Who owns the processes of `rafka` on the Dafka engine, at start-up: a store that cannot
open its database, and a signal that comes before the gateway listens."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from backends.ports import free_port
from backends.process import Child, spawn
from e2e.helpers import dafka_document
from tests.support.processes import child_running, children, pid_gone
from tests.support.rafka_process import CHILD_ENV, RAFKA, REPO
from tests.support.waiting import wait_until

BOUND = 10.0  # seconds a signalled rafka may take to be gone with its children


def write(path: Path, document: Mapping[str, object]) -> Path:
    path.write_text(json.dumps(document, indent=2))
    return path


def corrupt_store_db(data: Path) -> Path:
    """A data directory whose store-0 database has a CURRENT file RocksDB cannot read."""
    db = data / "store-0" / "db"
    db.mkdir(parents=True)
    (db / "CURRENT").write_text("garbage\n")
    return db


def finished(command: list[str]) -> subprocess.CompletedProcess[str]:
    """`command` run to its end from the repository, as a child of ours (60 s at most)."""
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **CHILD_ENV},
    )


def test_a_corrupt_store_database_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    data = tmp_path / "data"
    db = corrupt_store_db(data)
    config = write(tmp_path / "rafka.json", dafka_document(data))
    result = finished(
        [str(RAFKA), "-c", str(config), "--host", "127.0.0.1", "-p", str(free_port())]
    )
    assert result.returncode == 1, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("rafka:")]
    assert said, f"no 'rafka:' error line: {result.stderr}"
    assert f"cannot open the store DB '{db}'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, (
        "rafka's error for a store that cannot open its DB quotes the store's Python "
        f"traceback:\n{result.stderr[-2500:]}"
    )


def test_dafka_stored_on_a_corrupt_database_says_so_in_one_line(tmp_path: Path) -> None:
    db = corrupt_store_db(tmp_path)
    config = tmp_path / "stored.cfg"
    config.write_text(f"store\n    db = {db}\n")
    nobody = f"tcp://127.0.0.1:{free_port()}"
    stored = [sys.executable, "-m", "backends.dafka.tools.stored", "-c", str(config)]
    result = finished([*stored, "--pub", nobody, "--sub", nobody])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, (
        f"dafka-stored printed a traceback for a corrupt DB:\n{result.stderr[-2500:]}"
    )
    assert result.stderr.startswith(f"dafka-stored: error: cannot open the store DB '{db}'"), (
        result.stderr
    )


def rafka(argv: list[str]) -> Child:
    return spawn(
        [str(RAFKA), *argv, "--host", "127.0.0.1", "-p", str(free_port())],
        name="rafka",
        cwd=REPO,
        env=CHILD_ENV,
        keep_lines=None,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_store_starts_stops_rafka_cleanly(
    sig: signal.Signals, tmp_path: Path
) -> None:
    """docs/gateway.md: "SIGTERM or SIGINT runs the shutdown sequence; the process then
    exits 0" - also before the gateway listens, with no traceback, its children stopped."""
    server = rafka(["--data-dir", str(tmp_path / "data")])
    kids: set[int] = set()
    try:
        wait_until(
            lambda: child_running(server.pid, "backends.dafka.tools.stored"),
            30,
            "rafka to start its store",
        )
        kids = children(server.pid)
        server.send_signal(sig)
        code = server.wait(BOUND)
        wait_until(
            lambda: all(pid_gone(kid) for kid in kids), BOUND, "the tower and store to be gone"
        )
    finally:
        server.kill()
        server.wait(10)
        for kid in kids:
            if not pid_gone(kid):
                os.kill(kid, signal.SIGKILL)
    stderr = "\n".join(server.stderr_lines)
    assert "Traceback" not in stderr, f"{sig.name} during start-up: a traceback:\n{stderr[-2000:]}"
    assert code >= 0, (
        f"{sig.name} during start-up: rafka was killed by the signal ({code}) instead of "
        f"stopping its tower and store and exiting; stderr:\n{stderr[-1500:]}"
    )


def test_ctrl_c_while_waiting_for_the_tower_stops_rafka_promptly(tmp_path: Path) -> None:
    """A joined gateway waits for its tower up to dafka.start_timeout; Ctrl-C meanwhile
    must stop it at once, not when that wait ends."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never speaks ZMTP
    silent.settimeout(30)
    tower = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    document = {
        "dafka": {"tower_sub_address": tower, "tower_pub_address": tower, "start_timeout": 60}
    }
    server = rafka(["-c", str(write(tmp_path / "r.json", document))])
    try:
        connection, _ = silent.accept()  # rafka's beacon connected: it waits for a welcome
        server.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        try:
            server.wait(BOUND)
        except Exception:
            raise AssertionError(
                f"rafka still running {BOUND:g} s after Ctrl-C while it waited for the tower"
            ) from None
        took = time.monotonic() - signalled
        connection.close()
    finally:
        server.kill()
        server.wait(60)
        silent.close()
    stderr = "\n".join(server.stderr_lines)
    assert "Traceback" not in stderr, f"Ctrl-C during start-up: a traceback:\n{stderr[-2000:]}"
    assert took < BOUND
