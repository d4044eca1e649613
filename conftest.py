"""Shared fixtures: real servers started by the tests themselves."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

from tests.support.tansu import TansuBroker


def pytest_configure(config: pytest.Config) -> None:
    """Send engine and gateway logs through `logging`, so that pytest captures them and
    shows them next to a failing test instead of in the middle of the progress lines."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=False,
    )


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    """One Tansu broker for the whole run; tests use their own random topic names."""
    with TansuBroker() as broker:
        yield broker
