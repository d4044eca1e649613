"""The store's RocksDB: key layout of spec §5.2, the write-time index, and retention.

The DB is opened in rocksdict raw mode (bytes keys and values, default bytewise
comparator), so the iteration order is the one of the C store's LevelDB.

Key families (all sequence numbers are 8 bytes big-endian):

``H<subject>\\0<partition>\\0``            -> last contiguously stored sequence (8 bytes)
``M<subject>\\0<partition>\\0<seq>``       -> record content (raw bytes)
``T<subject>\\0<partition>\\0<seq>``       -> write index entry (ours, not in the C store):
                                              ``written_ms`` (8 bytes) + ``total`` (8 bytes)

``H`` and ``M`` are exactly the C layout.  ``T`` exists for retention: the writer puts one
``T`` entry per partition per batch, keyed by the highest sequence of the batch, holding the
wall-clock time of the write and the running total of content bytes of the partition through
that sequence.  The records of one entry are those above the previous entry's sequence.  An
entry whose sequence is below the partition's tail (the oldest retained record) is the *base*
left by retention: its total is the byte count of the records deleted so far, so the retained
size of a partition is ``last total - base total`` without reading any record.

Retention (like Kafka's ``retention.ms`` / ``retention.bytes``, both per partition) deletes
whole records from the tail of a partition, never the head record, so a producer's ACKed
head and the partition itself stay known.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, cast

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

_SEQ = struct.Struct(">Q")
_TIME_INDEX = struct.Struct(">QQ")
pack_seq = _SEQ.pack
MAX_SEQUENCE = 2**64 - 1


# --- keys (spec §5.2) ---------------------------------------------------------------------


def partition_prefix(kind: bytes, subject: bytes, partition: bytes) -> bytes:
    """``<kind><subject>\\0<partition>\\0``: the common prefix of a partition's keys."""
    return kind + subject + b"\0" + partition + b"\0"


def msg_key(subject: bytes, partition: bytes, sequence: int) -> bytes:
    return b"M" + subject + b"\0" + partition + b"\0" + pack_seq(sequence)


def head_key(subject: bytes, partition: bytes) -> bytes:
    return b"H" + subject + b"\0" + partition + b"\0"


def index_key(subject: bytes, partition: bytes, sequence: int) -> bytes:
    return b"T" + subject + b"\0" + partition + b"\0" + pack_seq(sequence)


class PartitionKeys(NamedTuple):
    """What `Storage.stage_partition` writes a partition's head under."""

    head: bytes  # `head_key`
    index_prefix: bytes  # `index_key` without its sequence


def partition_keys(subject: bytes, partition: bytes) -> PartitionKeys:
    return PartitionKeys(head_key(subject, partition), partition_prefix(b"T", subject, partition))


def _split(key: bytes, kind: int) -> tuple[bytes, bytes, bytes] | None:
    """Split ``<kind><subject>\\0<partition>\\0<rest>``; None when not that kind of key."""
    if not key or key[0] != kind:
        return None
    first = key.find(b"\0", 1)
    if first < 0:
        return None
    second = key.find(b"\0", first + 1)
    if second < 0:
        return None
    return key[1:first], key[first + 1 : second], key[second + 1 :]


def decode_msg_key(key: bytes) -> tuple[bytes, bytes, int] | None:
    """(subject, partition, sequence) of a message key, None for any other key."""
    parts = _split(key, ord("M"))
    if parts is None or len(parts[2]) != 8:
        return None
    return parts[0], parts[1], _SEQ.unpack(parts[2])[0]


def decode_head_key(key: bytes) -> tuple[bytes, bytes] | None:
    """(subject, partition) of a head key, None for any other key."""
    parts = _split(key, ord("H"))
    if parts is None or parts[2]:
        return None
    return parts[0], parts[1]


