"""The consumer: a member of a consumer group, BLMPOP (or BLPOP) for records, RPUSH acks
to commit."""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from redis.exceptions import AuthenticationError, ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from rafka_client._closing import Closing
from rafka_client._link import DEFAULT_URL, Command, Link
from rafka_client.errors import AckError, ConnectionLost, ConsumeError
from rafka_client.records import Record, field_pairs, record_of, topic_of_list

log = logging.getLogger("rafka_client.consumer")

SHUTDOWN = "CONS Server shutdown"  # the gateway is stopping: reconnect, as rafka-rb does
SMALLEST_WAIT = 0.001  # seconds: BLPOP's 0 would mean "forever"
# How a server without BLMPOP (Redis before 7.0, an older gateway) refuses it.
NO_BLMPOP = ("unknown command", "Command not supported")
Partition = tuple[str, int]


class _Lost(Exception):
    """The session ended under us (connection closed, gateway shutting down)."""


def _seconds(timeout: float) -> str:
    """A BLPOP timeout as text: fractions honoured, never rounded to 0 (= forever)."""
    text = f"{max(timeout, SMALLEST_WAIT):.3f}".rstrip("0").rstrip(".")
    return text


class Consumer(Closing):
    """A member of consumer group `group`, named `name`, reading `topics`.

    Iterate over it for records (forever; leave the loop with `break`), or call
    `poll(timeout)`. With `auto_ack` (the default) a record is acked once processed:
    when the loop asks for the next record. Otherwise call `ack(record)`. Acks are sent
    together (one `RPUSH acks` with one ack per partition, the highest offset), in the
    same round trip as the next BLPOP, or at once by `commit()` and `close()`.

    When the connection is lost (the gateway restarts, the network fails, the gateway
    shuts down) the consumer reconnects with exponential backoff and carries on as a new
    member of the group: acks not sent yet are dropped, and every record not acked is
    delivered again (to this member or another). Delivery is at least once.

    `overrides` are the consumer settings sent in the BLPOP key (e.g.
    `{"auto.offset.reset": "earliest"}`); the gateway applies them when it creates this
    member's consumer. `batch`: records fetched per round trip from a rafka gateway, with
    `BLMPOP ... COUNT batch` (1: one BLPOP per record); the others wait in the consumer
    until `poll()` returns them, and their acks go with the next round trip. A plain Redis
    (and a gateway without BLMPOP) gets one BLPOP per record. Not thread-safe: one
    consumer per thread.
    """

    def __init__(
        self,
        group: str,
        name: str,
        topics: str | Sequence[str],
        *,
        url: str = DEFAULT_URL,
        overrides: Mapping[str, Any] | None = None,
        protocol: int = 3,
        auto_ack: bool = True,
        poll_timeout: float = 1.0,
        batch: int = 100,
        backoff: tuple[float, float] = (0.05, 2.0),
        reconnect_timeout: float | None = 60.0,
        socket_timeout: float | None = 30.0,
        **options: Any,
    ) -> None:
        """Connects and identifies (`CLIENT SETNAME <group>:<name>`) at once: raises
        ConsumeError when the gateway refuses the name (e.g. already taken), redis-py's
        ConnectionError when it cannot be reached. `backoff`: the first and the longest
        wait between reconnection attempts, seconds; `reconnect_timeout`: give up
        (ConnectionLost) after that long without a connection (None: never)."""
        names = [topics] if isinstance(topics, str) else list(topics)
        if batch < 1:
            raise ValueError(f"batch is at least 1, got {batch!r}")
        if not group or ":" in group:
            raise ValueError(f"a group is not empty and has no ':', got {group!r}")
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"a name is not empty and has no spaces, got {name!r}")
        if not names or any(not t or ":" in t or "," in t for t in names):
            raise ValueError(f"topics are not empty and have no ':' or ',', got {topics!r}")
        self.group, self.name, self.topics = group, name, tuple(names)
        self.auto_ack = auto_ack
        self.batch = batch
        self.poll_timeout = poll_timeout
        self._backoff = backoff
        self._reconnect_timeout = reconnect_timeout
        self._grace = 30.0 if socket_timeout is None else socket_timeout
        # The BLPOP key, then one key per topic: the gateway reads only the first (as
        # Rafka did); a plain Redis double pops from the first of them that has values,
        # so it serves `topics:<topic>` lists, those a double's producer fills.
        self.key = "topics:" + ",".join(names)
        if overrides:
            self.key += ":" + json.dumps(dict(overrides), separators=(",", ":"))
        self._keys = [self.key, *(k for k in (f"topics:{t}" for t in names) if k != self.key)]
        self._link = Link(
            url,
            protocol=protocol,
            client_name=f"{group}:{name}",
            socket_timeout=socket_timeout,
            **options,
        )
        self._pending: dict[Partition, int] = {}  # acks not sent: partition -> offset
        # Per partition, the lowest and highest offsets handed out on this connection.
        self._handed: dict[Partition, tuple[int, int]] = {}
        # Received but not returned yet (the rest of a batch; a record whose acks failed).
        self._stash: collections.deque[Record] = collections.deque()
        self._double_offsets: dict[str, int] = {}
        self._server_checked = 0  # the connection (Link.connects) _rafka is about
        self._rafka = False
        self._session = 0  # the connection the state above belongs to
        self._closed = False
        self.reconnects = 0
        # Since when sessions keep failing (None: the last BLPOP was answered), and the
        # wait before the next attempt.
        self._lost_since: float | None = None
        self._delay = 0.0
        try:
            self._link.connect()
        except ResponseError as error:
            raise ConsumeError(str(error)) from None
        self._session = self._link.connects

    # --- receiving -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        """Records, forever (until `close()`). With auto_ack, each record is acked when
        the loop asks for the next one; leaving the loop (break, an exception) leaves
        the record in hand unacked: it is delivered again after a restart unless you
        `ack()` it. Refused acks are logged, and their records come again."""
        while not self._closed:
            try:
                record = self.poll(self.poll_timeout)
            except AckError as error:
                log.warning("acks refused, their records will be delivered again: %s", error)
                continue
            if record is None:
                continue
            yield record
            if self.auto_ack:
                self.ack(record)

    def poll(self, timeout: float | None = 1.0) -> Record | None:
        """The next record, or None after `timeout` seconds (None: wait until one comes).

        Returns a record of the last batch received while there is one; otherwise sends
        the pending acks and asks for the next batch in the same round trip. Raises
        AckError when the gateway refused the acks (the records received with them are
        kept for the next calls),
        ConsumeError for any other refusal, ConnectionLost when reconnecting failed.
        """
        if self._closed:
            raise ConsumeError("consumer closed")
        self._check_session()
        if self._stash:
            return self._stash.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        reconnected = False
        while True:
            # Without a deadline, BLMPOP/BLPOP for `_grace` seconds at a time: a reply
            # read with a bound (a dead peer is noticed) that a quiet topic never exceeds.
            wait = self._grace if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                record = self._pop(wait)
            except _Lost as lost:
                if reconnected and deadline is not None and time.monotonic() >= deadline:
                    # The session after a reconnect ended at once too, past the deadline:
                    # the next poll reconnects (with the backoff going on).
                    self._link.disconnect()
                    return None
                self._reconnect(str(lost))
                reconnected = True
                # One more BLPOP even past the deadline: an answer is what shows the new
                # session works (and resets the backoff and reconnect_timeout).
                continue
            if record is not None:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _pop(self, wait: float | None) -> Record | None:
        if not self._link.connected:
            # Reconnect first (and forget the old session's acks) rather than let the
            # pipeline reconnect and send them to a session they do not belong to.
            raise _Lost("not connected")
        acks = self._ack_arguments()
        try:
            batched = self._batching()
        except (ConnectionError, RedisTimeout) as error:
            raise _Lost(str(error)) from error
        commands: list[Command] = []
        if acks:
            commands.append(("RPUSH", "acks", *acks))
        seconds = "0" if wait is None else _seconds(wait)
        if batched:
            count = ("LEFT", "COUNT", self.batch)
            commands.append(("BLMPOP", seconds, len(self._keys), *self._keys, *count))
        else:
            commands.append(("BLPOP", *self._keys, seconds))
        try:
            replies = self._link.pipeline(
                commands, timeout=None if wait is None else wait + self._grace
            )
        except AuthenticationError:
            raise
        except (ConnectionError, RedisTimeout) as error:
            raise _Lost(str(error)) from error
        self._check_session()
        if acks:
            self._pending.clear()
        popped = replies[-1]
        if isinstance(popped, ResponseError):
            if str(popped) == SHUTDOWN:
                raise _Lost(SHUTDOWN)
            if batched and str(popped).startswith(NO_BLMPOP):
                log.info("the gateway has no BLMPOP, BLPOP from now on: %s", popped)
                self.batch = 1
                self._after_acks(replies, acks, [])
                return self._pop(wait)
            raise ConsumeError(str(popped))
        self._lost_since, self._delay = None, 0.0  # a session that works
        records = self._records(popped) if batched else self._blpop_records(popped)
        return self._after_acks(replies, acks, records)

    def _batching(self) -> bool:
        """Whether to ask for batches (BLMPOP) on this connection: only a rafka gateway,
        asked once per connection with `HELLO` (no arguments: nothing changes). A plain
        Redis gets BLPOP: a value BLMPOP popped and the consumer did not return yet would
        be gone from the list for good, where the gateway hands unacked records out again."""
        if self.batch == 1:
            return False
        if self._server_checked != self._link.connects:
            try:
                hello = self._link.call("HELLO")
            except ResponseError:  # a server before HELLO (Redis 5): not a gateway
                hello = {}
            if isinstance(hello, list | tuple):
                hello = dict(zip(hello[0::2], hello[1::2], strict=False))
            self._rafka = isinstance(hello, dict) and hello.get(b"server") == b"rafka"
            self._server_checked = self._link.connects
        return self._rafka

    def _after_acks(
        self, replies: list[Any], acks: list[str], records: list[Record]
    ) -> Record | None:
        """The first of `records` (the others stashed); AckError when the acks sent with
        them were refused (then every record is stashed for the next calls)."""
        self._stash.extend(records)
        if acks and isinstance(replies[0], ResponseError):
            raise AckError(str(replies[0]))
        return self._stash.popleft() if self._stash else None

    def _blpop_records(self, reply: Any) -> list[Record]:
        if reply is None:
            return []
        pairs = field_pairs(reply)
        if pairs is not None:
            return [self._handed_out(record_of(pairs))]
        if isinstance(reply, list | tuple) and len(reply) == 2:
            return [self._plain(reply[0], reply[1])]  # plain Redis: [list name, value]
        raise ConsumeError(f"unexpected BLPOP reply {reply!r}")

    def _records(self, reply: Any) -> list[Record]:
        """A BLMPOP reply: [key, [element, ...]], the elements the gateway's records or, on
        a plain Redis, the list's values."""
        if reply is None:
            return []
        if not (isinstance(reply, list | tuple) and len(reply) == 2):
            raise ConsumeError(f"unexpected BLMPOP reply {reply!r}")
        name, elements = reply
        records = []
        for element in elements:
            pairs = field_pairs(element)
            if pairs is not None:
                records.append(self._handed_out(record_of(pairs)))
            elif isinstance(element, bytes):
                records.append(self._plain(name, element))
            else:
                raise ConsumeError(f"unexpected BLMPOP element {element!r}")
        return records

    def _plain(self, name: bytes, value: bytes) -> Record:
        """A plain Redis list's value. A list has no offsets: count them per topic from
        0, as a partition's would on a fresh topic."""
        topic = topic_of_list(name)
        offset = self._double_offsets.get(topic, 0)
        self._double_offsets[topic] = offset + 1
        return self._handed_out(Record(topic, 0, offset, None, value))

    def _handed_out(self, record: Record) -> Record:
        partition = (record.topic, record.partition)
        low, high = self._handed.get(partition, (record.offset, record.offset))
        self._handed[partition] = (min(low, record.offset), max(high, record.offset))
        return record

    # --- acknowledging -------------------------------------------------------------------

    def ack(self, *records: Record) -> None:
        """Mark records processed; sent with the next poll, `commit()` or `close()`.

        Acking a record commits its partition up to it (offsets below included), as in
        Kafka. Records handed out before a reconnect are ignored: they come again.
        """
        self._check_session()
        for record in records:
            partition = (record.topic, record.partition)
            handed = self._handed.get(partition)
            if handed is None or not handed[0] <= record.offset <= handed[1]:
                continue  # not handed out on this connection (e.g. before a reconnect)
            if record.offset > self._pending.get(partition, -1):
                self._pending[partition] = record.offset

    def _ack_arguments(self) -> list[str]:
        return [f"{t}:{p}:{offset}" for (t, p), offset in sorted(self._pending.items())]

    def commit(self) -> None:
        """Send the pending acks now (one command). Raises AckError when the gateway
        refuses them or the connection is lost meanwhile (their records come again)."""
        self._check_session()
        acks = self._ack_arguments()
        if not acks:
            return
        self._pending.clear()
        try:
            self._link.call("RPUSH", "acks", *acks)
        except ResponseError as error:
            raise AckError(str(error)) from None
        except (ConnectionError, RedisTimeout) as error:
            raise AckError(f"connection lost, acks not sent: {error}") from error

    # --- the session ---------------------------------------------------------------------

    def _check_session(self) -> None:
        """Forget what belonged to an earlier connection (a new session = a new member)."""
        if self._link.connects != self._session:
            self._session = self._link.connects
            self._pending.clear()
            self._handed.clear()
            self._stash.clear()

    def _reconnect(self, cause: str) -> None:
        """Reconnect, backing off exponentially while sessions keep failing: connects
        that fail, and sessions that end at once (a gateway that is shutting down still
        accepts connections, and answers every BLPOP `CONS Server shutdown`). Raises
        ConnectionLost once `reconnect_timeout` has passed since the first loss."""
        self._link.disconnect()
        log.warning("connection lost, reconnecting: %s", cause)
        if self._lost_since is None:
            self._lost_since = time.monotonic()  # the first loss: reconnect at once
        first, longest = self._backoff
        last = cause
        while True:
            if self._delay:
                waited = time.monotonic() - self._lost_since
                limit = self._reconnect_timeout
                if limit is not None and waited + self._delay > limit:
                    raise ConnectionLost(f"no connection after {waited:.1f}s: {last}")
                time.sleep(self._delay)
            self._delay = min(max(self._delay * 2, first), longest)
            try:
                self._link.connect()
                break
            except AuthenticationError:
                raise
            except (ConnectionError, RedisTimeout, ResponseError) as error:
                # ResponseError: e.g. `CONS id <name> is already taken` while the
                # gateway is still closing the previous session of this name.
                last = str(error)
        self.reconnects += 1
        self._check_session()
        log.info("reconnected as %s:%s", self.group, self.name)

    def close(self) -> None:
        """Send the pending acks, then leave (QUIT): the gateway commits and the group
        hands this member's partitions to the others. Idempotent."""
        if self._closed:
            return
        try:
            self.commit()
        except AckError as error:
            log.warning("acks not sent at close, their records come again: %s", error)
        finally:
            self._closed = True
            self._link.quit()
