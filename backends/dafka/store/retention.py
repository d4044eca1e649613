"""The store's retention: which records of a topic may go (spec §5, not in C).

Settings `store/retention/ms|bytes` and per topic `store/topics/<topic>/retention/ms|bytes`
(-1 = forever), overridden per topic by the catalog's `retention.ms` / `retention.bytes`
(`catalog.py`). The store's retention thread applies them every
`store/retention/check_interval` ms; the writer replaces the overrides as it stores
catalog entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from backends.dafka.catalog import TOPICS_TOPIC, TopicEntry, retention_values
from backends.dafka.config import Config, ConfigError
from backends.dafka.offsets import OFFSETS_TOPIC
from backends.dafka.storage import Retention


def wall_ms() -> int:
    """Wall-clock milliseconds: the write time of records, persisted for retention."""
    return time.time_ns() // 1_000_000


def retention_policy(config: Config) -> Callable[[bytes], Retention] | None:
    """Per-topic retention from the config, or None when everything is kept forever."""
    default = Retention(
        config.get_int("store/retention/ms", -1), config.get_int("store/retention/bytes", -1)
    )
    per_topic = [
        (path, value)
        for path, value in config.items()
        if path.startswith("store/topics/") and path.endswith(("/retention/ms", "/retention/bytes"))
    ]
    for path, _ in per_topic:
        config.get_int(path)  # ConfigError: refused at start, as store/retention/ms is
    finite = not default.forever or any(value.strip() not in ("", "-1") for _, value in per_topic)
    if not finite:
        return None
    cache: dict[bytes, Retention] = {}
    # The topic catalog is kept unless configured otherwise: it holds what every gateway
    # needs to know of the topics created. The gateways' committed offsets go by time
    # only: a snapshot of the live ones is written every `snapshot_interval`, but a
    # bound in bytes would take a quiet group's last commit once others commit more.
    fallbacks = {
        TOPICS_TOPIC.encode(): Retention(),
        OFFSETS_TOPIC.encode(): Retention(default.ms, -1),
    }

    def policy_for(subject: bytes) -> Retention:
        policy = cache.get(subject)
        if policy is None:
            base = f"store/topics/{subject.decode(errors='replace')}/retention"
            fallback = fallbacks.get(subject, default)
            try:
                policy = Retention(
                    config.get_int(f"{base}/ms", fallback.ms),
                    config.get_int(f"{base}/bytes", fallback.bytes),
                )
            except ConfigError:
                policy = fallback  # a topic name that cannot be a config path
            cache[subject] = policy
        return policy

    return policy_for


class RetentionPolicy:
    """The store's retention: its settings, overridden per topic by the catalog's
    `retention.ms` / `retention.bytes`. Written by the writer thread, read by the
    retention thread: overrides are replaced, never changed in place."""

    def __init__(self, config: Config) -> None:
        self._configured = retention_policy(config)
        self._overrides: dict[bytes, tuple[int | None, int | None]] = {}

    @property
    def active(self) -> bool:
        """Whether any topic may have records to delete."""
        return self._configured is not None or bool(self._overrides)

    def apply_entry(self, entry: TopicEntry) -> None:
        """Take a topic's retention from its latest catalog entry."""
        subject = entry.topic.encode()
        values = (None, None) if entry.deleted else retention_values(entry.config)
        overrides = dict(self._overrides)
        if values == (None, None):
            overrides.pop(subject, None)
        else:
            overrides[subject] = values
        self._overrides = overrides

    def __call__(self, subject: bytes) -> Retention:
        base = self._configured(subject) if self._configured is not None else Retention()
        override = self._overrides.get(subject)
        if override is None:
            return base
        ms, size = override
        return Retention(base.ms if ms is None else ms, base.bytes if size is None else size)
