"""Child processes that are ready before they are used, stop within a bound, and die with
their parent.

    child = start([sys.executable, "-m", "backends.dafka.tools.towerd"],
                  name="dafka-towerd", ready=r"listening sub=(\\S+) pub=(\\S+)", timeout=30)
    ...
    child.stop(timeout=10)   # SIGTERM, then SIGKILL after 10 s; always reaped

Dying with the parent (Linux): every child runs `prctl(PR_SET_PDEATHSIG, SIGKILL)` between
fork and exec, then checks that its parent is still the process that forked it (if the
parent died before the prctl, no signal would ever come, so the child kills itself).
PDEATHSIG fires when the *thread* that forked the child exits, not the process: a child
forked from an `asyncio.to_thread` worker, or from a gateway event loop running in a
non-main thread (`gateway.runner.ServerThread`), would be killed when that thread ends.
So no caller forks: every spawn runs on one process-wide spawner thread that lives as long
as the process, whichever thread calls `spawn()`. On other systems children are started
without that guarantee.

Each child gets one watcher thread that reads its stdout and stderr line by line (so it
never blocks on a full pipe), reaps it the moment it exits (a pidfd tells when; no zombie
is left), then runs the `on_exit` callback. Children start in their own process group, so
a Ctrl-C in a terminal reaches only the parent, which stops its children in its own order.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import itertools
import os
import queue
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

Ready = str | re.Pattern[str] | Callable[[], object]
"""What `wait_ready` waits for: a regular expression searched in each output line, or a
probe called until it returns something truthy (e.g. "the port accepts a connection")."""

STREAMS = ("stdout", "stderr")
KILL_TIMEOUT = 5.0  # seconds to wait for the reap after SIGKILL (only a D-state hangs longer)
_TAIL = 20  # lines quoted in error messages
_PR_SET_PDEATHSIG = 1
_PROBE_INTERVAL = 0.02  # seconds between two calls of a readiness probe
_DRAIN = 1.0  # seconds to read what a child left in its pipes after its exit
_SIGKILL = int(signal.SIGKILL)


class ProcessError(RuntimeError):
    """A child did not start, was not ready in time, or would not die."""


def describe_exit(returncode: int) -> str:
    """`exit code 1` or `killed by SIGKILL`: what a log line or an error should say."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


# --- dying with the parent -----------------------------------------------------------------


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved once in the parent: the code between fork and exec must not load libraries.
_prctl = _load_prctl()


def _die_with(parent_pid: int) -> None:
    """Runs in the child between fork and exec (so: no locks, no imports, no allocations
    worth mentioning). An exception here makes Popen raise in the parent."""
    if _prctl is None:
        return
    if _prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        # The parent died between fork and prctl: the signal we asked for will never come.
        os.kill(os.getpid(), _SIGKILL)


