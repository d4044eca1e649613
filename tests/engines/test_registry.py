"""backends.registry: what every engine module gives the gateway, more than once a process."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from backends.base import Admin, EngineOptions
from backends.registry import engine_entry


@pytest.mark.parametrize("name", ["dafka", "kafka"])
def test_an_admin_can_be_made_again_after_its_module_is_imported(name: str) -> None:
    """Each gateway's metrics make an Admin; rafka-topics' tests import the engines'
    `admin` submodules, which once rebound the package's `admin` function to the module."""
    importlib.import_module(f"backends.{name}.admin")
    entry = engine_entry(name)
    settings = entry.parse_settings({})
    for _ in range(2):
        admin = entry.admin(settings, EngineOptions())
        assert isinstance(admin, Admin)
        asyncio.run(admin.close())
