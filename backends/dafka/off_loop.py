"""Blocking start-up work off the event loop, abandoned when its caller is cancelled.

`asyncio.to_thread` runs on the loop's default executor, whose threads the process joins
at exit: a cancelled `to_thread` still runs to its end, so a signal while the engine waits
for a tower or its stores (up to `dafka.start_timeout`) took effect only then."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def off_loop(make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`make(*args, **kwargs)` on a daemon thread of its own, as `asyncio.to_thread` would
    run it, except that a cancelled caller does not wait for it: the start-up waits
    (a tower, the stores, up to `dafka.start_timeout`) must not hold up a signalled
    stop, nor the process's exit (the default executor's threads are joined at exit).
    What it makes after its caller gave up is closed."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def close(made: Any) -> None:
        with contextlib.suppress(Exception):
            if callable(getattr(made, "close", None)):
                made.close()

    def settle(made: Any, error: BaseException | None) -> None:
        if future.cancelled():
            threading.Thread(target=close, args=(made,), daemon=True).start()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(made)

    def run() -> None:
        made: Any = None
        error: BaseException | None = None
        try:
            made = make(*args, **kwargs)
        except Exception as failure:
            error = failure
        try:
            loop.call_soon_threadsafe(settle, made, error)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            close(made)

    threading.Thread(target=run, name="dafka-engine-start", daemon=True).start()
    return await future