class _Spawner:
    """The one thread that forks every child (see the module docstring for why)."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], Any], concurrent.futures.Future[Any]]
        ] = queue.SimpleQueue()
        # Daemon: it must not keep the interpreter alive; it ends with the process, and
        # only then do the children get their SIGKILL.
        self._thread = threading.Thread(target=self._run, name="process-spawner", daemon=True)
        self._thread.start()

    def call(self, function: Callable[[], Any]) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._requests.put((function, future))
        return future.result()

    def _run(self) -> None:
        while True:
            function, future = self._requests.get()
            try:
                future.set_result(function())
            except BaseException as error:
                future.set_exception(error)


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawner_thread() -> _Spawner:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        return _spawner


def _forget_spawner() -> None:
    # A forked copy of this process has no spawner thread, only the parent's object.
    global _spawner, _spawner_lock
    _spawner = None
    _spawner_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


# --- the child -------------------------------------------------------------------------------


class Child:
    """A running child process (made by `spawn` or `start`); thread-safe.

    Output: `stdout_lines` / `stderr_lines` keep the last `keep_lines` lines of each stream
    (all of them with `keep_lines=None`), without the line break.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        name: str,
        argv: Sequence[str],
        keep_lines: int | None,
        on_line: Callable[[Child, str, str], None] | None,
        on_exit: Callable[[Child], None] | None,
    ) -> None:
        self.popen = popen
        self.name = name
        self.argv = list(argv)
        self.pid: int = popen.pid
        self.started_at = time.monotonic()
        self._on_line = on_line
        self._on_exit = on_exit
        self._changed = threading.Condition()
        self._lines: dict[str, collections.deque[str]] = {
            stream: collections.deque(maxlen=keep_lines) for stream in STREAMS
        }
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
        # Every line in order, so that a readiness wait can resume where it stopped.
        self._log: collections.deque[tuple[str, str]] = collections.deque(maxlen=keep_lines)
        self._count = 0
        self._printed = dict.fromkeys(STREAMS, 0)
        self._terminated = False
        self.ready: re.Match[str] | None = None  # what `start` matched
        self._exited = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"watch-{name}", daemon=True)
        self._watcher.start()

    # --- state ---------------------------------------------------------------------------

    @property
    def returncode(self) -> int | None:
        """None while running (or not reaped yet); negative: the signal that killed it."""
        return self.popen.returncode if self._exited.is_set() else None

    @property
    def running(self) -> bool:
        return not self._exited.is_set()

    @property
    def stdout_lines(self) -> list[str]:
        with self._changed:
            return list(self._lines["stdout"])

    @property
    def stderr_lines(self) -> list[str]:
        with self._changed:
            return list(self._lines["stderr"])

    def tail(self, lines: int = _TAIL) -> str:
        """The last output lines of both streams, for error messages."""
        with self._changed:
            kept = list(self._tail)[-lines:]
        return "\n".join(f"  | {line}" for line in kept) if kept else "  (no output)"

    def __repr__(self) -> str:
        state = "running" if self.running else describe_exit(self.popen.returncode)
        return f"<Child {self.name} pid={self.pid} {state}>"

    # --- waiting -------------------------------------------------------------------------

    def wait_line(
        self, pattern: str | re.Pattern[str], timeout: float, stream: str | None = None
    ) -> re.Match[str]:
        """The first line (since the start, of `stream` or of both) that `pattern` matches
        (re.search). Raises ProcessError naming the program, the pattern, the bound and the
        last output if no such line comes within `timeout` s or the child exits first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        scanned = 0
        with self._changed:
            while True:
                start = max(0, scanned - (self._count - len(self._log)))
                for source, line in itertools.islice(self._log, start, None):
                    if stream in (None, source) and (match := regex.search(line)):
                        return match
                scanned = self._count
                self._wait_for_output(
                    deadline,
                    exited=f"before printing {regex.pattern!r}",
                    late=f"printed no line matching {regex.pattern!r} within {timeout:g} s",
                )

    def wait_lines(self, count: int, timeout: float, stream: str = "stdout") -> list[str]:
        """The kept lines of `stream` once it has printed at least `count` lines.
        ProcessError naming the program, the count and the bound if the child exits or
        `timeout` s pass first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while (printed := self._printed[stream]) < count:
                self._wait_for_output(
                    deadline,
                    exited=f"after {printed} of {count} lines on {stream}",
                    late=f"printed {printed} of {count} lines on {stream} within {timeout:g} s",
                )
            return list(self._lines[stream])

    def _wait_for_output(self, deadline: float, *, exited: str, late: str) -> None:
        """Holding `_changed`: wait for more output, or raise saying what did not come
        (`exited`: after the exit status, if the child exited; `late`: past `deadline`)."""
        if self._exited.is_set():
            raise self._error(f"exited ({self._status()}) {exited}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._error(late)
        self._changed.wait(remaining)

    def wait_ready(self, ready: Ready, timeout: float) -> re.Match[str] | None:
        """Wait until the child is ready: a line matching `ready` (returned), or `ready()`
        truthy (None returned). ProcessError as in `wait_line`, also when it exits first."""
        if isinstance(ready, (str, re.Pattern)):
            return self.wait_line(ready, timeout)
        deadline = time.monotonic() + timeout
        while not ready():
            if self._exited.is_set():
                raise self._error(f"exited ({self._status()}) before it was ready")
            if time.monotonic() >= deadline:
                raise self._error(f"was not ready within {timeout:g} s")
            self._exited.wait(_PROBE_INTERVAL)  # a probe can only be polled
        return None

    def wait(self, timeout: float | None = None) -> int:
        """Wait until the child has exited and been reaped; its return code. ProcessError
        naming the program and the bound when it is still running after `timeout` s."""
        if not self._exited.wait(timeout):
            raise self._error(f"is still running after {timeout:g} s")
        return self.popen.returncode

    # --- input and signals ---------------------------------------------------------------

    def write(self, data: bytes) -> None:
        stdin = self._stdin()
        stdin.write(data)
        stdin.flush()

    def close_stdin(self) -> None:
        self._stdin().close()

    def send_signal(self, sig: int) -> None:
        """Signal the child unless it has already been reaped (its pid may be reused)."""
        with self._changed:
            if self.popen.returncode is None:
                os.kill(self.pid, sig)  # alive or a zombie: the pid is still the child's

    def terminate(self) -> None:
        """SIGTERM, once; `stop` waits for the effect."""
        with self._changed:
            if self._terminated:
                return
            self._terminated = True
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, up to `timeout` s for the exit, then SIGKILL; returns the return code
        once the child is reaped (at most `timeout` + KILL_TIMEOUT s). Idempotent."""
        self.terminate()
        if not self._exited.wait(max(0.0, timeout)):
            self.kill()
            if not self._exited.wait(KILL_TIMEOUT):
                raise self._error(f"did not die within {KILL_TIMEOUT:g} s of SIGKILL")
        self._watcher.join(KILL_TIMEOUT)
        return self.popen.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals -----------------------------------------------------------------------

    def _stdin(self) -> IO[bytes]:
        if self.popen.stdin is None:
            raise ProcessError(f"{self.name} was started without stdin=True")
        return self.popen.stdin

    def _status(self) -> str:
        return describe_exit(self.popen.returncode)

    def _error(self, what: str) -> ProcessError:
        return ProcessError(
            f"{self.name} (pid {self.pid}) {what}; last output:\n{self.tail()}\n"
            f"  command: {' '.join(self.argv)}"
        )

    def _add(self, stream: str, raw: bytes) -> None:
        line = raw.decode(errors="replace")
        with self._changed:
            self._lines[stream].append(line)
            self._tail.append(line)
            self._log.append((stream, line))
            self._count += 1
            self._printed[stream] += 1
            self._changed.notify_all()
        if self._on_line is not None:
            self._on_line(self, stream, line)

    def _watch(self) -> None:
        selector = selectors.DefaultSelector()
        partial: dict[int, bytes] = {}
        for stream in STREAMS:
            pipe = getattr(self.popen, stream)
            if pipe is not None:
                selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
                partial[pipe.fileno()] = b""
        pidfd = _pidfd_open(self.pid)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ, None)
        exited_at: float | None = None
        try:
            while partial or (pidfd is not None and exited_at is None):
                timeout = None
                if exited_at is not None:
                    # What is left in the pipes is read briefly: a grandchild holding them
                    # open must not delay the exit announcement for ever.
                    timeout = exited_at + _DRAIN - time.monotonic()
                    if timeout <= 0:
                        break
                for key, _ in selector.select(timeout):
                    if key.data is None:  # the pidfd: the child is a zombie now
                        selector.unregister(key.fd)
                        self._reap()
                        exited_at = time.monotonic()
                        continue
                    data = os.read(key.fd, 65536)
                    if data:
                        *lines, partial[key.fd] = (partial[key.fd] + data).split(b"\n")
                        for line in lines:
                            self._add(key.data, line)
                        continue
                    selector.unregister(key.fd)
                    if rest := partial.pop(key.fd):
                        self._add(key.data, rest)
            if exited_at is None:
                # No pidfd: the pipes closed; wait for the exit without reaping, then reap.
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
                self._reap()
        finally:
            selector.close()
            if pidfd is not None:
                os.close(pidfd)
            for stream in STREAMS:
                pipe = getattr(self.popen, stream)
                if pipe is not None:
                    pipe.close()
            with self._changed:
                self._exited.set()
                self._changed.notify_all()
        if self._on_exit is not None:
            self._on_exit(self)

    def _reap(self) -> None:
        # Under the lock: send_signal must never signal a pid that was reaped (and so may
        # already belong to another process).
        with self._changed:
            self.popen.wait()


def _pidfd_open(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:  # kernel before 5.3, or a seccomp filter
        return None
    return fd


def spawn(
    argv: Sequence[str],
    *,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: bool = False,
    keep_lines: int | None = 1000,
    on_line: Callable[[Child, str, str], None] | None = None,
    on_exit: Callable[[Child], None] | None = None,
) -> Child:
    """Start `argv` as a child that dies with this process (see the module docstring).

    `env` is added to this process's environment; `stdin=True` gives a pipe (`write`,
    `close_stdin`), else /dev/null. `on_line(child, stream, line)` and `on_exit(child)` run
    on the child's watcher thread: keep them short. `name` (default: the program's file
    name) is what logs and errors call it. Safe to call from any thread.
    """
    argv = [os.fspath(arg) for arg in argv]
    label = name or Path(argv[0]).name
    environment = {**os.environ, **env} if env is not None else None
    parent = os.getpid()

    def fork() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            cwd=cwd,
            process_group=0,
            preexec_fn=lambda: _die_with(parent),
        )

    try:
        popen: subprocess.Popen[bytes] = _spawner_thread().call(fork)
    except (OSError, subprocess.SubprocessError) as error:
        raise ProcessError(f"cannot start {label} ({' '.join(argv)}): {error}") from error
    return Child(popen, label, argv, keep_lines, on_line, on_exit)


def start(
    argv: Sequence[str],
    *,
    ready: Ready | None = None,
    timeout: float = 30.0,
    stop_timeout: float = 5.0,
    **options: Any,
) -> Child:
    """`spawn`, then `wait_ready(ready, timeout)`; on failure the child is stopped (within
    `stop_timeout` s) and ProcessError raised. The readiness match, if any, is `child.ready`."""
    child = spawn(argv, **options)
    try:
        child.ready = child.wait_ready(ready, timeout) if ready is not None else None
    except BaseException:
        child.stop(stop_timeout)
        raise
    return child
