"""`rafka-topics`: create, list, describe and delete topics, with kafka-topics' verbs, on
the engine a `rafka` would run on with the same configuration.

    rafka-topics --list                                   # ./rafka-data (embedded Dafka)
    rafka-topics --data-dir /var/lib/rafka --describe --topic orders
    rafka-topics --tower-sub tcp://10.0.0.5:5556 --tower-pub tcp://10.0.0.5:5557 --list
    rafka-topics --bootstrap-server kafka:9092 --create --topic orders --partitions 6 \\
        --config retention.ms=86400000
    rafka-topics -c rafka.json --delete --topic orders

The engine is chosen as `rafka` chooses it (`gateway.config`: the file's `gateway.engine`,
else the sections it has, else the embedded Dafka engine), the flags written into the
document first. No engine-specific code here: the registry and `backends.base.Admin` only.
Exit status 0, or 1 with `rafka-topics: <message>` on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from backends.base import Admin, AdminError, EngineOptions, TopicDescription
from backends.registry import ENGINES, engine_entry
from gateway import __version__, logs
from gateway.config import (
    DEFAULT_CONFIG,
    ENGINE_WAIT_MAX,
    Config,
    ConfigError,
    check_document,
    read_file,
)

PROG = "rafka-topics"
DEFAULT_TIMEOUT = 10.0


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def argument_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Create, list, describe and delete topics.")
    verbs = parser.add_mutually_exclusive_group(required=True)
    verbs.add_argument("--create", action="store_true", help="create a topic")
    verbs.add_argument("--list", action="store_true", help="list the topics, one per line")
    verbs.add_argument("--describe", action="store_true", help="describe one or every topic")
    verbs.add_argument("--delete", action="store_true", help="delete a topic and its records")
    parser.add_argument("--topic", help="the topic (--describe: every topic without it)")
    parser.add_argument("--partitions", type=int, metavar="N", help="--create: partitions")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--create: a topic setting (retention.ms, retention.bytes), repeatable",
    )
    parser.add_argument(
        "--exclude-internal", action="store_true", help="leave out topics whose name starts __"
    )
    where = parser.add_argument_group("where (as rafka's configuration and flags)")
    where.add_argument(
        "-c",
        "--command-config",
        metavar="FILE",
        help=f"rafka's JSON configuration (default: {DEFAULT_CONFIG} if it exists)",
    )
    where.add_argument("--engine", choices=sorted(ENGINES), help="the log engine")
    where.add_argument(
        "--data-dir", help="Dafka: the data directory of a rafka (default: rafka-data)"
    )
    where.add_argument(
        "--bootstrap-server", metavar="HOST:PORT", help="Kafka: the brokers (comma list)"
    )
    for entry in ENGINES.values():
        for flag in entry.flags():
            where.add_argument(flag.flag, type=flag.type, help=flag.help, metavar="VALUE")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"bound on each step (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--verbose", action="store_true", help="log what happens on stderr")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return parser


def _section(document: dict[str, Any], name: str) -> dict[str, Any]:
    section = document.setdefault(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"section '{name}' must be a JSON object")
    return section


def config_from(args: argparse.Namespace) -> Config:
    """The configuration as `rafka` would check it, the flags written in first."""
    path = args.command_config
    if path is None and Path(DEFAULT_CONFIG).exists():
        path = DEFAULT_CONFIG
    document: dict[str, Any] = read_file(path) if path is not None else {}
    gateway = _section(document, "gateway")
    if args.engine is not None:
        gateway["engine"] = args.engine
    if args.data_dir is not None:
        gateway["data_dir"] = args.data_dir
    if args.bootstrap_server is not None:
        if gateway.setdefault("engine", "kafka") != "kafka":
            raise ConfigError("--bootstrap-server names Kafka brokers: not with the dafka engine")
        for name in ("consumer", "producer"):
            _section(document, name)["bootstrap.servers"] = args.bootstrap_server
    for entry in ENGINES.values():
        for flag in entry.flags():
            value = getattr(args, flag.flag.lstrip("-").replace("-", "_"))
            if value is not None:
                _section(document, flag.section)[flag.key] = value
    return Config(**check_document(document))


def _topic_config(pairs: Sequence[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config wants KEY=VALUE, got {pair!r}")
        config[key.strip()] = value.strip()
    return config


def _check_usage(args: argparse.Namespace) -> None:
    verb = next(v for v in ("create", "list", "describe", "delete") if getattr(args, v))
    if verb in ("create", "delete") and not args.topic:
        raise UsageError(f"--{verb} needs --topic")
    if verb == "create" and args.partitions is None:
        raise UsageError("--create needs --partitions N")
    if verb != "create" and (args.partitions is not None or args.config):
        raise UsageError("--partitions and --config go with --create")
    if verb == "list" and args.topic:
        raise UsageError("--list takes no --topic")
    if args.topic is not None and not args.topic:
        raise UsageError("--topic must not be empty")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= ENGINE_WAIT_MAX):
        raise UsageError(
            f"--timeout must be a finite number > 0 and at most {ENGINE_WAIT_MAX:.0f}, "
            f"got {args.timeout:g}"
        )


def describe_lines(description: TopicDescription) -> list[str]:
    """kafka-topics' layout: a line for the topic, then one per partition and one per
    partition a group committed on."""
    config = description.config
    name = description.name
    lines = [
        f"Topic: {name}\tPartitionCount: {len(description.partitions)}"
        f"\tRetention.ms: {config.get('retention.ms', 'unknown')}"
        f"\tRetention.bytes: {config.get('retention.bytes', 'unknown')}"
    ]
    for part in description.partitions:
        lines.append(
            f"\tTopic: {name}\tPartition: {part.partition}\tFirst: {part.first}\tNext: {part.next}"
        )
    for group in description.groups:
        lines.append(
            f"\tGroup: {group.group}\tTopic: {name}\tPartition: {group.partition}"
            f"\tCommitted: {group.committed}\tLag: {group.lag}"
        )
    return lines


def _internal(topic: str) -> bool:
    return topic.startswith("__")


async def run(admin: Admin, args: argparse.Namespace) -> list[str]:
    """The command's output lines."""
    try:
        if args.create:
            config = _topic_config(args.config)
            await admin.create_topic(args.topic, args.partitions, config)
            return [f"Created topic {args.topic}."]
        if args.delete:
            await admin.delete_topic(args.topic)
            return [f"Deleted topic {args.topic}."]
        if args.list:
            topics = await admin.list_topics()
            return [t for t in topics if not (args.exclude_internal and _internal(t))]
        if args.topic:
            topics = [args.topic]
        else:
            every = await admin.list_topics()
            topics = [t for t in every if not (args.exclude_internal and _internal(t))]
        lines: list[str] = []
        for topic in topics:
            lines += describe_lines(await admin.describe(topic))
        return lines
    finally:
        await admin.close()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = argument_parser().parse_args(sys.argv[1:] if argv is None else argv)
        _check_usage(args)
        config = config_from(args)
    except (UsageError, ConfigError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    logs.configure("console", "info" if args.verbose else "warning")
    entry = engine_entry(config.engine)
    options = EngineOptions(metadata_timeout=args.timeout, data_dir=config.data_dir)
    try:
        admin = entry.admin(config.engine_settings, options)
        lines = asyncio.run(run(admin, args))
    except (AdminError, UsageError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 1
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
