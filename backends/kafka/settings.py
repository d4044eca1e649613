"""The Kafka engine's configuration: librdkafka properties, as Rafka took them.

From the configuration document it reads only Rafka's three sections::

    {"general": {...}, "consumer": {...}, "producer": {...}}

- `general` is merged under `consumer` and `producer` for keys they do not set.
- Values are strings, numbers (kept as their literal JSON text, so `1e3` stays `1e3`)
  or booleans ("true"/"false"); anything else is refused at load time, naming the key.
- `go.*` keys (settings of Rafka's Go client) are accepted and stripped;
  `go.events.channel.size` must still be an integer, as in Rafka.
- Missing sections are empty (Rafka crashed).

A client's BLPOP settings arrive decoded the same way and are converted by the same
rules when its consumer is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from backends.base import ConsumerCreationError, EngineConfigError
from backends.settings import redacted

SECTIONS = ("general", "consumer", "producer")

# What each consumer (one per consumer group and connection) may fetch ahead of the
# gateway's own buffer, unless `general`, `consumer` or the client's BLPOP settings set
# these properties. librdkafka's defaults (100,000 records a partition, 64 MiB) cost the
# gateway about 9 MiB per group once records flow, and keep every idle group fetching
# each new record (100 groups: 4,150 MiB, produce and consume 10 times slower). With a
# small queue, librdkafka's 1,000 ms wait before fetching again for a partition whose
# queue was full (`fetch.queue.backoff.ms`) cut one consumer's rate to a fifth: 10 ms
# kept it. docs/gateway.md ("What scale costs") has the figures.
CONSUMER_DEFAULTS: Mapping[str, str] = MappingProxyType(
    {
        "queued.min.messages": "1000",
        "queued.max.messages.kbytes": "1024",
        "fetch.queue.backoff.ms": "10",
    }
)
# librdkafka's default `message.max.bytes` (the largest request a client sends; a
# consumer's are small). librdkafka refuses a consumer whose `fetch.max.bytes` is under
# it, so a user's smaller fetch bound lowers it (fitted()).
REQUEST_BYTES = 1_000_000


@dataclass(frozen=True)
class KafkaSettings:
    """librdkafka properties of the consumers and the producer, `general` merged in."""

    consumer: Mapping[str, str]
    producer: Mapping[str, str]


# confluent-kafka's own keys, which take Python objects (callables, a logger), not text:
# given a string, each poll of the client failed.
PYTHON_OBJECTS = frozenset(
    {"logger", "error_cb", "stats_cb", "throttle_cb", "oauth_cb", "on_delivery", "on_commit"}
)


def property_value(key: str, value: object) -> str:
    """A librdkafka property value as text; raises ValueError for other JSON types and
    for confluent-kafka's keys that take Python objects."""
    if key.rpartition(".")[2] in PYTHON_OBJECTS:  # `key` may be `<section>.<name>`
        raise ValueError(f"{key}: not a librdkafka property (confluent-kafka's own)")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # includes JsonNumber
        return str(value)
    if isinstance(value, dict | list):
        raise ValueError(f"{key}: nested objects and arrays are not allowed")
    raise ValueError(f"{key}: must be a string, a number or a boolean, got null")


def consumer_overrides(settings: Mapping[str, object]) -> dict[str, str]:
    """A client's BLPOP settings as librdkafka properties; ConsumerCreationError."""
    try:
        return {key: property_value(key, value) for key, value in settings.items()}
    except ValueError as error:
        raise ConsumerCreationError(str(error)) from None


def _properties(name: str, section: object) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise EngineConfigError(f"section '{name}' must be a JSON object")
    out: dict[str, str] = {}
    for key, value in section.items():
        try:
            out[key] = property_value(f"{name}.{key}", value)
        except ValueError as error:
            raise EngineConfigError(str(error)) from None
    return out


def _client_properties(
    section: Mapping[str, str], general: Mapping[str, str], name: str
) -> MappingProxyType[str, str]:
    merged = {**general, **section}
    size = merged.get("go.events.channel.size")
    if size is not None:
        try:
            int(size)
        except ValueError:
            raise EngineConfigError(
                f"{name}.go.events.channel.size must be an integer, got {size!r}"
            ) from None
    return MappingProxyType({k: v for k, v in merged.items() if not k.startswith("go.")})


def parse_settings(document: Mapping[str, object]) -> KafkaSettings:
    """The Kafka settings of a whole configuration document; EngineConfigError."""
    general, consumer, producer = (_properties(name, document.get(name)) for name in SECTIONS)
    return KafkaSettings(
        consumer=_client_properties(consumer, general, "consumer"),
        producer=_client_properties(producer, general, "producer"),
    )


def consumer_config(
    configured: Mapping[str, str], overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A consumer's properties: CONSUMER_DEFAULTS under the configured ones (`general`
    and `consumer`), those under a client's BLPOP settings; fitted()."""
    return fitted({**CONSUMER_DEFAULTS, **configured, **(overrides or {})})


def fitted(config: dict[str, str]) -> dict[str, str]:
    """`config` with `message.max.bytes` lowered to a `fetch.max.bytes` under librdkafka's
    default when the user set only the latter: librdkafka would refuse the consumer
    (`fetch.max.bytes` must be >= `message.max.bytes`), where the user only asked for
    smaller fetch answers (docs/gateway.md, "What scale costs"). Values that are not
    integers are left for librdkafka to refuse."""
    fetch = config.get("fetch.max.bytes", "")
    if "message.max.bytes" not in config and fetch.isdigit() and int(fetch) < REQUEST_BYTES:
        config["message.max.bytes"] = fetch
    return config


def consumer_properties(settings: KafkaSettings) -> dict[str, str]:
    """The properties every consumer is created with (before a client's BLPOP settings):
    CONSUMER_DEFAULTS under the configured ones, fitted()."""
    return consumer_config(settings.consumer)


def describe(settings: KafkaSettings) -> dict[str, object]:
    """The settings for the start-up log line (secrets redacted), with librdkafka's
    version: the same properties mean different things in different versions."""
    import confluent_kafka

    return {
        "librdkafka": confluent_kafka.libversion()[0],
        "consumer": redacted(consumer_properties(settings)),
        "producer": redacted(settings.producer),
    }
