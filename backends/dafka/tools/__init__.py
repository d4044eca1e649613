"""The Dafka command line programs (spec §7, §9), shared option handling.

Every program accepts `-c config` (a ZPL file), `--pub`/`--sub` (tower endpoints) and
`--verbose`, like the C programs; `main(argv=None) -> int` never raises for user errors.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

import structlog

from backends.dafka.beacon import TowerUnreachable
from backends.dafka.config import Config, ConfigError

Actor = TypeVar("Actor")


def configure_logging(verbose: bool) -> None:
    """Log lines go to stderr, so stdout carries only the program's output."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if verbose else logging.INFO
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def parser(prog: str, description: str, tower: bool = False) -> argparse.ArgumentParser:
    side = "tower" if tower else "the tower's"
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("-c", dest="config", metavar="config", help="ZPL configuration file")
    p.add_argument(
        "--pub",
        metavar="tower-pub-address",
        help=f"{side} XPUB endpoint(s), comma separated (default tcp://127.0.0.1:5557"
        + (", bound as tcp://*:5557)" if tower else ")"),
    )
    p.add_argument(
        "--sub",
        metavar="tower-sub-address",
        help=f"{side} XSUB endpoint(s), comma separated (default tcp://127.0.0.1:5556"
        + (", bound as tcp://*:5556)" if tower else ")"),
    )
    p.add_argument("--verbose", action="store_true", help="log debug information to stderr")
    return p


def load_config(args: argparse.Namespace, section: str, verbose_keys: Sequence[str]) -> Config:
    """The `-c` file (or an empty config) with the command line overrides applied;
    `--pub`/`--sub` go to `<section>/pub_address` and `<section>/sub_address`."""
    config = Config.load(args.config) if args.config else Config()
    if args.verbose:
        for key in verbose_keys:
            config.set(key, "1")
    if args.pub:
        config.set(f"{section}/pub_address", args.pub)
    if args.sub:
        config.set(f"{section}/sub_address", args.sub)
    return config


def run(prog: str, body: Callable[[], int]) -> int:
    """Run a program body, turning the errors a user can cause into a message and exit 1."""
    try:
        return body()
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 1
    except (ConfigError, TowerUnreachable, ValueError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def serve(
    prog: str,
    description: str,
    argv: Sequence[str] | None,
    section: str,
    verbose_keys: Sequence[str],
    start: Callable[[Config], AbstractContextManager[Actor]],
    listening: Callable[[Actor, Config], str],
    tower: bool = False,
) -> int:
    """The daemons' `main`: parse the options, `start` the actor from the config, say on
    stderr where it `listening` and run until SIGINT or SIGTERM."""

    def body() -> int:
        args = parser(prog, description, tower).parse_args(argv)
        configure_logging(args.verbose)
        config = load_config(args, section, verbose_keys)
        with start(config) as actor:
            # One line on stderr so that supervisors (and tests) know we are listening.
            print(f"{prog}: {listening(actor, config)}", file=sys.stderr, flush=True)
            wait_for_signal()
        return 0

    return run(prog, body)


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (the programs' only way to stop, as in C)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(1.0):  # short waits keep the main thread responsive
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def interrupt_on_sigterm() -> None:
    """Make SIGTERM stop a program the way Ctrl-C does (KeyboardInterrupt)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
