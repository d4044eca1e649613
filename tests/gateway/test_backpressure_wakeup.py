"""Backpressure on the embedded Dafka engine: an RPUSHX refused for room takes the room
that came while it was being refused (a real gateway on the session's Dafka network: a
tower and a store as processes; the store's ACKs reach the loop through
`Handover._deliver_acks`).

The store is stopped (SIGSTOP) and resumed by the test, and `ProducerHandle._submit` is
patched to wait until the ACKs are queued to the loop before it refuses: a stand-in for a
loop busy with a large command when the ACKs land, a race seen without it (a 50,000-record
fill, then a keyed 50,000-value RPUSHX: one round of 20 stalled the whole bound)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from backends.dafka.producing import ProducerHandle
from gateway.config import from_dict
from tests.support.fixtures import EngineFactories
from tests.support.gateway import Raw, running
from tests.support.processes import child_running
from tests.support.waiting import wait_until

STORE = "backends.dafka.tools.stored"
QUEUE = 10
BLOCK = 20.0  # gateway.produce_block_timeout


def test_an_rpushx_refused_while_the_acks_that_free_the_queue_are_on_their_way_takes_them(
    engines: EngineFactories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue (dafka.queue_max_messages) is full of records the store is about to
    acknowledge. The store's ACKs come while the loop is still busy with the client's
    next RPUSHX (in production: parsing and wrapping a large command; here the wait below
    stands for that): its delivery to the loop (`Handover._deliver_acks`) is queued
    behind the callback that runs the RPUSHX. The RPUSHX is refused for room (the ACKs
    are not delivered yet) and waits for room in a task (`_when_room`) that starts only
    after the delivery ran, and whose first act is to wait for the *next* progress: the
    one that freed the whole queue is lost, no other record is in flight, and the RPUSHX
    waits the whole produce_block_timeout although there was room milliseconds after it
    was refused. (Measured without any instrumentation with scratch/lostwake.py: a
    50,000-record fill then a keyed 50,000-value RPUSHX stalled 5.4 s = the bound in one
    round of 20.)"""
    factory = engines("dafka")
    document = factory.document()
    document["dafka"] = {**document["dafka"], "queue_max_messages": QUEUE}
    section = {"engine": "dafka", "host": "127.0.0.1", "port": 0, "produce_block_timeout": BLOCK}
    config = from_dict({**document, "gateway": section})
    topic = factory.new_topic(1)

    store = child_running(os.getpid(), STORE)
    assert store is not None, "the session's Dafka store"
    armed: list[Any] = []  # the engine, while the next _submit must wait for ACKs
    original: Callable[..., int] = ProducerHandle._submit

    def submit_after_acks_arrived(
        self: ProducerHandle, topic: str, key: bytes | None, values: Sequence[bytes]
    ) -> int:
        if armed:
            engine = armed.pop()
            # The loop is busy with this command while the store's ACKs arrive: the
            # store goes on, and we wait until the actor has handed its ACKs to the loop
            # (queued behind this callback, not yet run).
            os.kill(store, signal.SIGCONT)
            wait_until(lambda: bool(engine.handover._acks), 10, "the store's ACKs")
        return original(self, topic, key, values)

    monkeypatch.setattr(ProducerHandle, "_submit", submit_after_acks_arrived)

    with running(config) as gateway, Raw(gateway.port, timeout=2 * BLOCK) as raw:
        engine = gateway.server.ctx.engine
        raw.command("RPUSHX", f"topics:{topic}", "warm-up")
        assert raw.read_reply() == 1
        raw.command("DUMP", "10000")
        assert raw.read_reply() == 0
        values = [f"fill-{n}" for n in range(QUEUE)]
        os.kill(store, signal.SIGSTOP)  # its ACKs come only once the next RPUSHX runs
        try:
            raw.command("RPUSHX", f"topics:{topic}", *values)
            assert raw.read_reply() == QUEUE  # the queue is full until the store acks
            armed.append(engine)
            started = time.monotonic()
            raw.command("RPUSHX", f"topics:{topic}:key", "next")
            reply = raw.read_reply()
            took = time.monotonic() - started
        finally:
            os.kill(store, signal.SIGCONT)
        assert reply == 1
        assert took < BLOCK / 4, (
            f"RPUSHX answered after {took:.1f}s (produce_block_timeout {BLOCK}s): the ACKs "
            "that emptied the queue woke nobody"
        )
        raw.command("DUMP", "10000")
        assert raw.read_reply() == 0
