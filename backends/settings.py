"""Helpers for configuration values that the gateway and every engine share.

Here rather than in `gateway/` because engines need them too, and `backends` never
imports `gateway`: secret redaction for log lines, Go-style JSON decoding (Rafka was
written in Go and decoded numbers as `json.Number`, keeping their literal text), and the
integer check of such a document's values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TypeVar

REDACTED = "[redacted]"
# Substrings (lower case) of setting names whose values must never reach a log line.
SECRET_MARKERS = ("password", "secret", "sasl.oauthbearer", "ssl.key", "token")

V = TypeVar("V")


def is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redacted(settings: Mapping[str, V]) -> dict[str, V | str]:
    """A copy of `settings` that is safe to log: every secret's value replaced."""
    return {name: (REDACTED if is_secret(name) else value) for name, value in settings.items()}


class JsonNumber(str):
    """A JSON number kept as its literal text (so 1e3 and 10000000000000000001 survive)."""


def json_decoder() -> json.JSONDecoder:
    """A decoder that keeps numbers as `JsonNumber`, as Go's `UseNumber()` does."""
    return json.JSONDecoder(parse_int=JsonNumber, parse_float=JsonNumber)


def json_int(
    where: str, value: object, minimum: int, maximum: int | None, error: Callable[[str], Exception]
) -> int:
    """`value` of a decoded document (an int, or a JsonNumber; never a bool) as an integer
    in minimum..maximum (no upper bound: None), else raises `error(text)`, the text naming
    `where`."""
    if isinstance(value, bool) or not isinstance(value, JsonNumber | int):
        raise error(f"{where} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise error(f"{where} must be an integer, got {value}") from None
    if number < minimum or (maximum is not None and number > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise error(f"{where} must be >= {minimum}{upper}, got {number}")
    return number
