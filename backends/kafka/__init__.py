"""The Kafka engine: Apache Kafka (or a compatible broker) through librdkafka.

The entry points of `backends.registry`: parse the configuration, create, describe.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import Admin, Engine, EngineOptions, EngineSettings, Stats
from backends.kafka import settings as _settings
from backends.kafka.settings import KafkaSettings

# Rafka's librdkafka sections: a file with any of them and no gateway.engine means Kafka.
SECTIONS = ("general", "consumer", "producer")


def parse_settings(document: Mapping[str, object]) -> KafkaSettings:
    return _settings.parse_settings(document)


def create(settings: EngineSettings, stats: Stats, options: EngineOptions) -> Engine:
    from backends.kafka.engine import KafkaEngine

    return KafkaEngine(stats, _own(settings), options)


def describe(settings: EngineSettings) -> dict[str, object]:
    return _settings.describe(_own(settings))


def _own(settings: EngineSettings) -> KafkaSettings:
    if not isinstance(settings, KafkaSettings):  # another engine's: a bug, not a config error
        raise TypeError(f"not Kafka settings: {type(settings).__name__}")
    return settings


def make_admin(settings: EngineSettings, options: EngineOptions) -> Admin:
    from backends.kafka.admin import KafkaAdmin

    return KafkaAdmin(_own(settings), options)
