"""HTTP push subscriptions (docs/push.md) against a real HTTP server on loopback that
fails (5xx) and stalls on purpose, on a gateway on each real engine."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.config import Config, ConfigError, from_dict
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
    """The push subscriptions' tasks still running (run on the gateway's loop)."""
    return [
        t.get_name()
        for t in asyncio.all_tasks()
        if t.get_name().startswith("push-") and not t.done()
    ]


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
        names = list(stats)  # in the reply's order
        assert names[-4:] == [
            b"push.c.delivered",
            b"push.c.failed_attempts",
            b"push.c.dead_lettered",
            b"push.c.errors",
        ], "a subscription's counters come after the fixed ones (docs/gateway.md)"


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


# --- redirects, specs that can never deliver, a stop racing an ADD, hostile JSON -----------


class RedirectingServer:
    """POST /moved answers `status` with `Location: /landing`; /landing answers 200 to
    GET and POST and records what it got (method, body)."""

    def __init__(self, status: int) -> None:
        self.lock = threading.Lock()
        self.landing: list[tuple[str, bytes]] = []
        self.moved: list[bytes] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def _answer(self, status: int, location: str | None = None) -> None:
                self.send_response(status)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def do_POST(self) -> None:
                body = self._body()
                if self.path == "/moved":
                    with owner.lock:
                        owner.moved.append(body)
                    self._answer(status, "/landing")
                else:
                    with owner.lock:
                        owner.landing.append(("POST", body))
                    self._answer(200)

            def do_GET(self) -> None:
                with owner.lock:
                    owner.landing.append(("GET", b""))
                self._answer(200)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="redirecting")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __enter__(self) -> RedirectingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.mark.parametrize("status", [301, 302, 303])
def test_a_redirect_that_drops_the_body_is_not_a_delivery(
    config: Callable[..., Config],
    new_topic: Callable[[int], str],
    status: int,
) -> None:
    """docs/push.md: a record is acked only once every URL answered 2xx. A URL that
    answers 301/302/303 has not taken the record; aiohttp follows the redirect with a
    GET without the body, and the GET's 200 must not count as the record's delivery."""
    topic, dead = new_topic(1), new_topic(1)
    with RedirectingServer(status) as web:
        hook = subscription(
            "moved",
            topic,
            [web.url("/moved")],
            dead_letter_topic=dead,
            retry={"attempts": 2, **QUICK},
        )
        with ServerThread(config([hook])) as server:
            produce(server, topic, None, [b"precious"])
            wait_until(
                lambda: (
                    stat(server, "push.moved.delivered") + stat(server, "push.moved.dead_lettered")
                    >= 1
                ),
                30,
                "the record delivered or dead-lettered",
            )
            delivered = stat(server, "push.moved.delivered")
            with web.lock:
                landing = list(web.landing)
        posted = [json.loads(body)["value"] for method, body in landing if method == "POST"]
        assert delivered == 0 or posted == ["precious"], (
            f"the record was counted delivered (and acked) after HTTP {status}, yet no URL "
            f"received it in a POST: the redirect target got {landing}"
        )


GOOD = {"name": "hook", "topic": "t", "group": "g", "urls": ["http://127.0.0.1:9/x"]}


@pytest.mark.parametrize(
    ("change", "key"),
    [
        # `$` in the checks' patterns matches before a final newline.
        ({"name": "hook\n"}, "subscription.name"),
        ({"headers": {"X-Token\n": "v"}}, "subscription.headers"),
        # Values aiohttp refuses on every POST ("Forbidden control character").
        ({"headers": {"X-Token": "a\x00b"}}, "subscription.headers.X-Token"),
        # Ports aiohttp refuses on every POST (InvalidUrlClientError).
        ({"urls": ["http://127.0.0.1:99999/x"]}, "subscription.urls[0]"),
        ({"urls": ["http://127.0.0.1:port/x"]}, "subscription.urls[0]"),
        # urlsplit raises a plain ValueError: not the key-naming refusal.
        ({"urls": ["http://[::1/x"]}, "subscription.urls[0]"),
    ],
)
def test_rafka_push_add_refuses_a_subscription_that_can_never_deliver(
    gateway_config: Any, tmp_path: Any, change: dict[str, Any], key: str
) -> None:
    """docs/push.md: a malformed subscription is refused with a message naming the key.
    These are accepted (+OK) and then every record fails every attempt and ends in the
    dead-letter topic, or (the last) answered with a bare internal error."""
    gateway = ServerThread(gateway_config("dafka", data_dir=str(tmp_path)))
    with gateway as server, client(server) as c:
        try:
            reply: Any = c.execute_command("RAFKA.PUSH", "ADD", json.dumps({**GOOD, **change}))
        except redis.ResponseError as error:
            reply = f"-{error}"
        listed = c.execute_command("RAFKA.PUSH", "LIST")
    assert isinstance(reply, str) and reply.startswith(f"-push: {key}"), (
        f"RAFKA.PUSH ADD {change} answered {reply!r}, not a refusal naming {key}; "
        f"the gateway now runs {[json.loads(s)['name'] for s in listed]}"
    )


def test_a_bad_url_in_the_configuration_file_is_a_clear_error_not_a_traceback() -> None:
    """from_dict (what `rafka -c` reads): ConfigError naming the key, as for every other
    malformed subscription; a plain ValueError makes rafka exit with a traceback."""
    try:
        from_dict({"subscriptions": [{**GOOD, "urls": ["http://[::1/x"]}]})
    except ConfigError as error:
        assert str(error).startswith("subscriptions[0].urls[0]"), str(error)
    except Exception as error:
        raise AssertionError(
            f"a malformed URL raised {type(error).__name__}: {error}, not ConfigError"
        ) from None
    else:
        raise AssertionError("a malformed URL was accepted")


def _refuses_consumers(port: int) -> bool:
    """A new connection's BLPOP answers `CONS Server shutdown` (or none is accepted)."""
    try:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as c:
            c.execute_command("CLIENT", "SETNAME", "probe:probe")
            c.execute_command("BLPOP", "topics:probe", "0.05")
    except redis.ConnectionError:
        return True
    except redis.ResponseError as error:
        return "Server shutdown" in str(error)
    return False


