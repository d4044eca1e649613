"""FETCH de-duplication (spec §4.6), shared by the consumer and the store writer.

At most one FETCH per (subject, partition, 100,000-sequence bucket) per second of the
monotonic clock; a FETCH asks for the rest of the bucket. C keeps this in a 10,000-slot
hash table that overwrites on collision, so unrelated partitions can suppress each other's
FETCHes (spec §10.15). Here the key is exact and the table is bounded by evicting the
oldest entries, which only ever lets a duplicate FETCH through, never suppresses one.
"""

from __future__ import annotations

import time

BUCKET = 100_000
MAX_ENTRIES = 10_000


class FetchFilter:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max(1, max_entries)
        # (subject, partition, bucket) -> second of the last FETCH. Insertion order is
        # time order (a refreshed key is re-inserted), so the first entry is the oldest.
        self._seen: dict[tuple[str, str, int], int] = {}

    def should_fetch(
        self, subject: str, partition: str, sequence: int, now_ms: int | None = None
    ) -> int | None:
        """The count to FETCH from `sequence`, or None if an equivalent FETCH went out
        this second. `now_ms` is monotonic milliseconds (defaults to now)."""
        if now_ms is None:
            now_ms = time.monotonic_ns() // 1_000_000
        bucket = sequence // BUCKET
        second = now_ms // 1000
        key = (subject, partition, bucket)
        last = self._seen.pop(key, None)
        self._seen[key] = second
        if last == second:
            return None
        while len(self._seen) > self._max:
            del self._seen[next(iter(self._seen))]
        return (bucket + 1) * BUCKET - sequence

    def __len__(self) -> int:
        return len(self._seen)
