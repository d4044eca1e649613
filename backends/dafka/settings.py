"""The `dafka` section of the gateway's configuration file, checked into DafkaSettings.

"dafka": {
    "stores": 1,                       # embedded: how many stores to run
    "tower_sub_address": "tcp://10.0.0.5:5556",   # joined mode (both, or either)
    "tower_pub_address": "tcp://10.0.0.5:5557",
    "partitions": 4,                   # per topic, for records this gateway writes
    "topic_partitions": {"orders": 8},
    "partitioner": "consistent_random",
    "node": 0,                         # which block of partition numbers it writes
    "min_stores": 1,                   # joined: stores that must answer at start
    "auto_offset_reset": "earliest",
    "commit_interval": 1.0,
    "snapshot_interval": 3600,
    "start_timeout": 10,
    "queue_max_messages": 100000,
    "group_buffer": 10000,             # records a consumer group holds ahead, in all
    "settings": {"store/retention/ms": "604800000"}   # zconfig paths, passed through
}
"""

from __future__ import annotations

import fnmatch
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from backends.dafka.config import Config as ZplConfig
from backends.dafka.config import ConfigError as ZplError
from backends.dafka.partitions import MAX_PARTITIONS, PARTITIONERS

RESETS = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest"} | {
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
}


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class DafkaSettings:
    """The `dafka` section of the configuration (documented in docs/gateway.md)."""

    # Joined mode when set: the towers of an existing network ("tcp://host:5556", comma
    # separated; beacons publish there) and their publishing side (5557).
    tower_sub_address: str = ""
    tower_pub_address: str = ""
    # Embedded mode (its data directory is the gateway's `data_dir`).
    stores: int = 1
    # Both modes.
    partitions: int = 4
    topic_partitions: Mapping[str, int] = field(default_factory=_empty)
    partitioner: str = "consistent_random"
    node: int = 0
    min_stores: int = 1
    auto_offset_reset: str = "earliest"
    commit_interval: float = 1.0
    snapshot_interval: float = 3600.0
    start_timeout: float = 10.0
    queue_max_messages: int = 100_000
    # Records a consumer group may have on their way to its members (buffered, or being
    # fetched), all its partitions together: each partition gets an equal share, at least
    # groups.MIN_SHARE (16, so the bound is 16 a partition past group_buffer / 16
    # partitions) and at most gateway.consume_batch. 10,000 records of 100 bytes are about
    # the 1 MiB a Kafka engine's consumer fetches ahead (kafka.settings.CONSUMER_DEFAULTS);
    # with 50,000, a group reading 100 partitions held 500 of each while they were produced
    # (the gateway's RSS 1.28 times its 1-topic figure; 1.15 with 10,000).
    group_buffer: int = 10_000
    # DUMP counts a record durable once one store has it ("one"), or every store the
    # tower knows ("all").
    acks: str = "one"
    # Passed to the Dafka actors (and, embedded, to the stores): zconfig paths.
    settings: Mapping[str, str] = field(default_factory=_empty)

    @property
    def joined(self) -> bool:
        return bool(self.tower_sub_address or self.tower_pub_address)

    def partition_count(self, topic: str) -> int:
        """`topic_partitions` by exact name, else by the first glob pattern (`logs.*`) that
        matches, else `partitions`."""
        return self.configured_count(topic) or self.partitions

    def configured_count(self, topic: str) -> int | None:
        """The count `topic_partitions` gives `topic` (by name or pattern), if any."""
        count = self.topic_partitions.get(topic)
        if count is not None:
            return count
        for pattern, pattern_count in self.topic_partitions.items():
            if fnmatch.fnmatchcase(topic, pattern):
                return pattern_count
        return None


ACKS = ("one", "all")


class SettingsError(ValueError):
    """A bad `dafka` setting; the text names the key."""


MAX_TOPIC_PARTITIONS = 1024


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float | str)


