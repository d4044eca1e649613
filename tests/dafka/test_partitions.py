"""Integer partitions over Dafka addresses, key partitioners, and the `dafka` section."""

from __future__ import annotations

import uuid
import zlib

import pytest

from backends.dafka.partitions import (
    FOREIGN_BASE,
    PartitionMap,
    foreign_number,
    make_partitioner,
    murmur2,
    own_address,
)
from backends.dafka.settings import SettingsError, parse_section

# librdkafka's src/rdmurmur2.c unit test (`java_murmur2_results`): the Java client's values.
JAVA_MURMUR2 = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
    (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424F1C),
    (b"reAmbleWillBeRemoved,ThePrePartThatIs", 0x4A62B377),
    (b"eAmbleWillBeRemoved,ThePrePartThatIs", 0xE0E4E09E),
    (b"AmbleWillBeRemoved,ThePrePartThatIs", 0x62B8B43F),
    (b"", 0x106E08D9),
]


@pytest.mark.parametrize(("key", "expected"), JAVA_MURMUR2)
def test_murmur2_matches_the_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partitioners_pick_what_librdkafka_picks() -> None:
    crc = make_partitioner("consistent_random")
    java = make_partitioner("murmur2_random")
    for key in (b"kafka", b"user-42", b""):
        assert crc(key, 7) == zlib.crc32(key) % 7
        assert java(key, 7) == (murmur2(key) & 0x7FFFFFFF) % 7
    now = [0.0]
    sticky = make_partitioner("consistent_random", clock=lambda: now[0], sticky=0.01)
    picked = []
    for _ in range(6):
        picked.append([sticky(None, 3) for _ in range(4)])
        now[0] += 0.01
    assert all(len(set(burst)) == 1 for burst in picked), "one partition per 10 ms"
    assert [burst[0] for burst in picked] == [0, 1, 2, 0, 1, 2], "then the next one"
    with pytest.raises(ValueError, match="unknown partitioner 'fnv'"):
        make_partitioner("fnv")


def test_numbers_and_addresses_round_trip() -> None:
    numbers = PartitionMap()
    for number in (0, 1, 999):
        address = own_address("orders", number)
        assert numbers.number("orders", address) == number
        assert numbers.address("orders", number) == address
    # The same number of another topic is another partition.
    assert own_address("orders", 1) != own_address("users", 1)
    # A gateway address read under another topic is foreign there, not that number.
    assert numbers.number("users", own_address("orders", 1)) >= FOREIGN_BASE


def test_foreign_partitions_get_stable_numbers_every_gateway_agrees_on() -> None:
    address = uuid.uuid4().hex.upper()
    first, second = PartitionMap(), PartitionMap()
    number = first.number("t", address)
    assert number == second.number("t", address) == foreign_number(address)
    assert FOREIGN_BASE <= number < 2**31, "fits Rafka's signed 32-bit partition parser"
    assert first.address("t", number) == address


def test_settings_defaults_and_overrides() -> None:
    settings = parse_section(None)
    assert (settings.partitions, settings.stores, settings.joined) == (4, 1, False)
    assert settings.group_buffer == 10_000
    assert parse_section({"group_buffer": 800}).group_buffer == 800
    settings = parse_section(
        {
            "partitions": 2,
            "topic_partitions": {"big": 8, "logs.*": 2, "*": 3},
            "tower_sub_address": "tcp://10.0.0.5:5556",
            "settings": {"store/retention/ms": 1000},
        },
        stores=2,
    )
    assert settings.partition_count("big") == 8
    assert settings.partition_count("logs.web") == 2, "glob patterns, the first match"
    assert settings.partition_count("small") == 3
    assert settings.joined
    assert settings.stores == 2
    assert dict(settings.settings) == {"store/retention/ms": "1000"}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"partitions": 0}, "dafka.partitions must be 1..1024, got 0"),
        ({"partitions": "many"}, "dafka.partitions must be an integer"),
        ({"stores": True}, "dafka.stores must be an integer"),
        ({"partitioner": "fnv"}, "dafka.partitioner must be one of"),
        ({"auto_offset_reset": "middle"}, "dafka.auto_offset_reset must be one of"),
        ({"commit_interval": 0}, "dafka.commit_interval must be a finite number > 0"),
        ({"group_buffer": 15}, "dafka.group_buffer must be 16..100000000, got 15"),
        ({"group_buffer": "10k"}, "dafka.group_buffer must be an integer"),
        ({"topic_partitions": {"t": 0}}, "dafka.topic_partitions.t must be 1..1024"),
        ({"settings": {"bad path!": 1}}, "dafka.settings: invalid config path"),
        ({"tower_sub_address": 5}, "dafka.tower_sub_address must be a string"),
        ({"nope": 1}, "unknown setting dafka.nope"),
        ([], "section 'dafka' must be a JSON object"),
    ],
)
def test_bad_settings_name_the_key(section: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_section(section)
