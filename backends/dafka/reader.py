"""The reader actor: a Dafka consumer that fetches only what its owner has room for.

The plain consumer (`consumer.py`) takes every record of its topics as fast as they come,
as C does. A gateway must not: a group member may be slow, and whatever it has not taken
would pile up in memory. The reader keeps, per partition, a position and a *credit* (how
many records the owner can take now) and asks the stores and producers for exactly that
much: FETCH(next, min(credit, known head - next + 1)); credit granted while a FETCH is
under way is fetched at once, past it (overlapping FETCHes). Live RECORDs are taken directly when
they are the next one and there is credit (the low-latency path: no FETCH, no store). A
live RECORD past a gap is *held* if it falls within the cursor's credit (next .. next +
credit - 1, room the owner already gave), only the gap is fetched, and the held records
follow as soon as the gap is filled: a cursor that fell behind while records keep coming
gets back on the live path instead of fetching every record from then on. Anything else
is dropped and fetched when there is room. A cursor holds at most `credit` records.

One reader serves many readers of one partition (a gateway's consumer groups): each is a
*cursor* with its own position and credit; a record reaching the reader goes to every
cursor it is the next record of. Partitions are found from HEADs, RECORDs, and the
stores' DIRECT_HEADs (GET_HEADS on subscribe, hello handshake with every store reader).
The owner decides where each cursor starts (`start`), grants credit as it makes room
(`grant`) and drops cursors it no longer needs. Events reach the owner in batches through
`sink(events)`, on the actor thread:

- `("head", topic, partition, head)`: a partition's known head moved (first one: found);
- `("record", cursor, sequence, content, generation)`: the cursor's next record.

`generation` is the one given to the `start` that positioned the cursor, so the owner can
tell records from before a rewind.

Wire cost: besides the FETCHes it needs, what the plain consumer in earliest mode sends:
GET_HEADS at subscribe and again on `heads_schedule.py`'s backoff (issue 7), and hellos.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Callable, Hashable
from typing import Any

import structlog
import zmq

from backends.dafka import proto
from backends.dafka.beacon import Beacon, apply_events, new_subscribers, now_ms
from backends.dafka.config import Config
from backends.dafka.heads_schedule import HeadsSchedule
from backends.dafka.held_recv import (
    HELD_UP_TO,
    batch_receiver,
    held_receiver,
    python_batch_receiver,
)
from backends.dafka.held_send import batch_module
from backends.dafka.node import Node
from backends.dafka.producer import check_topic

log = structlog.get_logger(__name__)

MAX_FETCH = 10_000  # records asked for in one FETCH
_BATCH = 100_000
_CHUNK = 1_000  # messages received per call after the first HELD_UP_TO of a drain
# Record frames remembered by `_Actor.known` (two a partition: RECORD and DIRECT_RECORD);
# past this many the table starts again (a few hundred bytes each).
_KNOWN_FRAMES = 100_000
_UNPACK_SEQ = struct.Struct(">Q").unpack_from

Event = tuple[Any, ...]


class _Cursor:
    __slots__ = (
        "candidate",
        "credit",
        "fetch_end",
        "fetch_until",
        "fresh",
        "generation",
        "held",
        "key",
        "missed",
        "next",
        "part",
        "proven",
    )

    def __init__(self, key: Hashable, part: _Partition) -> None:
        self.key = key
        self.part = part
        self.next = 0
        self.credit = 0
        self.fresh = False  # may jump to the stores' oldest record (retention)
        # With `fresh`: the lowest later record the stores answered with since the FETCH
        # went out, and whether one of those answers can only be to a FETCH from at or
        # below `next` (`proven`: the others may answer another cursor's FETCH from past
        # it, `_Partition.asked`). Taken (a jump) only when two FETCHes in a row timed
        # out so, without the record asked for (`missed`): no FETCH goes past the first
        # meanwhile, so the lowest is the oldest record the answering stores keep.
        self.candidate = -1
        self.proven = False
        # The FETCH before timed out so: the next one doing so makes the jump (one lost
        # FETCH, or one store slower than another that keeps less, is no proof).
        self.missed = False
        self.generation = 0
        self.fetch_end = 0  # a FETCH asked for records up to here (exclusive)
        self.fetch_until = 0  # ms; after this the FETCH counts as lost
        # Live records past a gap, by sequence, all in next+1 .. next+credit-1.
        self.held: dict[int, bytes] = {}


class _Partition:
    __slots__ = ("address", "asked", "cursors", "head", "subject")

    def __init__(self, subject: str, address: str) -> None:
        self.subject = subject
        self.address = address
        self.head = -1
        self.cursors: dict[Hashable, _Cursor] = {}
        # The FETCHes of its cursors lately, oldest first: (cursor key, first, end, ms
        # until which answers to it may still come). All the cursors of a reader share
        # its address, so a FETCH's answers reach every cursor of the partition: an
        # answer to another's FETCH from past a cursor's next record is no sign that the
        # stores keep nothing before it (a group restarting at its commit took another
        # group's answers for that, and skipped records that every store kept).
        self.asked: collections.deque[tuple[Hashable, int, int, int]] = collections.deque()

    def asked_by_another(self, key: Hashable, since: int, seq: int) -> bool:
        """Whether `seq` may answer another cursor's FETCH from past `since` (this
        cursor's next: one from at or below it proves the gap as well as its own)."""
        now = now_ms()
        return any(
            other != key and since < first <= seq < end and until >= now
            for other, first, end, until in self.asked
        )


