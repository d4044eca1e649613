"""Shared fixtures: real servers started by the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.kafka.tansu import TansuBroker


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    """One Tansu broker for the whole run; tests use their own random topic names."""
    with TansuBroker() as broker:
        yield broker
