"""Fixtures of the Dafka engine tests: a fresh inproc tower per test, loopback only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from backends.dafka.config import Config
from backends.dafka.test_peer import TestPeer
from backends.dafka.tower import Tower


def make_config(tmp_path: Path) -> Config:
    """A config for one test: its own inproc tower endpoints, fast timers, loopback only."""
    name = uuid.uuid4().hex
    sub = f"inproc://dafka-{name}-tower-sub"
    pub = f"inproc://dafka-{name}-tower-pub"
    return Config(
        {
            "tower/sub_address": sub,
            "tower/pub_address": pub,
            "beacon/sub_address": sub,
            "beacon/pub_address": pub,
            "beacon/interval": 50,
            "beacon/address": "127.0.0.1",  # never advertise (or bind) another interface
            "beacon/ready_timeout": 5000,
            "producer/head_interval": 100,
            "store/db": str(tmp_path / "storedb"),
        }
    )


@pytest.fixture
def dafka_config(tmp_path: Path) -> Config:
    return make_config(tmp_path)


@pytest.fixture
def tower(dafka_config: Config) -> Iterator[Tower]:
    """A running tower on the inproc endpoints of `dafka_config` (shared context)."""
    tower = Tower(dafka_config, zmq.Context.instance())
    try:
        yield tower
    finally:
        tower.close()


@pytest.fixture
def test_peer(dafka_config: Config, tower: Tower) -> Iterator[TestPeer]:
    """A fake node on the test's tower (spec §8)."""
    peer = TestPeer(dafka_config, zmq.Context.instance())
    try:
        yield peer
    finally:
        peer.close()
