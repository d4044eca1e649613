"""The store's RocksDB layout (spec §5.2, derived scenario 25) and retention."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.dafka.storage import (
    Retention,
    Storage,
    StorageError,
    decode_head_key,
    decode_msg_key,
    head_key,
    msg_key,
    partition_keys,
)

P1 = b"0123456789ABCDEF0123456789ABCDEF"
P2 = b"FEDCBA9876543210FEDCBA9876543210"


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    with Storage(tmp_path / "db") as db:
        yield db


def append(
    storage: Storage,
    subject: bytes,
    partition: bytes,
    first: int,
    contents: list[bytes],
    written_ms: int = 1_000,
) -> None:
    """Store one writer batch for one partition, the way the store writer does."""
    state = storage.partition_state(subject, partition)
    total = state.total if state else 0
    batch = storage.new_batch()
    for offset, content in enumerate(contents):
        batch.put(msg_key(subject, partition, first + offset), content)
        total += len(content)
    keys = partition_keys(subject, partition)
    storage.stage_partition(batch, keys, first + len(contents) - 1, total, written_ms)
    storage.commit(batch)


def sequences(storage: Storage, subject: bytes, partition: bytes) -> list[int]:
    return [seq for seq, _ in storage.read(subject, partition, 0, 2**32)]


# --- scenario 25: keys ---------------------------------------------------------------------


def test_msg_key_bytes_match_the_c_layout() -> None:
    assert msg_key(b"hello", P1, 5) == b"Mhello\0" + P1 + b"\0" + bytes(7) + b"\x05"
    assert decode_msg_key(msg_key(b"hello", P1, 2**64 - 1)) == (b"hello", P1, 2**64 - 1)


def test_head_key_bytes_match_the_c_layout() -> None:
    assert head_key(b"hello", P1) == b"Hhello\0" + P1 + b"\0"
    assert decode_head_key(head_key(b"hello", P1)) == (b"hello", P1)


def test_decoders_reject_other_kinds_of_keys() -> None:
    assert decode_msg_key(head_key(b"hello", P1)) is None
    assert decode_head_key(msg_key(b"hello", P1, 1)) is None
    assert decode_msg_key(b"Mhello") is None
    assert decode_msg_key(b"Mhello\0" + P1 + b"\0\x01") is None  # sequence not 8 bytes
    assert decode_head_key(b"") is None


def test_sequence_with_nul_bytes_decodes() -> None:
    # Big-endian sequences are full of NULs: decoding must split on the first two only.
    assert decode_msg_key(msg_key(b"t", P1, 256)) == (b"t", P1, 256)


def test_key_order_is_sequence_order_heads_first_and_subjects_do_not_interleave() -> None:
    keys = [msg_key(b"ab", P1, 0), msg_key(b"a", P1, 256), msg_key(b"a", P1, 255)]
    keys += [msg_key(b"a", P2, 0), head_key(b"ab", P1), head_key(b"a", P2), head_key(b"a", P1)]
    keys.sort()
    assert keys == [
        head_key(b"a", P1),
        head_key(b"a", P2),
        head_key(b"ab", P1),
        msg_key(b"a", P1, 255),
        msg_key(b"a", P1, 256),
        msg_key(b"a", P2, 0),
        msg_key(b"ab", P1, 0),
    ]


# --- reading -------------------------------------------------------------------------------


def test_read_answers_exactly_the_requested_range(storage: Storage) -> None:
    append(storage, b"hello", P1, 0, [b"r%d" % i for i in range(10)])
    assert list(storage.read(b"hello", P1, 3, 4)) == [
        (3, b"r3"),
        (4, b"r4"),
        (5, b"r5"),
        (6, b"r6"),
    ]
    assert [s for s, _ in storage.read(b"hello", P1, 8, 100)] == [8, 9]
    assert list(storage.read(b"hello", P1, 10, 5)) == []  # above the head
    assert list(storage.read(b"hello", P1, 0, 0)) == []


def test_read_does_not_cross_into_other_partitions_or_subjects(storage: Storage) -> None:
    append(storage, b"a", P1, 0, [b"a1"])
    append(storage, b"a", P2, 0, [b"a2"])
    append(storage, b"ab", P1, 0, [b"ab1"])
    assert list(storage.read(b"a", P1, 0, 10)) == [(0, b"a1")]
    assert list(storage.read(b"a", P1, 1, 10)) == []


def test_heads_are_those_of_the_exact_subject(storage: Storage) -> None:
    append(storage, b"hello", P1, 0, [b"x", b"y"])
    append(storage, b"hello", P2, 0, [b"z"])
    append(storage, b"hello2", P1, 0, [b"other"])
    assert sorted(storage.heads(b"hello")) == [(P1, 1), (P2, 0)]
    assert storage.heads(b"hell") == []
    assert storage.head(b"hello", P1) == 1
    assert storage.head(b"nothing", P1) is None


def test_partition_state_continues_the_byte_total(storage: Storage) -> None:
    assert storage.partition_state(b"t", P1) is None
    append(storage, b"t", P1, 0, [b"abc", b"de"])
    state = storage.partition_state(b"t", P1)
    assert state is not None and (state.head, state.total) == (1, 5)


def test_data_survives_reopen(tmp_path: Path) -> None:
    with Storage(tmp_path / "db") as first:
        append(first, b"t", P1, 0, [b"one", b"two"])
    with Storage(tmp_path / "db", sync=False) as second:
        assert list(second.read(b"t", P1, 0, 10)) == [(0, b"one"), (1, b"two")]
        assert second.heads(b"t") == [(P1, 1)]


def test_a_db_in_use_is_refused_with_its_path(tmp_path: Path) -> None:
    with Storage(tmp_path / "db"), pytest.raises(StorageError, match="cannot open the store DB"):
        Storage(tmp_path / "db")


def test_close_twice_is_harmless(tmp_path: Path) -> None:
    db = Storage(tmp_path / "db")
    db.close()
    db.close()


# --- retention -----------------------------------------------------------------------------


def test_size_retention_keeps_the_newest_records_within_the_limit(storage: Storage) -> None:
    for batch in range(10):  # 10 batches of 10 records of 100 bytes
        append(storage, b"t", P1, batch * 10, [bytes(100)] * 10, written_ms=batch)
    deleted = storage.apply_retention(lambda s: Retention(bytes=2_550), now_ms=100)
    # 25 records fit in 2550 bytes; the cut falls in the middle of a batch.
    assert deleted == 75
    assert storage.tail(b"t", P1) == 75
    assert sequences(storage, b"t", P1) == list(range(75, 100))
    # The base entry keeps the accounting right for the next round and new writes.
    append(storage, b"t", P1, 100, [bytes(100)] * 5, written_ms=11)
    assert storage.apply_retention(lambda s: Retention(bytes=2_550), now_ms=100) == 5
    assert storage.tail(b"t", P1) == 80
    assert storage.apply_retention(lambda s: Retention(bytes=2_550), now_ms=100) == 0


def test_age_retention_deletes_whole_expired_batches(storage: Storage) -> None:
    append(storage, b"t", P1, 0, [b"old"] * 3, written_ms=1_000)
    append(storage, b"t", P1, 3, [b"mid"] * 3, written_ms=2_000)
    append(storage, b"t", P1, 6, [b"new"] * 3, written_ms=3_000)
    policy = Retention(ms=1_500)
    assert storage.apply_retention(lambda s: policy, now_ms=3_000) == 3  # only < 1500 expired
    assert storage.tail(b"t", P1) == 3
    assert storage.apply_retention(lambda s: policy, now_ms=4_000) == 3
    assert sequences(storage, b"t", P1) == [6, 7, 8]


def test_retention_never_deletes_the_head_record(storage: Storage) -> None:
    append(storage, b"t", P1, 0, [b"a", b"b", b"c"], written_ms=1)
    assert storage.apply_retention(lambda s: Retention(ms=0, bytes=0), now_ms=10_000) == 2
    assert list(storage.read(b"t", P1, 0, 10)) == [(2, b"c")]
    assert storage.heads(b"t") == [(P1, 2)]
    assert storage.apply_retention(lambda s: Retention(ms=0, bytes=0), now_ms=10_000) == 0


def test_retention_is_per_subject_and_forever_by_default(storage: Storage) -> None:
    append(storage, b"keep", P1, 0, [b"x"] * 5)
    append(storage, b"trim", P1, 0, [b"x"] * 5)
    policies = {b"trim": Retention(bytes=2)}
    assert storage.apply_retention(lambda s: policies.get(s, Retention()), now_ms=0) == 3
    assert storage.tail(b"keep", P1) == 0
    assert storage.tail(b"trim", P1) == 3


def test_read_below_the_tail_answers_from_the_tail(storage: Storage) -> None:
    append(storage, b"t", P1, 0, [b"r%d" % i for i in range(10)])
    storage.apply_retention(lambda s: Retention(bytes=4 * 2), now_ms=0)
    assert storage.tail(b"t", P1) == 6
    assert list(storage.read(b"t", P1, 0, 2)) == [(6, b"r6"), (7, b"r7")]


def test_retention_gives_the_disk_space_back(tmp_path: Path) -> None:
    def sst_bytes() -> int:
        return sum(f.stat().st_size for f in (tmp_path / "db").glob("*.sst"))

    with Storage(tmp_path / "db", sync=False) as db:
        for batch in range(4):  # 4 MB that does not compress
            append(db, b"t", P1, batch * 1000, [os.urandom(1000) for _ in range(1000)])
        db.flush()
        assert sst_bytes() > 3_000_000
        db.apply_retention(lambda s: Retention(bytes=10_000), now_ms=0)
        assert db.tail(b"t", P1) == 3990
        assert sst_bytes() < 500_000
