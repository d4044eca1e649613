"""The Kafka engine's configuration: librdkafka properties, as Rafka took them.

Values arrive as decoded JSON (from the configuration file or a BLPOP's settings) and
leave as the strings librdkafka wants: a number keeps its literal text, so `1e3` stays
`1e3`, and a boolean becomes `true`/`false`.
"""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import ConsumerCreationError


def property_value(key: str, value: object) -> str:
    """A librdkafka property value as text; raises ValueError for other JSON types."""
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
