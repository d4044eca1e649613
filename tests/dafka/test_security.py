"""CURVE between Python Dafka peers: authorized keys talk, unknown keys and plain peers are
refused, bad settings name the setting. Real tower, store, producer and consumer over
loopback TCP (CURVE needs a real transport)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.base import EngineOptions, Stats
from backends.dafka.beacon import TowerUnreachable
from backends.dafka.config import Config, ConfigError
from backends.dafka.consumer import Consumer
from backends.dafka.engine import DafkaEngine
from backends.dafka.producer import Producer
from backends.dafka.settings import DafkaSettings
from backends.dafka.store import Store
from backends.dafka.tools.keygen import main as keygen
from backends.dafka.tower import Tower
from tests.support.waiting import wait_until


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """Certificates: the network's server pair, `alice` authorized, `mallory` not."""
    directory = tmp_path / "keys"
    assert keygen([str(directory), "network", "alice", "mallory"]) == 0
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    shutil.copy(directory / "alice.key", authorized / "alice.key")
    return directory


def curve_config(keys: Path, client: str, **values: str | int) -> Config:
    return Config(
        {
            "curve/enabled": 1,
            "curve/server_cert": str(keys / "network.key_secret"),
            "curve/client_cert": str(keys / f"{client}.key_secret"),
            "curve/authorized_dir": str(keys.parent / "authorized"),
            "beacon/address": "127.0.0.1",
            "beacon/interval": 50,
            "producer/head_interval": 100,
            "consumer/offset/reset": "earliest",
            **values,
        }
    )


@pytest.fixture
def secure_tower(keys: Path) -> Iterator[Config]:
    """A CURVE tower on loopback; yields the settings that join it (as alice)."""
    config = curve_config(
        keys,
        "alice",
        **{"tower/sub_address": "tcp://127.0.0.1:*", "tower/pub_address": "tcp://127.0.0.1:*"},
    )
    tower = Tower(config)
    try:
        config.set("beacon/sub_address", tower.sub_endpoint)
        config.set("beacon/pub_address", tower.pub_endpoint)
        yield config
    finally:
        tower.close()


def test_authorized_peers_exchange_records(secure_tower: Config, tmp_path: Path) -> None:
    store_config = secure_tower.copy()
    store_config.set("store/db", str(tmp_path / "db"))
    with Store(store_config):
        consumer = Consumer(secure_tower)
        producer = Producer(secure_tower, "secret-topic")
        try:
            consumer.subscribe("secret-topic")
            producer.publish(b"for alice only")
            wait_until(lambda: producer.unacked_count() == 0, 10, "the store never acked")
            record = consumer.get(10)
            assert record is not None and record.content == b"for alice only"
        finally:
            producer.close(1)
            consumer.close()


def test_unknown_keys_and_plain_peers_cannot_join(secure_tower: Config, keys: Path) -> None:
    mallory = curve_config(keys, "mallory")
    for path in ("beacon/sub_address", "beacon/pub_address"):
        mallory.set(path, secure_tower.get(path))
    mallory.set("beacon/ready_timeout", 500)
    with pytest.raises(TowerUnreachable, match="no Dafka tower answered"):
        Consumer(mallory)
    plain = Config({k: v for k, v in mallory.items() if not k.startswith("curve/")})
    with pytest.raises(TowerUnreachable, match="no Dafka tower answered"):
        Producer(plain, "t")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"curve/server_cert": ""}, "curve/server_cert is not set"),
        ({"curve/client_cert": "/nonexistent/x.key_secret"}, "curve/client_cert: cannot read"),
        ({"curve/authorized_dir": "/nonexistent"}, "curve/authorized_dir: '/nonexistent' is not"),
    ],
)
def test_bad_curve_settings_name_the_setting(
    keys: Path, change: dict[str, str], message: str
) -> None:
    config = curve_config(keys, "alice", **change)
    with pytest.raises(ConfigError, match=message):
        Tower(config)


def test_a_public_certificate_is_not_a_secret_one(keys: Path) -> None:
    config = curve_config(keys, "alice", **{"curve/client_cert": str(keys / "alice.key")})
    config.set("beacon/ready_timeout", 500)
    with pytest.raises(ConfigError, match="holds no secret key"):
        Consumer(config)


def test_the_gateways_embedded_network_runs_with_curve(keys: Path, tmp_path: Path) -> None:
    """CURVE settings in the gateway's `dafka.settings` reach its actors, its tower and its
    stores: records flow, and a node without the keys cannot join the tower."""
    curve = {k: v for k, v in curve_config(keys, "alice").items() if k.startswith("curve/")}
    settings = DafkaSettings(partitions=1, settings=curve)
    options = EngineOptions(data_dir=str(tmp_path / "data"), stop_flush_timeout=0.5)

    async def body() -> str:
        engine = DafkaEngine(Stats(), settings, options)
        await engine.start()
        try:
            producer = engine.producer("s")
            producer.produce("t", None, b"sealed")
            assert await producer.flush(10) == 0
            member = await engine.consumer("g", "c", ["t"], {})
            record = await member.next(10)
            assert record is not None and record.value == b"sealed"
            await member.close()
            plain = Config(
                {k: v for k, v in engine.dafka_config.items() if not k.startswith("curve/")}
            )
            plain.set("beacon/ready_timeout", 500)
            with pytest.raises(TowerUnreachable):
                await asyncio.to_thread(Consumer, plain)
            return engine.dafka_config.get("beacon/pub_address")
        finally:
            await engine.stop()

    tower = asyncio.run(asyncio.wait_for(body(), 60))
    assert (tmp_path / "data" / "towerd.cfg").exists()
    stored = Config.load(tmp_path / "data" / "store-0" / "stored.cfg")
    assert stored.get("curve/enabled") == "1"
    assert tower.startswith("tcp://127.0.0.1:")
