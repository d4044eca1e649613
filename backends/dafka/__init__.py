"""The Dafka engine: our Python implementation of the Dafka protocol (ZeroMQ + RocksDB).

The entry points of `backends.registry`: parse the configuration, create, describe, and
the command-line flags this engine adds to `rafka`.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import (
    Admin,
    Engine,
    EngineConfigError,
    EngineFlag,
    EngineOptions,
    EngineSettings,
    Stats,
)
from backends.dafka.settings import DafkaSettings, SettingsError, parse_section

SECTIONS = ("dafka",)
FLAGS = (
    EngineFlag(
        "--tower-sub",
        "dafka",
        "tower_sub_address",
        str,
        "Dafka: join the towers whose beacon side is ADDR (tcp://host:5556, comma list); "
        "joined mode starts no tower and no store",
    ),
    EngineFlag("--tower-pub", "dafka", "tower_pub_address", str, "Dafka: their 5557 side"),
    EngineFlag("--stores", "dafka", "stores", int, "Dafka, embedded: stores to run (default 1)"),
)


def parse_settings(document: Mapping[str, object]) -> DafkaSettings:
    try:
        return parse_section(document.get("dafka"))
    except SettingsError as error:
        raise EngineConfigError(str(error)) from None


def create(settings: EngineSettings, stats: Stats, options: EngineOptions) -> Engine:
    from backends.dafka.engine import DafkaEngine

    return DafkaEngine(stats, _own(settings), options)


def describe(settings: EngineSettings) -> dict[str, object]:
    own = _own(settings)
    described: dict[str, object] = {
        "mode": "joined" if own.joined else "embedded",
        "partitions": own.partitions,
        "acks": own.acks,
    }
    if own.joined:
        described["towers"] = [own.tower_sub_address, own.tower_pub_address]
    else:
        described["stores"] = own.stores
    return described


def _own(settings: EngineSettings) -> DafkaSettings:
    if not isinstance(settings, DafkaSettings):  # another engine's: a bug, not a config error
        raise TypeError(f"not Dafka settings: {type(settings).__name__}")
    return settings


def make_admin(settings: EngineSettings, options: EngineOptions) -> Admin:
    from backends.dafka.admin import DafkaAdmin

    return DafkaAdmin(_own(settings), options)
