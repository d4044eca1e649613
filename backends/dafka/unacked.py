"""A producer's records that no store has acknowledged yet (spec §3), fixing §10.9.

Records are numbered from 0 in push order. ACK(n) releases every record <= n; FETCH answers
come from `records`. C's chunk list returned the wrong contents after a partial ACK; here
the records live in one list with a moving head, so lookup by sequence is O(1) and the
contents always belong to their sequence.
"""

from __future__ import annotations

from collections.abc import Iterator

_COMPACT_AT = 4096  # drop released slots once there are this many and they are the majority


class UnackedList:
    def __init__(self, first_sequence: int = 0) -> None:
        self._records: list[bytes] = []
        self._head = 0  # index in _records of the first unacked record
        self._first_seq = first_sequence  # sequence of _records[_head]
        self._last_acked = first_sequence - 1

    @property
    def first_sequence(self) -> int:
        """Sequence of the oldest unacked record (= next_sequence when empty)."""
        return self._first_seq

    @property
    def next_sequence(self) -> int:
        """The sequence the next `push` returns."""
        return self._first_seq + len(self._records) - self._head

    @property
    def last_acked(self) -> int:
        """Highest pushed sequence acknowledged so far; -1 before any useful ACK."""
        return self._last_acked

    def __len__(self) -> int:
        return len(self._records) - self._head

    def push(self, content: bytes) -> int:
        """Keep `content` until acknowledged; returns its sequence."""
        self._records.append(content)
        return self._first_seq + len(self._records) - self._head - 1

    def extend(self, contents: list[bytes]) -> int:
        """`push` each of `contents`, in order; returns the first one's sequence."""
        first = self._first_seq + len(self._records) - self._head
        self._records.extend(contents)
        return first

    def ack(self, sequence: int) -> None:
        """Release every record <= `sequence`; older or duplicate ACKs change nothing."""
        if sequence < self._first_seq:
            return
        release = min(sequence - self._first_seq + 1, len(self))
        if release == 0:
            return
        self._head += release
        self._first_seq += release
        self._last_acked = self._first_seq - 1
        if self._head == len(self._records):
            self._records.clear()
            self._head = 0
        elif self._head >= _COMPACT_AT and self._head * 2 >= len(self._records):
            del self._records[: self._head]
            self._head = 0

    def records(self, sequence: int, count: int) -> Iterator[tuple[int, bytes]]:
        """Up to `count` unacked records from `sequence` on, in order. Nothing when
        `sequence` is already acknowledged: the stores must answer that FETCH."""
        if sequence < self._first_seq or count <= 0:
            return
        start = self._head + sequence - self._first_seq
        yield from enumerate(self._records[start : start + count], sequence)
