"""Shared fixtures: real servers started by the tests themselves (tests/support/fixtures.py)."""

from __future__ import annotations

import logging

import pytest
import structlog

pytest_plugins = ["tests.support.fixtures"]


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
