"""RecordBatch, the engine interface's records in columns: it must read exactly as the
list of Records it stands for (the gateway and the contract tests treat both alike)."""

from __future__ import annotations

import pytest

from backends.base import Record, RecordBatch

RECORDS = [
    Record("a", 0, 7, None, b"x", 1),
    Record("a", 1, 3, b"k", None, None),
    Record("b", 0, 0, None, b"", 5),
]


def test_a_batch_reads_as_the_records_it_holds() -> None:
    batch = RecordBatch.of(RECORDS)
    assert len(batch) == 3 and bool(batch)
    # The list on the left too: list.__eq__ gives way to RecordBatch.__eq__.
    assert list(batch) == RECORDS and batch == RECORDS and RECORDS == batch  # noqa: SIM300
    assert [batch[i] for i in range(3)] == RECORDS and batch[-1] == RECORDS[-1]
    assert batch[1:] == RECORDS[1:] and isinstance(batch[1:], RecordBatch)
    assert batch != RECORDS[:2] and batch != [*RECORDS[:2], RECORDS[0]]
    assert RecordBatch.of([]) == [] and not RecordBatch.of([])
    with pytest.raises(IndexError):
        batch[3]
    with pytest.raises(TypeError):
        hash(batch)


def test_joined_batches_keep_their_order() -> None:
    batch = RecordBatch.of(RECORDS)
    assert RecordBatch.joined([batch[2:], batch[:2]]) == [RECORDS[2], *RECORDS[:2]]
    assert RecordBatch.of(batch) is batch
