"""Helpers for configuration values that the gateway and every engine share.

Here rather than in `gateway/` because engines need them too, and `backends` never
imports `gateway`: secret redaction for log lines, and Go-style JSON decoding (Rafka
was written in Go and decoded numbers as `json.Number`, keeping their literal text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
