"""The producer actor (spec §3): owns one partition of one topic.

The partition name is the producer's uuid. Records are numbered from 0, sent as RECORD on a
bound PUB, kept in memory (UnackedList) until any store ACKs them, and re-sent from memory as
DIRECT_RECORD when someone FETCHes them. Once something was published, a HEAD carrying the
last sequence goes out every `producer/head_interval` ms.

This is `publisher.Publisher` (the actor for any number of partitions) with one partition
whose address is the actor's own, so the beacon announces the partition's uuid as C's
producer does. What goes beyond C (the first records held `producer/subscribe_settle` ms,
a last HEAD on the way out, close() bounded by `producer/close_timeout`) is described
there.

Threading: `publish()` may be called from any thread; it never blocks on the network.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

import zmq

from backends.dafka.config import Config
from backends.dafka.publisher import Publisher, check_address, check_topic

__all__ = ["Producer", "check_topic"]


class Producer(Publisher):
    """Publishes records on one new partition (its uuid) of `topic`."""

    kind = "producer"

    def __init__(
        self,
        config: Config,
        topic: str,
        context: zmq.Context | None = None,
        *,
        address: str | None = None,
        first_sequence: int = 0,
        on_ack: Callable[[int], None] | None = None,
        ignore_peers: Callable[[str], bool] | None = None,
    ) -> None:
        """`address` and `first_sequence` let an owner resume a partition it wrote before;
        by default a new partition starts at 0. `on_ack(last_acked)` runs on the actor
        thread whenever an ACK releases records. `ignore_peers(address)` True: a peer this
        producer does not connect to, one known to send no ACK or FETCH."""
        check_topic(topic)
        if first_sequence < 0:
            raise ValueError(f"first_sequence must be >= 0, not {first_sequence}")
        self.topic = topic
        self.first_sequence = first_sequence
        address = uuid.uuid4().hex.upper() if address is None else check_address(address)
        super().__init__(config, context, address=address, ignore_peers=ignore_peers)
        try:
            self._partition = self.open(
                topic, address=address, first_sequence=first_sequence, on_ack=on_ack
            )
        except BaseException:
            self.close(0)
            raise

    def _thread_name(self) -> str:
        return f"dafka-producer-{self.topic}"

    def publish(self, content: bytes | bytearray | memoryview) -> int:
        """Queue one record; never blocks on the network. Returns its sequence."""
        return self._partition.publish(content)

    def publish_many(self, contents: Sequence[bytes]) -> int:
        """Queue `contents` in order with one hand-over to the actor (one lock, at most
        one wake-up); returns the first one's sequence."""
        return self._partition.publish_many(contents)

    def sent_count(self) -> int:
        """Records the actor has published on the wire (publish() only queues them)."""
        return self._partition.sent_count()