class Reader(Node):
    kind = "reader"

    def __init__(
        self,
        config: Config,
        sink: Callable[[list[Event]], None],
        context: zmq.Context | None = None,
        ignore_peers: Callable[[str], bool] | None = None,
    ) -> None:
        """`ignore_peers(address)`: the nodes never connected to (a gateway's own writers,
        whose records its groups take in process: `stored_heads`)."""
        self._sink = sink
        self._ignore_peers = ignore_peers
        self._retry = max(10, config.get_int("consumer/fetch_retry_interval", 500))
        self._heads_interval = config.get_int("consumer/heads_interval")
        self._commands: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self._woken = False  # a wake-up is on its way for the commands queued (under _lock)
        super().__init__(config, context)

    # -- owner side (any thread, never blocks) -------------------------------------------

    def subscribe(self, topic: str) -> None:
        check_topic(topic)
        self._command("subscribe", topic)

    def unsubscribe(self, topic: str) -> None:
        self._command("unsubscribe", topic)

    def start(
        self,
        cursor: Hashable,
        topic: str,
        partition: str,
        next_sequence: int,
        credit: int,
        generation: int,
        *,
        head: int = -1,
        jump: bool | None = None,
    ) -> None:
        """Deliver `partition` to `cursor` from `next_sequence` on, at most `credit` records
        until more is granted. From 0 (unless `jump` is False), or with `jump`, it starts at
        the oldest record the
        stores keep if that is later (retention). `head`: the partition's head when the
        owner knows it, so that the FETCH goes at once even for a topic the reader is not
        subscribed to (a read by offset)."""
        self._command(
            "start", cursor, topic, partition, next_sequence, credit, generation, head, jump
        )

    def grant(self, cursor: Hashable, credit: int) -> None:
        """`credit` more records for `cursor` (less, when negative: what it may not bring
        any more; its FETCHes' answers past the credit are dropped)."""
        self._command("grant", cursor, credit)

    def took(self, takes: list[tuple[Hashable, int, int, int]]) -> None:
        """The owner took records of these cursors' partitions elsewhere (a gateway's
        groups take the records it writes in process): for each `(cursor, end, count,
        generation)`, the `count` records before `end`, spending their credit. The
        cursor moves past them (if `generation` is still its own), so that it does not
        fetch them, and drops a stores' answer for them as a second answer; one that
        reached it before this command was delivered (the owner drops it by offset), and
        its credit is not spent twice.

        Queued without waking the reader: the heads the ACKs of these records bring
        (`stored_heads`, right behind) wake it, and it runs its commands in order.
        Otherwise the next wake-up for anything, at most a second later, runs it. A
        wake-up per hand-over cost the event loop a zmq send and the GIL back from the
        woken reader, ~2,000 a second at 10,000 records/s."""
        self._command("took", takes, wake=False)

    def drop(self, cursor: Hashable) -> None:
        self._command("drop", cursor)

    def stored_heads(self, heads: list[tuple[str, str, int]]) -> None:
        """A store holds these partitions up to `head`: for each `(topic, address,
        head)`, as if a HEAD had come. The gateway's own writers are peers the reader
        does not connect to (`ignore_peers`): their records reach its groups in process,
        and what a group had no room for is fetched from the stores once they hold it,
        which these heads (from the writers' ACKs) tell."""
        self._command("stored", heads)

    def _command(self, name: str, *args: Any, wake: bool = True) -> None:
        """Queue a command; wake the reader for it unless `wake` is False (it is read at
        the reader's next wake-up, whatever wakes it: at the latest its next timer, within
        a second)."""
        with self._lock:
            if self._closed:
                return
            self._commands.append((name, args))
            if wake and not self._woken:
                self._woken = True
                self._wake(b"C")

    # -- actor --------------------------------------------------------------------------

    def _subscriptions(self) -> list[bytes]:
        return [
            proto.subscription(msg_id, self.address)
            for msg_id in (proto.DIRECT_RECORD, proto.DIRECT_HEAD, proto.STORE_HELLO)
        ]

    def _loop(self, pipe: zmq.Socket, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        _Actor(self, sub, xpub, beacon).loop(pipe)


class _Actor:
    def __init__(self, owner: Reader, sub: zmq.Socket, xpub: zmq.Socket, beacon: Beacon) -> None:
        self.owner = owner
        self.uuid = owner.address
        self.sub = sub
        self.xpub = xpub
        self.beacon = beacon
        self.retry = owner._retry
        self.subjects: dict[str, None] = {}
        self.parts: dict[tuple[str, str], _Partition] = {}
        self.cursors: dict[Hashable, _Cursor] = {}
        self.events: list[Event] = []
        self.head_events: dict[_Partition, int] = {}  # where each one's is in `events`
        self.fetching: set[_Cursor] = set()
        self.heads = HeadsSchedule(owner._heads_interval)
        # Much of what reaches a gateway's reader comes a few messages at a time, read
        # while its event loop wants the GIL: received keeping it, by the C fast path, or
        # where it was not built, the first HELD_UP_TO messages of a drain through
        # ctypes, the rest through pyzmq, which gives it up per frame (`held_recv.py`).
        self.held = held_receiver(sub) if batch_module() is None else None
        self.receive_rest = batch_receiver(sub)
        self.receive_first = (
            self.receive_rest if self.held is None else python_batch_receiver(self.held.take)
        )
        # Frame 1 of a well-formed (DIRECT_)RECORD of a known partition without its
        # sequence -> (message id, partition): the same bytes lead every record of the
        # partition, and a dict look-up of them replaced the decoder's work (the
        # reader's thread took 4 us a record reading one topic's backlog, 1.1 of it
        # decoding). Partitions are never forgotten, so an entry stays true.
        self.known: dict[bytes, tuple[int, _Partition]] = {}

    def loop(self, pipe: zmq.Socket) -> None:
        try:
            self._serve(pipe)
        finally:
            if self.held is not None:
                self.held.close()

    def _serve(self, pipe: zmq.Socket) -> None:
        beacon = self.beacon
        poller = zmq.Poller()
        for sock in (pipe, self.sub, self.xpub, beacon.socket):
            poller.register(sock, zmq.POLLIN)
        busy = False
        while True:
            now = now_ms()
            deadline = beacon.next_deadline_ms()
            deadline = min(deadline, self.heads.next_due)
            if self.fetching:
                deadline = min(deadline, min(c.fetch_until for c in self.fetching))
            wait = 0 if busy else max(0, min(deadline - now, 1000))
            events = dict(poller.poll(wait))
            if (pipe in events or self.owner._commands) and self._commands(pipe, pipe in events):
                return
            if beacon.socket in events:
                apply_events(beacon.handle(), self.sub)
            if self.xpub in events:
                for reader in new_subscribers(self.xpub, proto.CONSUMER_HELLO):
                    self._hello(reader)
            busy = self.sub in events and self._drain()
            now = now_ms()
            for topic in self.heads.due(now):
                self._send(proto.Message(proto.GET_HEADS, topic.encode(), address=self.uuid))
            for cursor in [c for c in self.fetching if c.fetch_until <= now]:
                if cursor.fresh:
                    if cursor.candidate > cursor.next and cursor.proven and cursor.missed:
                        # What was asked for is gone (retention): start at the oldest kept.
                        cursor.next, cursor.fresh = cursor.candidate, False
                        if cursor.next in cursor.held:
                            self._deliver(cursor, cursor.next, cursor.held.pop(cursor.next))
                    else:
                        cursor.missed = cursor.candidate > cursor.next and cursor.proven
                    # The next FETCH must bring later records of its own.
                    cursor.candidate, cursor.proven = -1, False
                cursor.fetch_end = 0  # lost or partly answered: ask again
                self._pump(cursor, now)
            apply_events(beacon.tick(now), self.sub)
            if self.events:
                batch, self.events = self.events, []
                self.head_events.clear()
                self.owner._sink(batch)

    def _commands(self, pipe: zmq.Socket, woken: bool) -> bool:
        """Run the commands queued (reading the wake-ups on `pipe` first if `woken`);
        True: stop."""
        stop = False
        while woken:
            try:
                stop = pipe.recv(zmq.NOBLOCK) == b"T" or stop
            except zmq.Again:
                break
        if stop:
            return True
        owner = self.owner
        with owner._lock:
            commands = list(owner._commands)
            owner._commands.clear()
            owner._woken = False
        for name, args in commands:
            getattr(self, "_cmd_" + name)(*args)
        return False

    def _cmd_subscribe(self, topic: str) -> None:
        if topic in self.subjects:
            return
        for msg_id in (proto.RECORD, proto.HEAD):
            self.sub.setsockopt(zmq.SUBSCRIBE, proto.subscription(msg_id, topic) + b"\0")
        self.subjects[topic] = None
        self._send(proto.Message(proto.GET_HEADS, topic.encode(), address=self.uuid))
        self.heads.add(topic, now_ms())
        for part in self.parts.values():
            if part.subject == topic and part.head >= 0:
                self.events.append(("head", topic, part.address, part.head))

    def _cmd_unsubscribe(self, topic: str) -> None:
        if topic not in self.subjects:
            return
        for msg_id in (proto.RECORD, proto.HEAD):
            self.sub.setsockopt(zmq.UNSUBSCRIBE, proto.subscription(msg_id, topic) + b"\0")
        del self.subjects[topic]
        self.heads.remove(topic)

    def _cmd_start(
        self,
        key: Hashable,
        topic: str,
        address: str,
        next_sequence: int,
        credit: int,
        generation: int,
        head: int,
        jump: bool | None,
    ) -> None:
        part = self._part(topic, address)
        part.head = max(part.head, head)
        cursor = self.cursors.get(key)
        if cursor is not None and cursor.part is not part:
            self._cmd_drop(key)
            cursor = None
        if cursor is None:
            cursor = self.cursors[key] = part.cursors[key] = _Cursor(key, part)
        cursor.next = next_sequence
        cursor.fresh = next_sequence == 0 if jump is None else jump
        cursor.candidate = -1
        cursor.proven = cursor.missed = False
        cursor.credit = credit
        cursor.generation = generation
        cursor.fetch_end = 0
        cursor.held.clear()
        self._pump(cursor, now_ms())

    def _cmd_grant(self, key: Hashable, credit: int) -> None:
        cursor = self.cursors.get(key)
        if cursor is None:
            return
        cursor.credit += credit
        now = now_ms()
        if (
            cursor.fetch_end > cursor.next
            and cursor.fetch_until > now
            and cursor.credit > 0
            and not cursor.fresh  # its answers must all be from `next`: the jump's proof
        ):
            self._extend(cursor, now)
        else:
            self._pump(cursor, now)

    def _cmd_took(self, takes: list[tuple[Hashable, int, int, int]]) -> None:
        now = -1
        cursors = self.cursors
        for key, end, count, generation in takes:
            cursor = cursors.get(key)
            if cursor is None or cursor.generation != generation or cursor.next >= end:
                continue  # dropped, restarted since, or the stores' answers came first
            # The owner took `count` records before `end`, all it had not got from here
            # (its next record was ours): anything below `end - count` it had from us.
            cursor.credit -= end - max(cursor.next, end - count)
            cursor.next = end
            cursor.fresh = False
            cursor.candidate = -1
            if cursor.held:
                for seq in [seq for seq in cursor.held if seq < end]:
                    del cursor.held[seq]
                if end in cursor.held and cursor.credit > 0:
                    self._deliver(cursor, end, cursor.held.pop(end))
            if cursor.next < cursor.fetch_end and cursor.credit > 0:
                continue  # the rest of its FETCH is on its way
            if now < 0:
                now = now_ms()
            self._pump(cursor, now)

    def _cmd_stored(self, heads: list[tuple[str, str, int]]) -> None:
        parts, subjects = self.parts, self.subjects
        for topic, address, head in heads:
            part = parts.get((topic, address))
            if part is None:
                if topic not in subjects:
                    continue  # not read here
                part = self._part(topic, address)
            self._on_head(part, head)

    def _cmd_drop(self, key: Hashable) -> None:
        cursor = self.cursors.pop(key, None)
        if cursor is not None:
            cursor.part.cursors.pop(key, None)
            self.fetching.discard(cursor)

    def _part(self, topic: str, address: str) -> _Partition:
        part = self.parts.get((topic, address))
        if part is None:
            part = self.parts[(topic, address)] = _Partition(topic, address)
        return part

    # -- incoming -----------------------------------------------------------------------

    def _drain(self) -> bool:
        """Handle the messages waiting, up to _BATCH; True: there may be more."""
        known = self.known
        direct_id = proto.DIRECT_RECORD
        receive, asked, taken = self.receive_first, HELD_UP_TO, 0
        while True:
            messages = receive(asked)
            for frames in messages:
                if len(frames) == 2:
                    first = frames[0]
                    hit = known.get(first[:-8])
                    if hit is not None:
                        mid, part = hit
                        self._on_record(
                            part, _UNPACK_SEQ(first, len(first) - 8)[0], frames[1], mid == direct_id
                        )
                        continue
                self._on_message(frames)
            if len(messages) < asked:
                return False
            taken += asked
            if taken >= _BATCH:
                return True
            receive, asked = self.receive_rest, min(_CHUNK, _BATCH - taken)

    def _on_message(self, frames: list[bytes]) -> None:
        """A message other than a record of a known partition."""
        try:
            msg = proto.decode(frames)
        except proto.MalformedMessage:
            return
        mid = msg.id
        if mid == proto.STORE_HELLO:
            self._hello(msg.address.encode())
        elif msg.subject not in self.subjects and (msg.subject, msg.address) not in self.parts:
            return  # not ours (a partition started by a read needs no subscription)
        elif mid == proto.RECORD or mid == proto.DIRECT_RECORD:
            part = self._part(msg.subject, msg.address)
            self._remember(frames[0], part)
            self._on_record(part, msg.sequence, msg.content, mid == proto.DIRECT_RECORD)
        elif mid in (proto.HEAD, proto.DIRECT_HEAD) and msg.sequence >= 0:
            self._on_head(self._part(msg.subject, msg.address), msg.sequence)

    def _remember(self, frame1: bytes, part: _Partition) -> None:
        """`frame1`, a record of `part`, in `known` if its sequence ends it."""
        prefix = proto.record_prefix(frame1)
        if prefix is None or prefix in self.known:
            return
        if len(self.known) >= _KNOWN_FRAMES:
            self.known.clear()
        self.known[prefix] = (frame1[0], part)

    def _on_head(self, part: _Partition, head: int) -> None:
        if self._new_head(part, head):
            now = now_ms()
            for cursor in part.cursors.values():
                self._pump(cursor, now)

    def _new_head(self, part: _Partition, head: int) -> bool:
        if head <= part.head:
            return False
        part.head = head
        event = ("head", part.subject, part.address, head)
        index = self.head_events.get(part)
        if index is None:
            self.head_events[part] = len(self.events)
            self.events.append(event)
        else:  # one head event per partition and batch (each live record moves it)
            self.events[index] = event
        return True

    def _on_record(self, part: _Partition, seq: int, content: bytes, direct: bool) -> None:
        # The head moves first, but nothing is fetched before the record is offered: a
        # live record that is a cursor's next one must not be fetched too.
        moved = self._new_head(part, seq)
        now = -1
        for cursor in part.cursors.values():
            if cursor.credit <= 0:
                continue
            if seq == cursor.next:
                self._deliver(cursor, seq, content)
                if cursor.next < cursor.fetch_end and cursor.credit > 0:
                    continue  # the rest of its FETCH is on its way
                # Done, or out of credit: the rest of its answers would be dropped.
                self.fetching.discard(cursor)
            elif seq > cursor.next:
                if direct:
                    if cursor.fresh:
                        candidate = cursor.candidate
                        cursor.candidate = seq if candidate < 0 else min(candidate, seq)
                        if not cursor.proven:
                            cursor.proven = not part.asked_by_another(cursor.key, cursor.next, seq)
                elif seq < cursor.next + cursor.credit:
                    cursor.held[seq] = content
                if not moved:
                    continue  # nothing new to fetch
            else:
                continue  # a second answer, or one from before a rewind
            if now < 0:
                now = now_ms()
            self._pump(cursor, now)

    def _deliver(self, cursor: _Cursor, seq: int, content: bytes) -> None:
        """Hand `seq`, the cursor's next record, to the owner, then the held records that
        follow it."""
        cursor.candidate = -1
        cursor.fresh = False
        held = cursor.held
        events = self.events
        key, generation = cursor.key, cursor.generation
        while True:
            cursor.next = seq + 1
            cursor.credit -= 1
            events.append(("record", key, seq, content, generation))
            if not held:
                return
            held.pop(seq, None)  # the same record, fetched before it came live
            seq += 1
            if cursor.credit <= 0 or seq not in held:
                return
            content = held.pop(seq)

    # -- outgoing -----------------------------------------------------------------------

    def _pump(self, cursor: _Cursor, now: int) -> None:
        """FETCH what the owner has room for, unless a FETCH for it is under way."""
        part = cursor.part
        if cursor.credit <= 0 or part.head < cursor.next:
            # No FETCH counts as under way any more: the next pump (a grant, a head) asks
            # at once. A fresh cursor's FETCH asks past its credit (MAX_FETCH // 10), so
            # credit can run out before `fetch_end`: the rest of that FETCH's answers are
            # dropped, and a FETCH still counted (out of the `fetching` timeouts' sight
            # once discarded) made the grant fetch nothing: a consumer without acks
            # stopped after consume_batch records.
            self.fetching.discard(cursor)
            cursor.fetch_end = 0
            return
        if cursor.fetch_end > cursor.next and cursor.fetch_until > now:
            return
        count = min(cursor.credit, part.head - cursor.next + 1, MAX_FETCH)
        if cursor.held:
            first = min(cursor.held)
            if first < cursor.next:  # filled by a fetch, or left behind by a jump
                for seq in [seq for seq in cursor.held if seq < cursor.next]:
                    del cursor.held[seq]
                first = min(cursor.held, default=cursor.next + count)
            if first == cursor.next:
                # Held when the credit ran out under it (a grant took credit back): the
                # next record is here. A FETCH of the gap before it would ask for none.
                self._deliver(cursor, first, cursor.held.pop(first))
                self._pump(cursor, now)
                return
            count = min(count, first - cursor.next)  # only the gap: the rest is here
        if cursor.fresh and cursor.next == 0:
            count = max(count, MAX_FETCH // 10)  # the oldest kept record may be far ahead
        self._fetch(cursor, cursor.next, count, now)

    def _extend(self, cursor: _Cursor, now: int) -> None:
        """A FETCH is under way and the owner granted more: ask at once for what the new
        credit covers past it, so that the stores' answers keep coming instead of
        stopping for a round trip after each FETCH. Answers come in order from each
        sender, so the second FETCH's records follow the first's; if the first is lost,
        its timeout asks again from `next` (the second's early answers are dropped)."""
        start = cursor.fetch_end
        end = min(cursor.next + cursor.credit, cursor.part.head + 1, start + MAX_FETCH)
        for seq in cursor.held:
            if seq >= start:
                end = min(end, seq)  # up to the first held record past it
        if end > start:
            self._fetch(cursor, start, end - start, now)

    def _fetch(self, cursor: _Cursor, start: int, count: int, now: int) -> None:
        part = cursor.part
        self._send(
            proto.Message(
                proto.FETCH,
                part.address.encode(),
                address=self.uuid,
                subject=part.subject,
                sequence=start,
                count=count,
            )
        )
        cursor.fetch_end = start + count
        cursor.fetch_until = now + self.retry
        asked = part.asked  # see _Partition.asked
        while asked and asked[0][3] < now:
            asked.popleft()
        asked.append((cursor.key, start, start + count, now + 2 * self.retry))
        self.fetching.add(cursor)

    def _hello(self, reader: bytes) -> None:
        if not reader or b"\0" in reader:
            return
        self._send(
            proto.Message(
                proto.CONSUMER_HELLO, reader, address=self.uuid, subjects=list(self.subjects)
            )
        )

    def _send(self, msg: proto.Message) -> None:
        try:
            frames = proto.encode(msg)
        except proto.MalformedMessage:
            return
        self.xpub.send_multipart(frames)
