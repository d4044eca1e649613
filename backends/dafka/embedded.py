"""The gateway's embedded Dafka network: one `dafka-towerd` and N `dafka-stored` as child
processes on 127.0.0.1, over one data directory, supervised.

    network = EmbeddedNetwork("/var/lib/rafka", stores=1, store_settings={
        "store/retention/ms": 7 * 24 * 3600 * 1000,
    })
    await network.start_async()          # or network.start() from any thread
    producer = Producer(network.config, "orders")   # actors in this process join with it
    ...
    await network.stop_async()

Data directory layout (see the README, "Embedded network"):

    rafka.lock          flock()ed while a network runs; holds the owner's pid
    store-0/stored.cfg  the store's ZPL settings (rewritten at every start)
    store-0/db/         its RocksDB
    store-1/...

Ports: the tower binds `tcp://127.0.0.1:*` twice, so the kernel picks two free ports at
bind time (no probe-then-bind race: two networks on one machine cannot collide); they are
read from the tower's "listening" line. A restarted tower binds the same two ports again,
so the stores and the gateway's actors reconnect to it by themselves. The stores bind their
data sockets to ephemeral ports on 127.0.0.1 and announce them through the tower, so a
restarted store may come back on other ports.

Threads: `start()`, `stop()` block and may be called from any thread (they never fork on
the caller's thread, see `backends.process`), e.g. through `asyncio.to_thread`, which is
what `start_async()` / `stop_async()` do. Supervision runs on its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import queue
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import structlog

from backends.dafka.config import Config, ConfigError
from backends.process import Child, ProcessError, describe_exit, spawn

log = structlog.get_logger(__name__)

TOWER = "dafka-towerd"
LOCK_FILE = "rafka.lock"
HOST = "127.0.0.1"
TOWER_READY = r"listening sub=tcp://[^,\s]+:(\d+) pub=tcp://[^,\s]+:(\d+)"
STORE_READY = r"dafka-stored: store [0-9A-F]{32} reader [0-9A-F]{32}"
# Settings the network decides for every store; the rest of a store's config is the caller's.
OWNED_SETTINGS = ("store/db", "beacon/address", "beacon/sub_address", "beacon/pub_address")
STABLE_AFTER = 10.0  # seconds a child must have run for its death not to count as a crash loop
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class EmbeddedNetworkError(RuntimeError):
    """The embedded network could not start (or was stopped while starting)."""


class DataDirError(EmbeddedNetworkError):
    """The data directory cannot be created or written."""


class DataDirLocked(DataDirError):
    """Another embedded network (another gateway) holds the data directory."""


class _Stopping(Exception):
    """Internal: stop() was called while a child was about to be started."""


def store_name(index: int) -> str:
    return f"dafka-stored-{index}"


class EmbeddedNetwork:
    """A tower and `stores` stores as child processes, bound to 127.0.0.1 only.

    `store_settings` are zconfig paths passed through to every store's config (retention
    `store/retention/ms|bytes`, `store/topics/<t>/retention/...`, `store/sync`,
    `beacon/interval`, ...); the paths in OWNED_SETTINGS are the network's and refused.
    A child that dies is restarted on the same data directory (and, for the tower, the
    same ports) after a backoff doubling from `restart_backoff[0]` up to
    `restart_backoff[1]` seconds while it keeps dying within STABLE_AFTER s.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        stores: int = 1,
        store_settings: Mapping[str, str | int] | None = None,
        ready_timeout: float = 30.0,
        restart_backoff: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        if isinstance(stores, bool) or not isinstance(stores, int) or stores < 1:
            raise ValueError(f"an embedded Dafka network needs at least 1 store, not {stores!r}")
        try:
            settings = Config(store_settings)
        except ConfigError as error:
            raise ValueError(f"store settings: {error}") from None
        owned = [path for path, _ in settings.items() if path in OWNED_SETTINGS]
        owned += [path for path, _ in settings.items() if path.startswith("tower/")]
        if owned:
            raise ValueError(
                f"store settings {', '.join(owned)}: set by the embedded network itself"
            )
        self._data_dir = Path(data_dir).absolute()
        self._stores = stores
        self._settings = settings
        self._ready_timeout = ready_timeout
        self._backoff = restart_backoff
        self._lock = threading.Lock()  # guards _state, _children, _stopping with spawns
        self._state = "new"  # new -> starting -> running -> stopping -> stopped
        self._children: dict[str, Child] = {}
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._shutdown_lock = threading.Lock()
        self._dir_lock: int | None = None
        self._tower_ports: tuple[int, int] | None = None
        self._deaths: queue.SimpleQueue[tuple[str, Child | None] | None] = queue.SimpleQueue()
        self._supervisor: threading.Thread | None = None
        self._restarts = 0

    # --- what the gateway uses -------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def stores(self) -> int:
        return self._stores

    @property
    def config(self) -> Config:
        """A fresh copy of what an actor of this process needs to join the network: the
        tower's endpoints as `beacon/sub_address`/`beacon/pub_address`, and
        `beacon/address` 127.0.0.1 (so its data sockets bind loopback only)."""
        ports = self._tower_ports
        if ports is None:
            raise RuntimeError("the embedded Dafka network is not started")
        sub, pub = ports
        return Config(
            {
                "beacon/sub_address": f"tcp://{HOST}:{sub}",
                "beacon/pub_address": f"tcp://{HOST}:{pub}",
                "beacon/address": HOST,
            }
        )

    @property
    def restarts(self) -> int:
        """How many times a dead child was restarted (and became ready again)."""
        return self._restarts

    def pids(self) -> dict[str, int]:
        """The running children's pids by name (`dafka-towerd`, `dafka-stored-0`, ...)."""
        with self._lock:
            return {name: child.pid for name, child in self._children.items() if child.running}

    # --- start and stop ------------------------------------------------------------------

    def start(self) -> None:
        """Lock the data directory, start the tower, then the stores, and wait until all
        are ready (each within `ready_timeout` s). On failure everything started is
        stopped, the lock released, and EmbeddedNetworkError (DataDirError,
        DataDirLocked) raised saying what failed and what the program printed last."""
        with self._lock:
            if self._state != "new":
                raise EmbeddedNetworkError(
                    f"embedded Dafka network on {self._data_dir} is {self._state}; "
                    "a network starts once"
                )
            self._state = "starting"
        try:
            self._lock_data_dir()
            tower = self._launch(TOWER)
            match = tower.wait_line(TOWER_READY, self._ready_timeout)
            self._tower_ports = (int(match.group(1)), int(match.group(2)))
            self._write_store_configs()
            stores = [self._launch(store_name(i)) for i in range(self._stores)]
            for store in stores:  # they start in parallel; this waits for the slowest
                store.wait_ready(STORE_READY, self._ready_timeout)
        except BaseException as error:
            stopped_meanwhile = self._stopping.is_set()
            self._shutdown(5.0)
            if stopped_meanwhile or isinstance(error, _Stopping):
                raise EmbeddedNetworkError(
                    f"embedded Dafka network on {self._data_dir} was stopped while starting"
                ) from None
            if isinstance(error, ProcessError):
                raise EmbeddedNetworkError(
                    f"embedded Dafka network on {self._data_dir} did not start: {error}"
                ) from None
            raise
        with self._lock:
            if self._stopping.is_set():  # stop() won the race; it shuts everything down
                raise EmbeddedNetworkError(
                    f"embedded Dafka network on {self._data_dir} was stopped while starting"
                )
            self._state = "running"
            self._supervisor = threading.Thread(
                target=self._supervise, name="dafka-embedded-supervisor", daemon=True
            )
            self._supervisor.start()
        log.info(
            "embedded dafka network started",
            data_dir=str(self._data_dir),
            tower=self.config.get("beacon/pub_address"),
            pids=self.pids(),
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the stores (SIGTERM together, SIGKILL after `timeout` s), then the tower,
        then release the data directory. Idempotent; safe while `start()` runs in another
        thread (which then fails). Returns within about `timeout` + 1 s (plus 5 s for any
        child that SIGKILL does not end at once)."""
        with self._lock:
            if self._state in ("new", "stopped"):
                self._state = "stopped"
                return
            first = self._state != "stopping"
            self._state = "stopping"
            self._stopping.set()
        if first:
            self._shutdown(timeout)
        else:
            self._stopped.wait(timeout + 10)

    async def start_async(self) -> None:
        """`start()` in a worker thread. If the awaiting task is cancelled, the network is
        stopped before the cancellation propagates."""
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            await asyncio.to_thread(self.stop)
            with contextlib.suppress(Exception):
                await starting
            raise

    async def stop_async(self, timeout: float = 10.0) -> None:
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self) -> EmbeddedNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNetwork:
        await self.start_async()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop_async()

    # --- data directory ------------------------------------------------------------------

    def _lock_data_dir(self) -> None:
        where = self._data_dir
        try:
            where.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise DataDirError(
                f"Dafka data directory {where} exists and is not a directory"
            ) from None
        except OSError as error:
            raise DataDirError(
                f"cannot create the Dafka data directory {where}: {error.strerror}"
            ) from None
        path = where / LOCK_FILE
        try:
            # O_CLOEXEC (Python's default): no child may inherit, and so keep, the lock.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise DataDirError(
                f"cannot write in the Dafka data directory {where}: {error.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_pid(fd)
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                by = f" (pid {holder})" if holder else ""
                raise DataDirLocked(
                    f"Dafka data directory {where} is in use by another rafka process{by}; "
                    "stop it or give this one another data directory"
                ) from None
            raise DataDirError(f"cannot lock {path}: {error.strerror}") from None
        self._dir_lock = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            for index in range(self._stores):
                (where / f"store-{index}").mkdir(exist_ok=True)
        except OSError as error:
            raise DataDirError(
                f"cannot write in the Dafka data directory {where}: {error.strerror}"
            ) from None

    def _release_data_dir(self) -> None:
        fd, self._dir_lock = self._dir_lock, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # no stale pid for the next error message to name
            os.close(fd)  # releases the flock

    def _write_store_configs(self) -> None:
        assert self._tower_ports is not None
        base = self._settings.copy()
        for path, value in self.config.items():
            base.set(path, value)
        for index in range(self._stores):
            directory = self._data_dir / f"store-{index}"
            config = base.copy()
            config.set("store/db", str(directory / "db"))
            try:
                config.save(directory / "stored.cfg")
            except OSError as error:
                raise DataDirError(
                    f"cannot write in the Dafka data directory {directory}: {error.strerror}"
                ) from None

    # --- children ------------------------------------------------------------------------

    def _argv(self, name: str) -> list[str]:
        if name == TOWER:
            # First start: port 0 (the kernel picks); a restart binds the same ports again.
            sub, pub = self._tower_ports or ("*", "*")
            argv = [sys.executable, "-m", "backends.dafka.tools.towerd"]
            secured = Config({k: v for k, v in self._settings.items() if k.startswith("curve/")})
            if secured.items():  # CURVE (security.py): the tower serves with the same keys
                path = self._data_dir / "towerd.cfg"
                secured.save(path)
                argv += ["-c", str(path)]
            return [*argv, "--sub", f"tcp://{HOST}:{sub}", "--pub", f"tcp://{HOST}:{pub}"]
        index = int(name.rsplit("-", 1)[1])
        config = self._data_dir / f"store-{index}" / "stored.cfg"
        return [sys.executable, "-m", "backends.dafka.tools.stored", "-c", str(config)]

    def _launch(self, name: str) -> Child:
        with self._lock:
            if self._stopping.is_set():
                raise _Stopping
            child = spawn(
                self._argv(name),
                name=name,
                env=_child_env(),
                cwd=self._data_dir,
                keep_lines=200,
                on_line=_log_line,
                on_exit=self._on_exit,
            )
            self._children[name] = child
            return child

    def _on_exit(self, child: Child) -> None:
        # On the child's watcher thread: hand over to the supervisor, never block here.
        if not self._stopping.is_set():
            self._deaths.put((child.name, child))

    def _supervise(self) -> None:
        crashes: dict[str, int] = {}
        while True:
            death = self._deaths.get()
            if death is None or self._stopping.is_set():
                return
            name, dead = death
            with self._lock:
                if dead is not None and self._children.get(name) is not dead:
                    continue  # an old child's late news
            stable = dead is not None and time.monotonic() - dead.started_at >= STABLE_AFTER
            crashes[name] = 0 if stable else crashes.get(name, 0) + 1
            delay = min(self._backoff[0] * 2 ** max(0, crashes[name] - 1), self._backoff[1])
            if dead is not None:
                log.warning(
                    "embedded dafka child exited; restarting",
                    program=name,
                    pid=dead.pid,
                    status=describe_exit(dead.popen.returncode),
                    restart_in=round(delay, 3),
                    last_output=dead.tail(5),
                )
            if self._stopping.wait(delay):
                return
            try:
                self._restart(name)
            except _Stopping:
                return
            except Exception as error:  # e.g. fork failed: no child, so no death to wait for
                if self._stopping.is_set():
                    return
                log.error("embedded dafka child restart failed", program=name, error=str(error))
                self._deaths.put((name, None))

    def _restart(self, name: str) -> None:
        child = self._launch(name)
        try:
            child.wait_ready(TOWER_READY if name == TOWER else STORE_READY, self._ready_timeout)
        except ProcessError as error:
            # Exited: its death is queued already (and logged with its output when handled).
            # Hung: stopping it queues its death.
            if child.running and not self._stopping.is_set():
                log.error("embedded dafka child not ready; stopping it", error=str(error))
            child.stop(5.0)
            return
        self._restarts += 1
        log.info("embedded dafka child restarted", program=name, pid=child.pid)

    def _shutdown(self, timeout: float) -> None:
        """Stop everything and release the directory; any thread, any number of times."""
        with self._shutdown_lock:
            with self._lock:
                self._stopping.set()
                children = dict(self._children)
            self._deaths.put(None)  # wakes the supervisor
            deadline = time.monotonic() + timeout
            stores = [child for name, child in children.items() if name != TOWER]
            statuses: dict[str, str] = {}
            try:
                for store in stores:
                    store.terminate()
                for store in stores:
                    statuses[store.name] = _stop(store, deadline - time.monotonic())
                if TOWER in children:
                    # Whatever the stores took, the tower gets a moment to exit cleanly.
                    tower = children[TOWER]
                    statuses[TOWER] = _stop(tower, max(1.0, deadline - time.monotonic()))
                if self._supervisor is not None:
                    self._supervisor.join(timeout + 6)
            finally:
                self._release_data_dir()
                with self._lock:
                    self._state = "stopped"
                self._stopped.set()
            if statuses:
                log.info("embedded dafka network stopped", data_dir=str(self._data_dir), **statuses)


def _stop(child: Child, timeout: float) -> str:
    try:
        return describe_exit(child.stop(timeout))
    except ProcessError as error:  # pathological (a process stuck in the kernel): go on
        log.error("embedded dafka child would not die", program=child.name, error=str(error))
        return "still running"


def _child_env() -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    # The programs run as `python -m`: make the package importable even when this process
    # found it through its working directory. A site-packages directory is on the child's
    # path anyway (same interpreter), and must not be put ahead of the standard library.
    if _PACKAGE_ROOT.name not in ("site-packages", "dist-packages"):
        previous = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), previous]))
    return env


def _log_line(child: Child, stream: str, line: str) -> None:
    if line:
        log.info("embedded dafka child output", program=child.name, pid=child.pid, line=line)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