def _integer(key: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SettingsError(f"dafka.{key} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"dafka.{key} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise SettingsError(f"dafka.{key} must be {low}..{high}, got {number}")
    return number


def _seconds(key: str, value: object) -> float:
    if not _is_number(value):
        raise SettingsError(f"dafka.{key} must be a number of seconds, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except ValueError:
        raise SettingsError(f"dafka.{key} must be a number of seconds, got {value!r}") from None
    # Waited for in threads too (Condition.wait), which refuse more than TIMEOUT_MAX.
    if not math.isfinite(number) or number <= 0 or number > threading.TIMEOUT_MAX:
        raise SettingsError(
            f"dafka.{key} must be a finite number > 0 (at most {threading.TIMEOUT_MAX:.0f}), "
            f"got {value}"
        )
    return number


def _text(key: str, value: object) -> str:
    # type(), not isinstance(): JSON numbers arrive as a str subclass holding their text.
    if type(value) is not str:
        raise SettingsError(f"dafka.{key} must be a string, got {value!r}")
    return value


def _choice(key: str, value: object, choices: Any) -> str:
    text = _text(key, value)
    if text not in choices:
        raise SettingsError(f"dafka.{key} must be one of {', '.join(choices)}, got {text!r}")
    return text


def _topic_partitions(value: object) -> Mapping[str, int]:
    if not isinstance(value, dict):
        raise SettingsError("dafka.topic_partitions must be an object of topic: count")
    return MappingProxyType(
        {
            str(topic): _integer(f"topic_partitions.{topic}", count, 1, MAX_TOPIC_PARTITIONS)
            for topic, count in value.items()
        }
    )


def _zconfig(value: object) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise SettingsError("dafka.settings must be an object of zconfig path: value")
    out: dict[str, str] = {}
    for path, item in value.items():
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise SettingsError(f"dafka.settings.{path} must be a string or an integer")
        try:
            ZplConfig({str(path): str(item)})
        except ZplError as error:
            raise SettingsError(f"dafka.settings: {error}") from None
        out[str(path).strip("/")] = str(item)
    return MappingProxyType(out)


_KEYS: dict[str, Callable[[object], Any]] = {
    "stores": lambda v: _integer("stores", v, 1, 16),
    "tower_sub_address": lambda v: _text("tower_sub_address", v),
    "tower_pub_address": lambda v: _text("tower_pub_address", v),
    "partitions": lambda v: _integer("partitions", v, 1, MAX_TOPIC_PARTITIONS),
    "topic_partitions": _topic_partitions,
    "partitioner": lambda v: _choice("partitioner", v, PARTITIONERS),
    "node": lambda v: _integer("node", v, 0, MAX_PARTITIONS // MAX_TOPIC_PARTITIONS - 1),
    "min_stores": lambda v: _integer("min_stores", v, 1, 64),
    "auto_offset_reset": lambda v: RESETS[_choice("auto_offset_reset", v, sorted(RESETS))],
    "commit_interval": lambda v: _seconds("commit_interval", v),
    "snapshot_interval": lambda v: _seconds("snapshot_interval", v),
    "start_timeout": lambda v: _seconds("start_timeout", v),
    "queue_max_messages": lambda v: _integer("queue_max_messages", v, 1, 100_000_000),
    "group_buffer": lambda v: _integer("group_buffer", v, 16, 100_000_000),
    "settings": _zconfig,
    "acks": lambda v: _choice("acks", v, ACKS),
}


def parse_section(section: object, **overrides: Any) -> DafkaSettings:
    """DafkaSettings from the `dafka` section (None: all defaults); `overrides` (already
    typed, e.g. from command-line flags) win over the file."""
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise SettingsError("section 'dafka' must be a JSON object")
    values: dict[str, Any] = {}
    for key, value in section.items():
        convert = _KEYS.get(key)
        if convert is None:
            known = ", ".join(sorted(_KEYS))
            raise SettingsError(f"unknown setting dafka.{key} (known: {known})")
        values[key] = convert(value)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return DafkaSettings(**values)