def _unfreeze(gateway: ServerThread) -> None:
    """Cleanup after a failure only: raise in the gateway's loop thread, which spins in
    a push task, so that the task ends and the loop (and the test run) can stop."""
    import ctypes

    ident = gateway._thread.ident
    assert ident is not None
    for _ in range(100):
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(RuntimeError)
        )
        try:
            gateway.call(_push_tasks(), 0.1)
            return
        except concurrent.futures.TimeoutError:
            continue


def test_a_subscription_added_while_the_gateway_stops_does_not_outlive_it(
    gateway_config: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/push.md (Shutdown): the subscriptions stop with the consumers, before the
    engine. An ADD whose state file is being written when the shutdown begins must be
    refused or stopped; it starts a subscription after PushManager.stop() instead, which
    runs on after the engine stopped. The file write is held (a test hook around
    _save_state) to make the interleaving certain; it is the fsync a SIGTERM can meet."""
    import gateway.push.manager as manager

    entered, release = threading.Event(), threading.Event()
    save = manager._save_state

    def held_save(*args: Any) -> None:
        entered.set()
        release.wait(30)
        save(*args)

    monkeypatch.setattr(manager, "_save_state", held_save)
    gateway = ServerThread(gateway_config("dafka", data_dir=str(tmp_path))).start()
    try:
        port = gateway.port
        assert not _refuses_consumers(port), "BLPOP refused before the shutdown"
        replies: list[Any] = []

        def add() -> None:
            with client(gateway) as c:
                hook = {**GOOD, "name": "late", "urls": ["http://127.0.0.1:9/x"]}
                try:
                    replies.append(c.execute_command("RAFKA.PUSH", "ADD", json.dumps(hook)))
                except redis.RedisError as error:
                    replies.append(error)

        adder = threading.Thread(target=add)
        adder.start()
        assert entered.wait(10), "RAFKA.PUSH ADD did not reach the state file"
        stopping = gateway.shutdown_async()
        # Steps 1-4 of the shutdown run together: once a new BLPOP is refused, the push
        # subscriptions are being stopped (PushManager.stop() has run on the current code).
        wait_until(lambda: _refuses_consumers(port), 20, "BLPOP refused by the shutdown")
        release.set()
        adder.join(30)
        try:
            stopping.result(30)
        except concurrent.futures.TimeoutError:
            _unfreeze(gateway)
            raise AssertionError(
                "the shutdown did not complete within 30 s: the subscription added while "
                f"the gateway stopped (ADD answered {replies}) was started after the push "
                "subscriptions had stopped; the engine's stop closed its consumer and its "
                "pump spins on next() returning None at once, freezing the event loop"
            ) from None
        left = gateway.call(_push_tasks(), 10)
        assert left == [], (
            f"push tasks still running after the shutdown completed: {left} "
            f"(the ADD answered {replies})"
        )
    finally:
        release.set()
        gateway.stop()


def test_deeply_nested_json_is_refused_as_invalid_json(gateway_config: Any, tmp_path: Any) -> None:
    """RAFKA.PUSH ADD with JSON nested deeper than the decoder's recursion: the client's
    input is bad, so `-ERR push: invalid JSON ...` as for any other undecodable JSON, not
    `-ERR internal error, see the server log` with a traceback in the log."""
    gateway = ServerThread(gateway_config("dafka", data_dir=str(tmp_path)))
    with gateway as server, client(server) as c, pytest.raises(redis.ResponseError) as error:
        c.execute_command("RAFKA.PUSH", "ADD", "[" * 100_000)
    assert str(error.value).startswith("push: invalid JSON"), str(error.value)


def test_a_subscription_whose_consumer_the_engine_closed_does_not_spin(
    config: Callable[..., Config], new_topic: Callable[[int], str], sink: HttpSink
) -> None:
    """A closed consumer's next() returns None at once, on both engines: a subscription
    whose consumer the engine closed under it (here the engine stopped behind the
    gateway's back: a stand-in for an engine that ends its consumers) spun in its pump
    without ever yielding, and the gateway's loop answered nobody again. The pump now
    ends on a closed consumer and the runner makes another (or backs off while the
    engine refuses)."""
    topic = new_topic(1)
    gateway = ServerThread(config([subscription("closed", topic, [sink.url("/c")])])).start()
    try:
        produce(gateway, topic, None, [b"one"])
        wait_until(lambda: len(sink.delivered("/c")) == 1, 30, "the record pushed")
        try:
            gateway.call(gateway.server.ctx.engine.stop(), 30)
            with redis.Redis(host="127.0.0.1", port=gateway.port, socket_timeout=5) as c:
                assert c.ping(), "the gateway's loop does not answer"
        except (concurrent.futures.TimeoutError, redis.TimeoutError):
            _unfreeze(gateway)
            raise AssertionError(
                "the gateway's loop stopped answering once the engine closed the "
                "subscription's consumer (its pump spins on next() returning None)"
            ) from None
    finally:
        gateway.stop()
