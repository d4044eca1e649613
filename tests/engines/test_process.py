"""backends.process: readiness, bounded stop, reaping, and children dying with their parent."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from backends.process import Child, ProcessError, _die_with, spawn, start
from tests.support.processes import pid_gone
from tests.support.waiting import wait_until

PY = sys.executable


def python(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


# Prints on both streams, then runs until its stdin closes.
TALKER = python(
    """
    import sys
    print("loading config", file=sys.stderr, flush=True)
    print("listening on 1234", flush=True)
    sys.stdin.read()
    """
)


def test_a_ready_line_is_matched_and_the_output_kept_per_stream() -> None:
    child = start(TALKER, name="talker", stdin=True, ready=r"listening on (\d+)", timeout=20)
    try:
        assert child.ready is not None and child.ready.group(1) == "1234"
        assert child.stdout_lines == ["listening on 1234"]
        assert child.wait_line("config", 5, stream="stderr").group() == "config"
        assert child.wait_lines(1, 5, "stderr") == ["loading config"]
        with pytest.raises(ProcessError, match=r"printed 1 of 2 lines on stdout within 0\.2 s"):
            child.wait_lines(2, 0.2)
        child.close_stdin()
        assert child.wait(10) == 0
    finally:
        child.stop()


def test_a_probe_decides_readiness(tmp_path: Path) -> None:
    marker = tmp_path / "ready"
    code = "import pathlib, sys; pathlib.Path(sys.argv[1]).touch(); sys.stdin.read()"
    child = start([PY, "-c", code, str(marker)], stdin=True, ready=marker.exists, timeout=20)
    try:
        assert child.ready is None and child.running
    finally:
        child.stop()
    assert child.returncode == -signal.SIGTERM


def test_not_ready_in_time_names_the_program_the_bound_and_what_it_printed() -> None:
    exits: list[Child] = []
    with pytest.raises(ProcessError) as caught:
        start(
            TALKER,
            name="slowpoke",
            stdin=True,
            ready="accepting",
            timeout=1.5,
            on_exit=exits.append,
        )
    message = str(caught.value)
    assert "slowpoke (pid " in message
    assert "printed no line matching 'accepting' within 1.5 s" in message
    assert "| loading config" in message and "| listening on 1234" in message
    # start() stopped it: reaped, so no zombie is left behind.
    assert len(exits) == 1 and exits[0].returncode == -signal.SIGTERM
    assert pid_gone(exits[0].pid)


def test_a_child_that_exits_before_it_is_ready_is_reported_with_its_status() -> None:
    argv = python("import sys; print('cannot bind: address in use'); sys.exit(3)")
    with pytest.raises(ProcessError, match=r"exited \(exit code 3\) before printing 'ready'"):
        start(argv, name="binder", ready="ready", timeout=20)
    probe_failed = spawn(argv, name="binder")
    with pytest.raises(ProcessError, match=r"exited \(exit code 3\) before it was ready") as e:
        probe_failed.wait_ready(lambda: False, 20)
    assert "| cannot bind: address in use" in str(e.value)


def test_a_program_that_does_not_exist_fails_at_once() -> None:
    with pytest.raises(ProcessError, match=r"cannot start no-such-program .*No such file"):
        spawn(["/nonexistent/no-such-program"])


def test_stop_escalates_to_sigkill_within_its_bound_and_reaps() -> None:
    stubborn = python(
        """
        import signal, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        sys.stdin.read()
        """
    )
    child = start(stubborn, stdin=True, ready="ignoring", timeout=20)
    began = time.monotonic()
    assert child.stop(timeout=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - began < 3
    with pytest.raises(ChildProcessError):  # already reaped: not a zombie of ours
        os.waitpid(child.pid, os.WNOHANG)
    assert child.stop() == -signal.SIGKILL, "a second stop changes nothing"


def test_a_child_that_dies_on_its_own_is_reaped_and_reported() -> None:
    exited = threading.Event()
    child = spawn(python("import sys; sys.exit(7)"), on_exit=lambda _: exited.set())
    assert exited.wait(20), "on_exit was not called"
    assert child.returncode == 7 and not child.running
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)


# Started by the test: spawns a TCP listener from a thread, lets that thread end, and reports
# once the kernel has released the thread (the parent-death signal, if it were tied to this
# thread, would have been sent before that).
PARENT = """
import json, sys, threading, time
from pathlib import Path
from backends.process import spawn

LISTENER = '''
import socket
server = socket.create_server(("127.0.0.1", 0))
print("port", server.getsockname()[1], flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(b"alive")
    connection.close()
'''
spawned = {}

def spawn_from_this_thread():
    spawned["tid"] = threading.get_native_id()
    child = spawn([sys.executable, "-c", LISTENER], name="listener")
    spawned["port"] = int(child.wait_line(r"port (\\d+)", 20).group(1))
    spawned["pid"] = child.pid

thread = threading.Thread(target=spawn_from_this_thread)
thread.start()
thread.join()
task = Path(f"/proc/self/task/{spawned['tid']}")
deadline = time.monotonic() + 10
while task.exists() and time.monotonic() < deadline:
    time.sleep(0.005)
print(json.dumps({"pid": spawned["pid"], "port": spawned["port"], "gone": not task.exists()}),
      flush=True)
sys.stdin.read()
"""


def test_children_outlive_the_spawning_thread_but_not_the_parent_process() -> None:
    parent = start([PY, "-c", PARENT], name="parent", stdin=True, ready=r"^\{", timeout=30)
    listener: int | None = None
    try:
        assert parent.ready is not None
        report = json.loads(parent.ready.string)
        listener = report["pid"]
        assert report["gone"], "the spawning thread did not end"
        try:
            with socket.create_connection(("127.0.0.1", report["port"]), timeout=5) as connection:
                answer = connection.recv(16)
        except OSError as error:
            answer = str(error).encode()
        assert answer == b"alive", f"the child died with its spawning thread: {answer!r}"
        parent.kill()
        assert parent.wait(10) == -signal.SIGKILL
        wait_until(lambda: pid_gone(report["pid"]), 5, "the child outlived its SIGKILLed parent")
    finally:
        parent.stop()
        if listener is not None and not pid_gone(listener):
            os.kill(listener, signal.SIGKILL)


def test_a_child_whose_parent_died_before_the_prctl_kills_itself() -> None:
    # _die_with runs between fork and exec; told that its parent is another process, the
    # child behaves as if its parent had died in that window: it must never run the program.
    child = subprocess.Popen(
        [PY, "-c", "print('the program ran')"],
        stdout=subprocess.PIPE,
        preexec_fn=lambda: _die_with(-1),
    )
    out, _ = child.communicate(timeout=20)
    assert child.returncode == -signal.SIGKILL
    assert out == b""
