"""Which DIRECT_HEADs a store reader pushes to earliest consumers, and when (issue 7).

A C consumer asks the stores for heads only when it subscribes (GET_HEADS) and when it
meets a store reader (CONSUMER_HELLO). A partition it missed the producer of (its
RECORDs and HEADs left before the consumer's subscription reached the producer, or the
producer is connected through another tower) and that the stores had not committed yet
when they answered is never fetched. Wire compatibly, the store covers for it: for
`duration` ms after a partition changed, every `interval` ms, its reader sends a
DIRECT_HEAD of that partition to each consumer that asked for heads of its topic. Only
earliest consumers ask (a latest one sends CONSUMER_HELLO with no subjects and never
GET_HEADS), and what they already have costs them nothing: a DIRECT_HEAD at or below
their offset is ignored.

Cost per interval: one DIRECT_HEAD (77 bytes + topic) per (partition changed in the last
`duration` ms, consumer watching its topic). A partition written continuously is pushed
once per interval, like its producer's HEAD; one written once, duration / interval times.

Threads: the writer calls `changed()` after each committed batch; the reader calls the
rest. `watching` is read by the writer without the lock: a consumer registered just
after the writer looked had its GET_HEADS answered from the database, after the commit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

# (consumer, topic) registrations kept: each costs a DIRECT_HEAD per changed partition,
# so a flood of GET_HEADS from made-up consumers must not grow it without bound.
MAX_WATCHES = 10_000

Push = tuple[str, str, str, int]  # (consumer uuid, subject, partition uuid, head)


class HeadPush:
    def __init__(self, interval_ms: int, duration_ms: int, max_watches: int = MAX_WATCHES) -> None:
        self.interval = max(0, interval_ms)
        self.duration = max(0, duration_ms)
        self.enabled = self.interval > 0 and self.duration > 0
        self.max_watches = max_watches
        self.watching = False
        self._lock = threading.Lock()
        self._changes: dict[tuple[str, str], int] = {}  # (subject, partition) -> head
        self._watches: dict[tuple[str, str], None] = {}  # (consumer, subject), oldest first
        self._by_subject: dict[str, dict[str, None]] = {}
        self._by_consumer: dict[str, set[str]] = {}
        self._active: dict[tuple[str, str], tuple[int, int]] = {}  # -> (head, until ms)

    # --- writer thread --------------------------------------------------------------------

    def changed(self, heads: Iterable[tuple[str, str, int]]) -> None:
        """Partitions (subject, partition, new head) the writer just committed."""
        with self._lock:
            for subject, partition, head in heads:
                self._changes[(subject, partition)] = head

    # --- reader thread --------------------------------------------------------------------

    def watch(self, consumer: str, subject: str) -> None:
        """`consumer` asked for heads of `subject` (GET_HEADS or CONSUMER_HELLO).

        The empty subject is a store writer asking for every subject: it catches up with
        its own periodic GET_HEADS and is not a consumer to push to.
        """
        if not self.enabled or not subject or not consumer or "\0" in consumer:
            return
        key = (consumer, subject)
        if key in self._watches:
            del self._watches[key]  # renewed: it moves to the young end
        elif len(self._watches) >= self.max_watches:
            self._unwatch(next(iter(self._watches)))
        self._watches[key] = None
        self._by_subject.setdefault(subject, {})[consumer] = None
        self._by_consumer.setdefault(consumer, set()).add(subject)
        self.watching = True

    def forget(self, consumer: str) -> None:
        """`consumer` is gone (its SUB left our XPUB): push nothing more to it."""
        for subject in list(self._by_consumer.get(consumer, ())):
            self._unwatch((consumer, subject))

    def _unwatch(self, key: tuple[str, str]) -> None:
        consumer, subject = key
        del self._watches[key]
        consumers = self._by_subject[subject]
        del consumers[consumer]
        if not consumers:
            del self._by_subject[subject]
        subjects = self._by_consumer[consumer]
        subjects.discard(subject)
        if not subjects:
            del self._by_consumer[consumer]
        self.watching = bool(self._watches)

    def due(self, now: int) -> list[Push]:
        """The DIRECT_HEADs to send now; call every `interval` ms (`now`: ms clock)."""
        with self._lock:
            changes, self._changes = self._changes, {}
        by_subject = self._by_subject
        for key, head in changes.items():
            if key[0] in by_subject:
                self._active[key] = (head, now + self.duration)
        pushes: list[Push] = []
        for key, (head, until) in list(self._active.items()):
            subject, partition = key
            consumers = by_subject.get(subject)
            if now > until or consumers is None:
                del self._active[key]
                continue
            pushes.extend((consumer, subject, partition, head) for consumer in consumers)
        return pushes
