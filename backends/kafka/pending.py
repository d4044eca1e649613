"""Records accepted during one event-loop pass, handed to librdkafka in one call per topic.

Why: with `queue.buffering.max.ms` 0 (Rafka's configuration) librdkafka's broker thread
sends whatever it holds as soon as a record arrives. One produce() per RPUSHX, each ~3 us
of Python apart, left in requests of a few records each, and the broker and librdkafka
paid per request several times what they pay per record in large ones. Records accepted
during one pass (every command of every connection read in it) now reach librdkafka in
one `produce_batch()` per topic at the next pass (or sooner: before a DUMP waits, before
a record that must go alone, at close), so they leave together; a batch of keyless
records with the partition librdkafka chose last, with which it leaves in fewer, larger
requests (backends.kafka.sticky).

What must not change, and how it holds:
- RPUSHX answers how many records were queued, or refuses at once. A record is only
  deferred when librdkafka is sure to take it: `room` bounds what its queue can still take
  (`queue.buffering.max.messages` and `.kbytes` against what it holds, `len()`; only the
  loop thread adds to it, so room only grows meanwhile), its size is well under
  `message.max.bytes`, and its topic has had a record delivered (`known`): librdkafka
  refuses a topic it knows is missing (`Local: Unknown topic`) at produce() time, so a
  topic not known yet goes through produce() as before. Anything else goes through
  produce() after the pending records (order kept), with its refusal as before.
- Order per partition: records of one topic keep their order in the batch, and a record
  that goes alone is produced after the pending ones.
- DUMP: a deferred record counts as produced (outstanding) when accepted; its delivery
  callback is the same as produce()'s.
- A batch that librdkafka still refuses (a topic deleted meanwhile, a producer closed):
  its records count as delivery errors, each logged, and the topic is no longer `known`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError

from backends.kafka.sticky import UNASSIGNED, Learner, StickyPartitions

# librdkafka's defaults for the properties bounding its queue and its records.
_DEFAULT_MAX_MESSAGES = 100_000
_DEFAULT_MAX_KBYTES = 1_048_576
_DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
_DEFAULT_STICKY_LINGER_MS = 10
# Bytes of a record's wire size beyond its key and value that librdkafka adds before
# comparing with message.max.bytes (its v2 overhead is well under this).
_WIRE_MARGIN = 1024


class Owner(Protocol):
    """The producer handle a deferred record belongs to (backends.kafka.producer)."""

    def settle(self, count: int) -> None: ...

    def note_refused(self, error: str, topic: str, value: bytes) -> None: ...


def _int(config: Mapping[str, Any], name: str, default: int) -> int:
    try:
        return int(str(config.get(name, default)))
    except ValueError:  # librdkafka has refused the configuration already
        return default


class Pending:
    """The records deferred to the next `send()`, and the room librdkafka surely has."""

    def __init__(
        self, rd: Any, config: Mapping[str, Any], on_sent: Callable[[], None] = lambda: None
    ) -> None:
        self._rd = rd
        self._on_sent = on_sent  # called after each send() that handed records over
        self._max_messages = _int(config, "queue.buffering.max.messages", _DEFAULT_MAX_MESSAGES)
        self._max_bytes = _int(config, "queue.buffering.max.kbytes", _DEFAULT_MAX_KBYTES) * 1024
        # Records at most this large (key and value) are deferred.
        self.max_size = _int(config, "message.max.bytes", _DEFAULT_MESSAGE_MAX_BYTES) - _WIRE_MARGIN
        # Topics that had a record delivered: librdkafka knows them (written by the thread
        # serving callbacks, read by the loop; set operations are atomic under the GIL).
        self.known: set[str] = set()
        self._batches: dict[str, list[dict[str, Any]]] = {}
        self._keyed: set[str] = set()  # topics with a keyed record among the deferred
        # librdkafka's `random` partitioner places each keyless record anew: no stickiness.
        linger = _int(config, "sticky.partitioning.linger.ms", _DEFAULT_STICKY_LINGER_MS)
        if config.get("partitioner") == "random":
            linger = 0
        self.sticky = StickyPartitions(linger / 1000)
        self._count = 0
        self._bytes = 0
        self._largest = 0  # the largest record deferred so far: bounds what the queue holds
        self._room_count = 0  # as of the last look at librdkafka's queue
        self._room_bytes = 0
        self._scheduled = False
        self._closed = False

    def close(self) -> None:
        """Send what is deferred and defer nothing more (the producer is closing)."""
        self.send()
        self._closed = True
        self._room_count = self._room_bytes = 0

    def take(
        self, topic: str, key: bytes | None, value: bytes, size: int, callback: Callable[..., None]
    ) -> bool:
        """Defer one record if librdkafka is sure to take it; False: produce it alone.
        defer() for one value, without its list (0.3 us less an unpipelined RPUSHX)."""
        if not self.reserve(1, size, size):
            return False
        if key is None:
            message = {"value": value, "callback": callback}
        else:
            message = {"value": value, "key": key, "callback": callback}
            self._keyed.add(topic)
        batch = self._batches.get(topic)
        if batch is None:
            self._batches[topic] = [message]
        else:
            batch.append(message)
        if not self._scheduled:
            self._schedule()
        return True

    def reserve(self, count: int, size: int, largest: int) -> bool:
        """Make room for `count` records of `size` bytes in all (none over `largest`) if
        librdkafka is sure to take them all, and count them as deferred: the caller then
        defers exactly those, at once (`defer`). False: none is counted; produce them
        alone."""
        if self._count + count > self._room_count or self._bytes + size > self._room_bytes:
            self.send()
            if self._closed:  # produce() gives the closed producer's refusal, as before
                return False
            self._look(largest)
            if count > self._room_count or size > self._room_bytes:
                return False
        if largest > self._largest:
            self._largest = largest
        self._count += count
        self._bytes += size
        return True

    def defer(
        self, topic: str, key: bytes | None, values: Sequence[bytes], callback: Callable[..., None]
    ) -> None:
        """Defer `values`, in order, for which reserve() made room."""
        if key is None:
            messages = [{"value": value, "callback": callback} for value in values]
        else:
            messages = [{"value": value, "key": key, "callback": callback} for value in values]
            self._keyed.add(topic)
        batch = self._batches.get(topic)
        if batch is None:
            self._batches[topic] = messages
        else:
            batch.extend(messages)
        if not self._scheduled:
            self._schedule()

    def saw(self, count: int, size: int) -> None:
        """`count` records of at most `size` bytes go to librdkafka alone: they bound what
        it holds too, and take room the deferred ones counted on until the next look."""
        if size > self._largest:
            self._largest = size
        self._room_count -= count
        self._room_bytes -= count * size

    def _look(self, size: int) -> None:
        """What librdkafka's queue can still take, whatever was delivered meanwhile."""
        held = len(self._rd)  # records in its queue, in flight and reports not served
        self._room_count = self._max_messages - held
        self._room_bytes = self._max_bytes - held * max(self._largest, size)

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop in this thread: nothing would send them later
            self.send()
            return
        self._scheduled = True
        loop.call_soon(self.send)

    def send(self) -> None:
        """Hand every deferred record to librdkafka: one produce_batch() per topic, a
        batch of keyless records with the partition librdkafka chose last (`sticky`)."""
        self._scheduled = False
        if not self._count:
            return
        batches, self._batches = self._batches, {}
        keyed, self._keyed = self._keyed, set()
        self._room_count -= self._count
        self._room_bytes -= self._bytes
        self._count = self._bytes = 0
        produce_batch = self._rd.produce_batch
        sticky = self.sticky
        for topic, messages in batches.items():
            partition = UNASSIGNED
            # One record has no request to share: at 1,000 topics (one a topic and
            # pass), pinning and teaching each would cost a learner per topic and pass.
            if sticky.enabled and len(messages) > 1 and topic not in keyed:
                partition = sticky.partition(topic)
                if partition == UNASSIGNED:
                    last = messages[-1]
                    last["callback"] = sticky.learner(topic, last["callback"])
            try:
                queued = produce_batch(topic, messages, partition)
            except Exception as exc:  # e.g. RuntimeError: the producer was closed
                self._refused(topic, messages, str(exc))
                continue
            if queued != len(messages):
                refused = [message for message in messages if "_error" in message]
                if partition != UNASSIGNED:
                    refused = self._unassigned(topic, refused)
                if refused:
                    self._refused(topic, refused, None)
        self._on_sent()

    def _unassigned(self, topic: str, refused: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Records refused with the partition learned (most likely the topic has fewer
        partitions now): given to librdkafka's partitioner instead; returns those it
        refuses too."""
        self.sticky.forget(topic)
        if not refused:  # counted short, but no record says which: nothing to retry
            return refused
        for message in refused:
            del message["_error"]
        last = refused[-1]  # keyless, as the whole batch: librdkafka's next choice, learned
        last["callback"] = self.sticky.learner(topic, last["callback"])
        try:
            self._rd.produce_batch(topic, refused)
        except Exception as exc:  # e.g. RuntimeError: the producer was closed
            for message in refused:
                message["_error"] = str(exc)
            return refused
        return [message for message in refused if "_error" in message]

    def _refused(self, topic: str, messages: list[dict[str, Any]], text: str | None) -> None:
        """Records librdkafka did not take: delivery errors of their owners."""
        self.known.discard(topic)
        for message in messages:
            callback = message["callback"]
            if isinstance(callback, Learner):
                callback = callback.callback
            owner: Owner = callback.__self__
            error = text if text is not None else _error_text(message["_error"])
            owner.note_refused(error, topic, message["value"])
            owner.settle(1)


def _error_text(error: Any) -> str:
    if isinstance(error, KafkaError):
        return str(error.str())
    return str(error)
