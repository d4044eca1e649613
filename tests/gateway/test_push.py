"""HTTP push subscriptions (docs/push.md) against a real HTTP server on loopback that
fails (5xx) and stalls on purpose, on a gateway on each real engine."""

from __future__ import annotations

import base64
import dataclasses
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.config import Config
from gateway.push.spec import parse_subscriptions
from gateway.runner import ServerThread
from tests.support.engines import GATEWAY_ENGINES
from tests.support.fixtures import EngineFactories, GatewayConfig
from tests.support.gateway import client
from tests.support.http_sink import STALL, HttpSink
from tests.support.waiting import wait_until

# Fast retries, so that failures are quick to observe.
QUICK = {"backoff_base": 0.02, "backoff_max": 0.1, "jitter": 0.5}


@pytest.fixture(params=GATEWAY_ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def new_topic(engine_name: str, engines: EngineFactories) -> Callable[[int], str]:
    return engines(engine_name).new_topic


@pytest.fixture
def config(
    engine_name: str, gateway_config: GatewayConfig, tmp_path: Path
) -> Callable[[list[dict[str, Any]]], Config]:
    """A gateway on the engine with these subscriptions, its data in tmp_path."""

    def make(subscriptions: list[dict[str, Any]]) -> Config:
        base = gateway_config(engine_name, data_dir=str(tmp_path), shutdown_timeout=20)
        return dataclasses.replace(base, subscriptions=parse_subscriptions(subscriptions))

    return make


def subscription(name: str, topic: str, urls: list[str], **more: Any) -> dict[str, Any]:
    return {"name": name, "topic": topic, "group": f"g{secrets.token_hex(4)}", "urls": urls, **more}


def stat(server: ServerThread, name: str) -> int:
    with client(server) as c:
        stats = c.hgetall("stats")
    return int(stats.get(name.encode(), -1))


def produce(server: ServerThread, topic: str, key: str | None, values: list[bytes]) -> None:
    with client(server) as c:
        c.execute_command("RPUSHX", f"topics:{topic}" + (f":{key}" if key else ""), *values)
        assert c.execute_command("DUMP", 10_000) == 0, "records not durable"


def test_every_record_reaches_every_url_in_partition_order(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink, engine_name: str
) -> None:
    topic = new_topic(4)
    urls = [sink.url("/a"), sink.url("/b")]
    hook = subscription("orders", topic, urls, concurrency=4, headers={"X-Token": "s3cret"})
    keys = [f"k{n}" for n in range(4)]
    with ServerThread(config([hook])) as server:
        for key in keys:
            produce(server, topic, key, [f"{key}-{i}".encode() for i in range(10)])
        produce(server, topic, None, [b"\xff\x00binary"])
        for path in ("/a", "/b"):
            wait_until(
                lambda p=path: len(sink.delivered(p)) >= 41,  # type: ignore[misc]
                30,
                f"41 records delivered to {path}",
            )
        wait_until(lambda: stat(server, "push.orders.delivered") == 41, 10, "41 counted delivered")
        assert stat(server, "push.orders.failed_attempts") == 0

    has_timestamps = engine_name == "kafka"
    for path in ("/a", "/b"):
        bodies = sink.delivered(path)
        assert len(bodies) == 41, f"a record delivered twice to {path}"
        texts = [b for b in bodies if b["value_encoding"] == "utf-8"]
        for key in keys:
            assert [b["value"] for b in texts if b["key"] == key] == [
                f"{key}-{i}" for i in range(10)
            ], f"{key}'s records out of order at {path}"
        for partition in {b["partition"] for b in bodies}:
            offsets = [b["offset"] for b in bodies if b["partition"] == partition]
            assert offsets == sorted(offsets), f"partition {partition} out of order at {path}"
        [binary] = [b for b in bodies if b["value_encoding"] == "base64"]
        assert base64.b64decode(binary["value"]) == b"\xff\x00binary"
        assert binary["key"] is None and binary["key_encoding"] is None
        for body in bodies:
            assert body["topic"] == topic
            assert set(body) == {
                "topic",
                "partition",
                "offset",
                "key",
                "key_encoding",
                "value",
                "value_encoding",
                "timestamp",
            }
            assert isinstance(body["timestamp"], int) if has_timestamps else True
        request = sink.received(path)[0]
        assert request.headers["X-Token"] == "s3cret"
        assert request.headers["Content-Type"] == "application/json"


def test_nothing_is_acked_before_every_url_answered(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    """A URL down: the records are retried, not acked; after a restart with the URL up
    they are all delivered; and records delivered once are not delivered again."""
    topic = new_topic(2)
    sink.answer("/down", lambda body: 503)
    urls = [sink.url("/up"), sink.url("/down")]
    hook = subscription("flaky", topic, urls, concurrency=2, retry={"attempts": 10_000, **QUICK})
    values = [b"v%d" % n for n in range(6)]
    with ServerThread(config([hook])) as server:
        produce(server, topic, "a", values[:3])
        produce(server, topic, "b", values[3:])
        wait_until(lambda: stat(server, "push.flaky.failed_attempts") >= 6, 30, "6 failed attempts")
        assert stat(server, "push.flaky.delivered") == 0
        started = time.monotonic()
    assert time.monotonic() - started < 15, "shutdown waited for the failing deliveries"
    assert sink.delivered("/down") == []
    # /up answered 2xx and was not posted again for the records in flight.
    up_offsets = [(b["partition"], b["offset"]) for b in sink.delivered("/up")]
    assert len(up_offsets) == len(set(up_offsets)), "a URL that answered 2xx was posted again"

    sink.answer("/down", lambda body: 200)
    with ServerThread(config([hook])) as server:
        wait_until(
            lambda: sorted(b["value"].encode() for b in sink.delivered("/down")) == values,
            30,
            f"every record delivered after the restart (got {sink.delivered('/down')})",
        )
        wait_until(lambda: stat(server, "push.flaky.delivered") == 6, 10, "6 counted delivered")

    with ServerThread(config([hook])) as server:
        produce(server, topic, "a", [b"late"])
        wait_until(lambda: len(sink.delivered("/down")) == 7, 30, "the late record delivered")
        assert stat(server, "push.flaky.delivered") == 1, "acked records were delivered again"
    assert [b["value"] for b in sink.delivered("/down")].count("v0") == 1


def test_a_record_that_keeps_failing_goes_to_the_dead_letter_topic(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    topic, dead = new_topic(1), new_topic(1)
    sink.answer("/picky", lambda body: 500 if body["value"].startswith("bad") else 200)
    hook = subscription(
        "picky",
        topic,
        [sink.url("/picky")],
        dead_letter_topic=dead,
        retry={"attempts": 3, **QUICK},
    )
    values = [b"ok-0", b"bad-1", b"ok-2", b"bad-3", b"ok-4"]
    with ServerThread(config([hook])) as server, client(server) as c:
        produce(server, topic, None, values)
        wait_until(
            lambda: [b["value"] for b in sink.delivered("/picky")] == ["ok-0", "ok-2", "ok-4"],
            30,
            f"the good records delivered in order (got {sink.delivered('/picky')})",
        )
        wait_until(lambda: stat(server, "push.picky.dead_lettered") == 2, 10, "2 dead-lettered")
        assert stat(server, "push.picky.failed_attempts") == 6
        attempts = [r.body["value"] for r in sink.received("/picky")]
        assert attempts == ["ok-0", *["bad-1"] * 3, "ok-2", *["bad-3"] * 3, "ok-4"]

        wait_until(lambda: c.llen(f"topics:{dead}:0") == 2, 10, "2 records in the dead letters")
        held = c.lrange(f"topics:{dead}:0", 0, -1)
        letters = [dict(zip(r[0::2], r[1::2], strict=True)) for r in held]
    bodies = [json.loads(letter[b"value"]) for letter in letters]
    assert [(b["value"], b["offset"], b["topic"]) for b in bodies] == [
        ("bad-1", 1, topic),
        ("bad-3", 3, topic),
    ]
    for body in bodies:
        assert body["subscription"] == "picky" and body["attempts"] == 3
        assert body["errors"] == [f"{sink.url('/picky')}: HTTP 500 no"]


def test_a_stalled_url_blocks_neither_another_subscription_nor_shutdown(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    topic = new_topic(2)
    sink.answer("/stuck", lambda body: STALL)
    stuck = subscription("stuck", topic, [sink.url("/stuck")], timeout=600)
    slow = subscription("slow", topic, [sink.url("/slow")], timeout=0.3, retry={**QUICK})
    sink.answer("/slow", lambda body: STALL)
    fine = subscription("fine", topic, [sink.url("/fine")], concurrency=2)
    values = [b"r%d" % n for n in range(8)]
    gateway = ServerThread(config([stuck, slow, fine])).start()
    try:
        produce(gateway, topic, None, values)
        wait_until(
            lambda: sorted(b["value"].encode() for b in sink.delivered("/fine")) == values,
            30,
            "every record delivered to the healthy subscription",
        )
        wait_until(lambda: sink.received("/stuck"), 10, "the stalled URL was asked")
        wait_until(lambda: stat(gateway, "push.slow.failed_attempts") >= 2, 10, "timeouts counted")
        assert len(sink.received("/stuck")) == 1, "records of one partition were not in order"
        assert stat(gateway, "push.stuck.delivered") == 0

        started = time.monotonic()
        gateway.shutdown_async().result(30)
        assert time.monotonic() - started < 10, "shutdown waited for a stalled URL"
        left = gateway.call(_push_tasks())
        assert left == [], f"push tasks still running after shutdown: {left}"
    finally:
        gateway.stop()


async def _push_tasks() -> list[str]:
    import asyncio

    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("push-")]


def test_counters_of_each_subscription_reset_with_the_others(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    topic = new_topic(1)
    with ServerThread(config([subscription("c", topic, [sink.url("/c")])])) as server:
        produce(server, topic, None, [b"x"])
        wait_until(lambda: stat(server, "push.c.delivered") == 1, 30, "1 delivered")
        with client(server) as c:
            c.delete("stats")
            stats = c.hgetall("stats")
        assert stats[b"push.c.delivered"] == b"0"
        assert {k for k in stats if k.startswith(b"push.c.")} == {
            b"push.c.delivered",
            b"push.c.failed_attempts",
            b"push.c.dead_lettered",
            b"push.c.errors",
        }


def test_the_push_command_refuses_bad_input(
    config: Callable[..., Config], new_topic: Callable[[int], str]
) -> None:
    with ServerThread(config([])) as server, client(server) as c:
        for args, text in [
            (["ADD", "{"], "push: invalid JSON"),
            (["ADD", '{"name": "x"}'], "push: subscription.topic is required"),
            (["FROB"], "unknown subcommand 'FROB'. Try RAFKA.PUSH HELP."),
            (["REMOVE", "nope"], "push: no subscription named 'nope'"),
            (["LIST", "extra"], "wrong number of arguments for 'rafka.push|list' command"),
        ]:
            with pytest.raises(redis.ResponseError) as error:
                c.execute_command("RAFKA.PUSH", *args)
            assert str(error.value).startswith(text), (args, str(error.value))


def test_a_subscription_holds_no_more_records_than_its_concurrency(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    """A URL that never answers in time: the subscription keeps retrying the records it
    holds and takes no more from the engine than `concurrency`."""
    topic = new_topic(4)
    sink.answer("/never", lambda body: STALL)
    hook = subscription(
        "held",
        topic,
        [sink.url("/never")],
        concurrency=3,
        timeout=0.2,
        retry={"attempts": 1_000_000, **QUICK},
    )
    with ServerThread(config([hook])) as server:
        for key in ("a", "b", "c", "d"):
            produce(server, topic, key, [b"%s%d" % (key.encode(), n) for n in range(5)])
        # Failed attempts are the clock: many rounds of retries have gone by.
        wait_until(lambda: stat(server, "push.held.failed_attempts") >= 12, 30, "12 timeouts")
        assert stat(server, "consumer.consumed.messages") == 3
        asked = {(r.body["partition"], r.body["offset"]) for r in sink.received("/never")}
        assert 1 <= len(asked) <= 3, asked
        assert stat(server, "push.held.delivered") == 0
