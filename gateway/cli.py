"""`rafka`: the command-line entry point (console script)."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
from collections.abc import Sequence
from typing import Any

import structlog

from backends.base import EngineError
from gateway import __version__, logs
from gateway.config import Config, ConfigError, from_args
from gateway.limits import size_open_files
from gateway.loops import loop_factory
from gateway.runner import forget_signals, serve_until_signal, start_server, stop_on_signal

log = structlog.get_logger("rafka")

# Container objects made (net of those freed) between two young garbage collections;
# Python's default is 700.
YOUNG_COLLECTION_THRESHOLD = 10_000


async def serve(config: Config) -> None:
    # From the very start: a signal while the engine starts (children being started, a
    # tower waited for) stops what was started, as one after it runs the shutdown.
    stop = stop_on_signal()
    try:
        await _serve(config, stop)
    finally:
        forget_signals()


async def _serve(config: Config, stop: asyncio.Future[int]) -> None:
    starting = asyncio.ensure_future(start_server(config))
    waits: list[asyncio.Future[Any]] = [starting, stop]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        name = signal.Signals(stop.result()).name
        log.info("signal while starting; stopping what was started", signal=name)
        starting.cancel()
        try:
            started = await starting  # start_server stops what it started when cancelled
        except asyncio.CancelledError:
            print(f"rafka: stopped by {name} while starting", file=sys.stderr, flush=True)
            return
        await started.shutdown()  # it had finished meanwhile
        return
    server = starting.result()
    # What start-up made (modules, classes, the engine's tables) lives as long as the
    # process: frozen, a full collection no longer scans it. Measured on the Dafka
    # engine at 10,000 records/s: full collections of 17-58 ms down to ~1 ms, pauses
    # every record on its way waited through (docs/gateway.md, "Latency").
    gc.collect()
    gc.freeze()
    # Serving frees nearly all it makes by reference counting, but every 700 container
    # objects made started a young collection, every tenth a middle one, and those
    # promoted what was in flight until full collections walked it all. Measured at
    # 1,000 topics, 600,000 RPUSHX: 1,180 young, 107 middle and 9 full collections, 141 ms
    # in all and pauses up to 6.6 ms; with 10,000, 5 young ones (3 ms, 0.7 ms at most).
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
    # One plain line for the person who started it (the log lines are for machines).
    where = server.ctx.engine.where()
    ports = [f"{server.host}:{server.port}"] if server.port is not None else []
    if server.tls_port is not None:
        ports.append(f"{server.host}:{server.tls_port} (TLS)")
    print(
        f"rafka {__version__} listening on {' and '.join(ports)}, {config.engine} "
        f"engine" + (f": {where}" if where else "") + "; SIGTERM or Ctrl-C stops it",
        flush=True,
    )
    await serve_until_signal(server, stop)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway until SIGTERM/SIGINT; the exit code is 0 after a clean shutdown."""
    try:
        config = from_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"rafka: {error}", file=sys.stderr)
        return 1
    logs.configure(config.log_format, config.log_level)
    # The engine describes its own settings in there (the Kafka engine: with librdkafka's
    # version).
    log.info("starting", version=__version__, config=config.redacted())
    size_open_files(config.max_clients)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
            runner.run(serve(config))
    except ConfigError as error:  # a TLS file, or run-time push subscriptions, unreadable
        log.error("bad configuration", error=str(error))
        print(f"rafka: {error}", file=sys.stderr)
        return 1
    except EngineError as error:  # e.g. a locked data directory, no tower answering
        log.error("cannot start the engine", engine=config.engine, error=str(error))
        print(f"rafka: cannot start the {config.engine} engine: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # e.g. the port (or the metrics port) is taken
        log.error(
            "cannot listen",
            host=config.host,
            port=config.port,
            tls_port=config.tls_port,
            error=str(error),
        )
        print(f"rafka: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
