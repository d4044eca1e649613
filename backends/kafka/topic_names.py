"""Kafka's rule for topic names (kafka.common.internals.Topic): what a broker can hold."""

from __future__ import annotations

import re

LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def is_legal(name: str) -> bool:
    return name not in (".", "..") and LEGAL_NAME.fullmatch(name) is not None
