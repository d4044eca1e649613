"""Running a gateway: start-up, serving until a signal (the CLI), or in a thread.

`start_server` makes and starts the engine the configuration names, then listens;
`serve_until_signal` is the `rafka` command's life after that: serve until SIGTERM or
SIGINT, then shut down. `ServerThread` runs a gateway on an event loop of its own in a
background thread (tests, benchmarks):

    with ServerThread(config) as server:
        redis.Redis(port=server.port).ping()

`stop()` runs the full shutdown sequence and joins the thread.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

from backends.base import Engine, Stats
from backends.registry import engine_entry
from gateway.commands import COMMANDS
from gateway.config import Config, ConfigError
from gateway.context import ServerContext
from gateway.latency import CommandLatency
from gateway.loops import loop_factory
from gateway.push.manager import PushManager, state_path
from gateway.push.spec import SubscriptionError
from gateway.server import Server
from gateway.stats import ServerStats
from gateway.tls import server_context

log = structlog.get_logger("rafka.gateway.server")

T = TypeVar("T")


async def start_server(config: Config, *, engine: Engine | None = None) -> Server:
    """Start the engine (the one `config` names, unless given), listen, and start the
    push subscriptions; the caller owns the Server and calls shutdown().

    Raises ConfigError before the engine starts for bad TLS files and for run-time
    subscriptions kept in the data directory that cannot be read."""
    tls = server_context(config)
    stats = engine.stats if engine is not None else Stats()
    if engine is None:
        entry = engine_entry(config.engine)
        engine = entry.create(config.engine_settings, stats, config.engine_options())
    push = PushManager(engine, stats, config.subscriptions, state_path(config.data_dir))
    try:
        push.load()
    except SubscriptionError as error:
        raise ConfigError(str(error)) from None
    await engine.start()
    latency = CommandLatency(COMMANDS) if config.metrics_port is not None else None
    ctx = ServerContext(
        config=config, engine=engine, stats=ServerStats(stats), latency=latency, push=push
    )
    server = Server(ctx, tls)
    try:
        if latency is not None:
            from gateway.metrics import MetricsEndpoint  # prometheus_client: only when on

            server.metrics = MetricsEndpoint(server.ctx, latency)
            server.metrics.start()
        await server.start()
    except BaseException:
        if server.metrics is not None:
            await server.metrics.stop()
        await engine.stop()
        raise
    push.start()
    return server


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signal() -> asyncio.Future[int]:
    """Handle SIGTERM and SIGINT on the running loop from now on: the first one sets the
    returned future (to its number), later ones are only logged. `forget_signals()`
    gives them back."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[int] = loop.create_future()

    def on_signal(signum: int) -> None:
        if stop.done():
            log.info("shutdown already in progress", signal=signal.Signals(signum).name)
        else:
            stop.set_result(signum)

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    return stop


def forget_signals() -> None:
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.remove_signal_handler(signum)


async def serve_until_signal(server: Server, stop: asyncio.Future[int] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down (a second signal is only logged).
    `stop`: what `stop_on_signal()` returned, when the caller handles the signals already
    (and gives them back itself)."""
    own = stop is None
    if stop is None:
        stop = stop_on_signal()
    try:
        await stop
        await server.shutdown()
    finally:
        if own:
            forget_signals()


class ServerThread:
    def __init__(
        self, config: Config, *, engine: Engine | None = None, start_timeout: float = 10.0
    ) -> None:
        self._config = config
        self._engine = engine
        self._start_timeout = start_timeout
        self._loop = loop_factory(config.event_loop)()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rafka-gateway")
        self._server: Server | None = None

    @property
    def server(self) -> Server:
        if self._server is None:
            raise RuntimeError("server not started")
        return self._server

    @property
    def port(self) -> int:
        """The plaintext port (an error when that listener is off)."""
        if self.server.port is None:
            raise RuntimeError("no plaintext listener (TLS only)")
        return self.server.port

    @property
    def tls_port(self) -> int:
        if self.server.tls_port is None:
            raise RuntimeError("no TLS listener")
        return self.server.tls_port

    def start(self) -> ServerThread:
        self._thread.start()
        try:
            self._server = self.call(
                start_server(self._config, engine=self._engine), self._start_timeout
            )
        except BaseException:
            self._stop_loop()
            raise
        return self

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def shutdown_async(self) -> Any:
        """Start the shutdown sequence; returns a concurrent Future for its end."""
        return asyncio.run_coroutine_threadsafe(self.server.shutdown(), self._loop)

    def stop(self, timeout: float | None = 60.0) -> None:
        if self._server is not None:
            self.shutdown_async().result(timeout)
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
