"""Every push subscription of one gateway: start, add, remove, stop.

Subscriptions come from two places: the configuration file (fixed for the gateway's
life; removed by editing the file) and the run-time commands (`RAFKA.PUSH ADD/REMOVE`,
the `rafka-subscriptions` tool), which are kept in `<data_dir>/push-subscriptions.json`
so that they survive a restart. Each subscription runs as one task
(gateway.push.runner) that the manager owns: `stop()` cancels them all and waits for
them, so nothing is left running when the gateway stops its engine.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from backends.base import Engine, Stats
from gateway.push.runner import SubscriptionRunner, counter_names
from gateway.push.spec import Subscription, SubscriptionError, parse_subscription

log = structlog.get_logger("rafka.gateway.push")

STATE_FILE = "push-subscriptions.json"
# How long stopping one subscription may take (cancel, close its consumer and producer).
STOP_TIMEOUT = 15.0


class PushError(Exception):
    """A run-time change refused; the text says why (clients see `ERR <text>`)."""


def state_path(data_dir: str) -> Path:
    return Path(data_dir) / STATE_FILE


def load_state(path: Path) -> tuple[Subscription, ...]:
    """The run-time subscriptions kept in `path` (none when it does not exist); raises
    SubscriptionError naming the file for one that cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        # No data directory yet, or none can be made there: the engine's start says so.
        return ()
    except (OSError, UnicodeDecodeError) as error:
        raise SubscriptionError(f"cannot read {path}: {error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise SubscriptionError(f"{path}: invalid JSON: {error}") from None
    if not isinstance(document, list):
        raise SubscriptionError(f"{path}: must hold a JSON array of subscriptions")
    return tuple(
        parse_subscription(item, f"{path}: subscription {index}")
        for index, item in enumerate(document)
    )


def _save_state(path: Path, subscriptions: Sequence[Subscription]) -> None:
    """Replace `path` atomically (write, fsync, rename), so a crash leaves the old or
    the new list, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    text = json.dumps([s.to_json() for s in subscriptions], indent=2)
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


class PushManager:
    def __init__(
        self,
        engine: Engine,
        stats: Stats,
        configured: Sequence[Subscription],
        state: Path,
    ) -> None:
        self._engine = engine
        self._stats = stats
        self._configured = {s.name: s for s in configured}
        self._state = state
        self._runtime: dict[str, Subscription] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopped = False
        # Run-time changes one at a time: each writes the state file.
        self._changing = asyncio.Lock()

    def load(self) -> None:
        """Read the run-time subscriptions (before start); SubscriptionError."""
        for subscription in load_state(self._state):
            if subscription.name in self._configured:
                raise SubscriptionError(
                    f"{self._state}: subscription {subscription.name!r} is also in the "
                    "configuration file; remove it from one of them"
                )
            self._runtime[subscription.name] = subscription

    def start(self) -> None:
        for subscription in (*self._configured.values(), *self._runtime.values()):
            self._launch(subscription)
        if self._tasks:
            log.info("push subscriptions started", names=sorted(self._tasks))

    def listing(self) -> list[tuple[Subscription, str]]:
        """Every subscription with where it comes from: "config" or "runtime"."""
        return [(s, "config") for s in self._configured.values()] + [
            (s, "runtime") for s in self._runtime.values()
        ]

    async def add(self, subscription: Subscription) -> None:
        async with self._changing:
            if self._stopped:
                raise PushError("the server is shutting down")
            if subscription.name in self._configured or subscription.name in self._runtime:
                raise PushError(f"a subscription named {subscription.name!r} exists already")
            runtime = [*self._runtime.values(), subscription]
            await self._save(runtime)
            self._runtime[subscription.name] = subscription
            self._launch(subscription)
            log.info("push subscription added", name=subscription.name)

    async def remove(self, name: str) -> None:
        async with self._changing:
            if name in self._configured:
                raise PushError(
                    f"subscription {name!r} comes from the configuration file; remove it there"
                )
            if name not in self._runtime:
                raise PushError(f"no subscription named {name!r}")
            await self._save([s for s in self._runtime.values() if s.name != name])
            del self._runtime[name]
            await self._halt([name])
            self._stats.remove_counters(list(counter_names(name).values()))
            log.info("push subscription removed", name=name)

    async def stop(self) -> None:
        """Stop every subscription and wait for them (each closes its consumer)."""
        self._stopped = True
        # After a change in progress: an ADD writing the state file launches its
        # subscription when the write is done, and must not outlive this stop.
        async with self._changing:
            await self._halt(list(self._tasks))

    async def _save(self, subscriptions: Sequence[Subscription]) -> None:
        try:
            await asyncio.to_thread(_save_state, self._state, subscriptions)
        except OSError as error:
            raise PushError(f"cannot write {self._state}: {error}") from None

    def _launch(self, subscription: Subscription) -> None:
        runner = SubscriptionRunner(subscription, self._engine, self._stats)
        self._stats.add_counters(list(runner.counters.values()))
        task = asyncio.get_running_loop().create_task(
            runner.run(), name=f"push-{subscription.name}"
        )
        task.add_done_callback(self._ended)
        self._tasks[subscription.name] = task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "push subscription stopped by an error",
                task=task.get_name(),
                error=repr(task.exception()),
            )

    async def _halt(self, names: Sequence[str]) -> None:
        tasks = [self._tasks.pop(name) for name in names if name in self._tasks]
        for task in tasks:
            task.cancel()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
            if late:
                log.error("push subscriptions did not stop in time", tasks=len(late))