def _next_prefix(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix`` (prefix ends with NUL)."""
    return prefix[:-1] + b"\x01"


# --- retention policy ---------------------------------------------------------------------


class StorageError(OSError):
    """The DB cannot be opened (missing permissions, or another store holds it, or it is
    corrupt): an OSError, which the programs report as one line (tools.run)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """Per-partition limits; -1 keeps forever (Kafka's retention.ms / retention.bytes)."""

    ms: int = -1
    bytes: int = -1

    @property
    def forever(self) -> bool:
        return self.ms < 0 and self.bytes < 0


@dataclass(slots=True)
class PartitionState:
    """What the writer needs to continue a partition: its head and byte total."""

    head: int
    total: int


class Storage:
    """One RocksDB shared by the store's writer and reader threads (RocksDB is thread-safe).

    Subjects and partitions are bytes everywhere in this class.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = True) -> None:
        self.path = os.fspath(path)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            self._db = Rdict(self.path, options=options)
        except Exception as exc:  # rocksdict raises plain Exception (e.g. the DB is locked)
            raise StorageError(f"cannot open the store DB {self.path!r}: {exc}") from exc
        self._write_options = WriteOptions()
        # sync=True: the write returns only after the WAL is fsynced, so an ACK sent after
        # commit() survives an OS crash, not just a process crash (fixes spec §10.18).
        self._write_options.sync = sync
        self.sync = sync
        self._closed = False

    # --- writer -------------------------------------------------------------------------

    @staticmethod
    def new_batch() -> WriteBatch:
        return WriteBatch(raw_mode=True)

    @staticmethod
    def stage_partition(
        batch: WriteBatch, keys: PartitionKeys, head: int, total: int, written_ms: int
    ) -> None:
        """Stage the head key and the write index entry of one partition touched by a batch,
        under its `partition_keys`. Called once per partition per batch (not per record,
        fixing spec §10.5): a store's batches over 1,000 partitions stage about one a
        record, and building the keys each time made it 0.64 us a partition against 0.30."""
        sequence = pack_seq(head)
        batch.put(keys.head, sequence)
        batch.put(keys.index_prefix + sequence, _TIME_INDEX.pack(written_ms, total))

    def commit(self, batch: WriteBatch) -> None:
        """Write a batch atomically; with ``sync`` it is on disk when this returns."""
        self._db.write(batch, self._write_options)

    def partition_state(self, subject: bytes, partition: bytes) -> PartitionState | None:
        """Head and running byte total of a partition, None if nothing is stored."""
        raw = self._db.get(head_key(subject, partition))
        if raw is None:
            return None
        head = _SEQ.unpack(raw)[0]
        entry = self._db.get(index_key(subject, partition, head))
        total = _TIME_INDEX.unpack(entry)[1] if entry is not None else 0
        return PartitionState(head, total)

    def _items(self, start: bytes, options: ReadOptions) -> Iterator[tuple[bytes, bytes]]:
        """Raw (key, value) pairs from ``start``.  RocksDB keeps only a pointer to the
        bounds in ``options``: the caller must keep ``options`` alive while iterating."""
        return cast(Iterator[tuple[bytes, bytes]], self._db.items(from_key=start, read_opt=options))

    # --- reader -------------------------------------------------------------------------

    def head(self, subject: bytes, partition: bytes) -> int | None:
        raw = self._db.get(head_key(subject, partition))
        return None if raw is None else _SEQ.unpack(raw)[0]

    def heads(self, subject: bytes) -> list[tuple[bytes, int]]:
        """(partition, head) of every partition of exactly this subject (fixes §10.11)."""
        prefix = b"H" + subject + b"\0"
        options = ReadOptions()
        options.set_iterate_upper_bound(_next_prefix(prefix))
        start = len(prefix)
        return [
            (key[start:-1], _SEQ.unpack(value)[0]) for key, value in self._items(prefix, options)
        ]

    def tail(self, subject: bytes, partition: bytes) -> int | None:
        """The lowest retained sequence of a partition, None if nothing is stored."""
        prefix = partition_prefix(b"M", subject, partition)
        it = self._db.iter()
        it.seek(prefix)
        if not it.valid():
            return None
        key = cast(bytes, it.key())
        if not key.startswith(prefix):
            return None
        return int(_SEQ.unpack_from(key, len(prefix))[0])

    def read(
        self, subject: bytes, partition: bytes, sequence: int, count: int
    ) -> Iterator[tuple[int, bytes]]:
        """Records ``first … first+count-1`` in order, where ``first`` is ``sequence``, or
        the partition's tail when ``sequence`` is below it (retention).  Nothing when
        ``sequence`` is above the head.  The iterator is a consistent view of the DB.
        """
        if count <= 0:
            return
        prefix = partition_prefix(b"M", subject, partition)
        it = self._db.iter()
        it.seek(prefix + pack_seq(sequence))
        if not it.valid():
            return
        found = cast(bytes, it.key())
        if not found.startswith(prefix):
            return
        first = _SEQ.unpack_from(found, len(prefix))[0]
        end = first + count
        # RocksDB keeps only a pointer to the bound: ``options`` must outlive the
        # iteration, which it does as a local of this generator.
        options = ReadOptions()
        options.set_iterate_upper_bound(
            prefix + pack_seq(end) if end <= MAX_SEQUENCE else _next_prefix(prefix)
        )
        start = len(prefix)
        for key, value in self._items(prefix + pack_seq(first), options):
            yield _SEQ.unpack_from(key, start)[0], value

    # --- retention ----------------------------------------------------------------------

    def partitions(self) -> Iterator[tuple[bytes, bytes, int]]:
        """(subject, partition, head) of every stored partition, from the head keys."""
        options = ReadOptions()
        options.set_iterate_upper_bound(b"I")
        for key, value in self._items(b"H", options):
            parts = decode_head_key(key)
            if parts is not None:
                yield parts[0], parts[1], _SEQ.unpack(value)[0]

    def apply_retention(self, policy_for: Callable[[bytes], Retention], now_ms: int) -> int:
        """Trim every partition to its subject's policy; returns the records deleted."""
        deleted = 0
        for subject, partition, head in self.partitions():
            policy = policy_for(subject)
            if not policy.forever:
                deleted += self.trim(subject, partition, head, policy, now_ms)
        return deleted

    def trim(
        self, subject: bytes, partition: bytes, head: int, policy: Retention, now_ms: int
    ) -> int:
        """Delete the oldest records of one partition beyond ``policy``; never ``head``.

        Safe while the writer runs: the writer only adds records above ``head``, and the
        index entry at ``head`` stays.  The work is proportional to what gets deleted.
        """
        tail = self.tail(subject, partition)
        if tail is None or tail >= head:
            return 0
        mprefix = partition_prefix(b"M", subject, partition)
        tprefix = partition_prefix(b"T", subject, partition)
        last = self._db.get(tprefix + pack_seq(head))
        if last is None:
            return 0  # no write index (not written by this module): nothing to go by
        base_total = 0
        for seq, _, total in self._index(tprefix):
            if seq >= tail:
                break
            base_total = total  # the base entry left by an earlier trim
        cut = tail - 1  # delete tail … cut
        if policy.ms >= 0:
            expiry = now_ms - policy.ms
            for seq, written_ms, _ in self._index(tprefix, tail):
                if written_ms >= expiry:
                    break
                cut = seq  # capped below so that the head record stays
        if policy.bytes >= 0:
            excess = _TIME_INDEX.unpack(last)[1] - base_total - policy.bytes
            if excess > 0:
                cut = max(cut, self._size_cut(mprefix, tprefix, tail, base_total, excess))
        cut = min(cut, head - 1)
        if cut < tail:
            return 0
        written_ms, total = self._total_through(mprefix, tprefix, cut)
        batch = self.new_batch()
        batch.delete_range(mprefix + pack_seq(tail), mprefix + pack_seq(cut + 1))
        # Keep the index consistent: drop the entries wholly below the cut and leave a base
        # entry at the cut carrying the byte total of everything deleted so far.
        batch.delete_range(tprefix, tprefix + pack_seq(cut))
        batch.put(tprefix + pack_seq(cut), _TIME_INDEX.pack(written_ms, total))
        self._db.write(batch, self._write_options)
        # Give the disk space back now: RocksDB's own compactions may leave a range
        # tombstone over old data for a long time.  (It runs without the GIL.)
        self._db.compact_range(mprefix + pack_seq(tail), mprefix + pack_seq(cut + 1))
        return cut - tail + 1

    def _index(self, tprefix: bytes, start: int = 0) -> Iterator[tuple[int, int, int]]:
        """(sequence, written_ms, total) of the index entries from ``start``, oldest first."""
        options = ReadOptions()
        options.set_iterate_upper_bound(_next_prefix(tprefix))
        offset = len(tprefix)
        for key, value in self._items(tprefix + pack_seq(start), options):
            written_ms, total = _TIME_INDEX.unpack(value)
            yield _SEQ.unpack_from(key, offset)[0], written_ms, total

    def _records(self, mprefix: bytes, first: int, last: int) -> Iterator[tuple[int, bytes]]:
        options = ReadOptions()
        options.set_iterate_upper_bound(mprefix + pack_seq(last + 1))
        offset = len(mprefix)
        for key, value in self._items(mprefix + pack_seq(first), options):
            yield _SEQ.unpack_from(key, offset)[0], value

    def _size_cut(
        self, mprefix: bytes, tprefix: bytes, tail: int, base_total: int, excess: int
    ) -> int:
        """The smallest sequence x such that deleting tail … x frees ``excess`` bytes."""
        first = tail
        freed = 0
        for seq, _, total in self._index(tprefix, tail):
            if total - base_total >= excess:
                # The cut falls inside this entry: read its records until enough is freed.
                for sequence, content in self._records(mprefix, first, seq):
                    freed += len(content)
                    if freed >= excess:
                        return sequence
                return seq
            first = seq + 1
            freed = total - base_total
        return first - 1

    def _total_through(self, mprefix: bytes, tprefix: bytes, cut: int) -> tuple[int, int]:
        """(written_ms, byte total) of the records through ``cut``, for the base entry."""
        for seq, written_ms, total in self._index(tprefix, cut):
            if seq == cut:
                return written_ms, total
            # ``cut`` is inside this entry: subtract its records cut+1 … seq, which stay.
            kept = sum(len(content) for _, content in self._records(mprefix, cut + 1, seq))
            return written_ms, total - kept
        raise AssertionError("the index entry at the head always exists")

    # --- deletion (rafka-topics --delete) ---------------------------------------------

    def stage_delete_topic(
        self,
        batch: WriteBatch,
        subject: bytes,
        states: dict[bytes, PartitionState],
        through: Mapping[bytes, int],
        written_ms: int,
    ) -> None:
        """Stage the deletion of the records of ``subject`` that a deletion saw: of each
        partition of ``states`` (partition -> its head and byte total, records staged in
        ``batch`` included), those up to ``through[partition]`` (the head the deleting
        tool saw). Records past it, and the partitions it did not see, were written after
        the deletion and stay (they bring the topic back: ``catalog.is_gone``); deleting
        them lost records a store had acknowledged (a store back-filling the topic's
        newest records before the deletion, or a record written while the tool read the
        heads).

        The head keys stay, and each partition keeps a base index entry where its
        deleted records end, as ``trim`` leaves one: a partition written again continues
        after its head (offsets are never reused, and the other stores' copies of the
        deleted records are never fetched back), and its retained size counts only what
        comes after. Where records stay, that entry's total leaves out only the kept
        records already written (not those staged in ``batch``): retention may keep a
        little more than its bound, never less.
        """
        for partition, state in states.items():
            cut = min(through.get(partition, -1), state.head)  # all of it, at most
            if cut < 0:
                continue
            mprefix = partition_prefix(b"M", subject, partition)
            tprefix = partition_prefix(b"T", subject, partition)
            kept = sum(len(content) for _, content in self._records(mprefix, cut + 1, state.head))
            batch.delete_range(mprefix, mprefix + pack_seq(cut + 1))
            batch.delete_range(tprefix, tprefix + pack_seq(cut + 1))
            batch.put(tprefix + pack_seq(cut), _TIME_INDEX.pack(written_ms, state.total - kept))

    def partition_states(self, subject: bytes) -> dict[bytes, PartitionState]:
        """Head and byte total of every stored partition of ``subject``."""
        states: dict[bytes, PartitionState] = {}
        for partition, _ in self.heads(subject):
            state = self.partition_state(subject, partition)
            if state is not None:
                states[partition] = state
        return states

    def delete_topic(self, subject: bytes, written_ms: int) -> int:
        """Delete every record of ``subject`` now (see ``stage_delete_topic``); returns
        the number of partitions it had. The store's writer stages the deletion in its
        own batch instead, so that records it holds in memory are covered too."""
        states = self.partition_states(subject)
        batch = self.new_batch()
        every = {partition: state.head for partition, state in states.items()}
        self.stage_delete_topic(batch, subject, states, every, written_ms)
        self.commit(batch)
        self.compact_topic(subject)
        return len(states)

    def compact_topic(self, subject: bytes) -> None:
        """Give the disk space of deleted records back now (RocksDB's own compactions
        may keep range tombstones over old data for a long time)."""
        for kind in (b"M", b"T"):
            prefix = kind + subject + b"\0"
            self._db.compact_range(prefix, _next_prefix(prefix))

    def records(self, subject: bytes, partition: bytes) -> Iterator[tuple[int, bytes]]:
        """Every retained record of a partition, oldest first."""
        prefix = partition_prefix(b"M", subject, partition)
        options = ReadOptions()
        options.set_iterate_upper_bound(_next_prefix(prefix))
        offset = len(prefix)
        for key, value in self._items(prefix, options):
            yield _SEQ.unpack_from(key, offset)[0], value

    def flush(self) -> None:
        """Move the memtable into SST files (the WAL already makes writes durable)."""
        self._db.flush()

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the DB once; later calls do nothing."""
        if not self._closed:
            self._closed = True
            self._db.close()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
