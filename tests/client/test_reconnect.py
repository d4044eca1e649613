"""The client when its connection goes away: the gateway restarts on the same port, the
network cuts the connection, the gateway stays down. Records not acked come again and
nothing is lost; acked ones do not come back."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import hiredis
import pytest
from rafka_client import ConnectionLost, Consumer, DeliveryUnknown, Producer, Record

from backends.ports import free_port
from gateway.runner import ServerThread
from tests.client.conftest import WAIT, Backend, new_group, proxied_consumer, take
from tests.support.engines import EngineFactory
from tests.support.gateway import Raw
from tests.support.proxy import TcpProxy


def values_of(records: list[Record]) -> set[bytes]:
    return {r.value or b"" for r in records}


def take_until(consumer: Consumer, wanted: set[bytes], timeout: float = 2 * WAIT) -> list[Record]:
    """Poll until every value of `wanted` arrived; fails naming those that did not."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while not wanted <= values_of(records):
        missing = sorted(wanted - values_of(records))
        assert time.monotonic() < deadline, f"never delivered: {missing}"
        record = consumer.poll(0.5)
        if record is not None:
            records.append(record)
    return records


class Restartable:
    """A gateway that a test stops and starts again on the same port."""

    def __init__(self, factory: EngineFactory) -> None:
        self.port = free_port()
        self.config = factory.gateway_config(port=self.port)
        self.url = f"redis://127.0.0.1:{self.port}"
        self.server: ServerThread | None = ServerThread(self.config).start()

    def restart(self) -> None:
        self.stop()
        self.server = ServerThread(self.config).start()

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()


@contextmanager
def restartable(factory: EngineFactory) -> Iterator[Restartable]:
    gateway = Restartable(factory)
    try:
        yield gateway
    finally:
        gateway.stop()


def test_a_consumer_and_a_producer_carry_on_after_the_gateway_restarts(
    engine_factory: EngineFactory,
) -> None:
    topic, group = engine_factory.new_topic(2), new_group()
    values = {b"r%d" % n for n in range(10)}
    with restartable(engine_factory) as gateway:
        with Producer(gateway.url) as producer:
            for value in sorted(values):
                producer.produce(topic, value)
        # One record per round trip, so that what comes next is exact (records of a batch
        # wait in the consumer, redelivered ones too): batches after a reconnect are
        # tested by test_a_consumer_carries_on_when_its_connection_is_cut.
        consumer = Consumer(group, "c", topic, url=gateway.url, auto_ack=False, batch=1)
        first = take(consumer, 4)
        # Records of a partition come in offset order: acking the first two commits
        # exactly them.
        consumer.ack(*first[:2])
        consumer.commit()
        producer = Producer(gateway.url)
        producer.produce(topic, b"sent, not flushed")
        producer.send()

        gateway.restart()

        rest = take_until(consumer, values - values_of(first[:2]) | {b"sent, not flushed"})
        assert consumer.reconnects == 1
        assert values_of(first[2:]) <= values_of(rest), "taken, not acked: delivered again"
        assert not values_of(first[:2]) & values_of(rest), "acked records came back"
        assert values_of(first) | values_of(rest) == values | {b"sent, not flushed"}
        # The producer cannot know what became of its record: it says so...
        with pytest.raises(DeliveryUnknown) as unknown:
            producer.flush(5)
        assert unknown.value.records == 1
        # ...and goes on, on a new connection.
        producer.produce(topic, b"after the restart")
        producer.close()
        [after] = take(consumer, 1)
        assert after.value == b"after the restart"
        consumer.ack(*rest, after)
        consumer.commit()

        # A poll waiting in BLPOP when the gateway shuts down (`CONS Server shutdown`)
        # reconnects and goes on waiting.
        got: list[Record | None] = []
        waiting = threading.Thread(target=lambda: got.append(consumer.poll(3 * WAIT)))
        with Raw(gateway.port) as monitor:
            monitor.command("MONITOR")
            monitor.expect(b"+OK\r\n")
            waiting.start()
            while b'"BLPOP"' not in monitor.read_line():
                pass  # bounded by the socket's timeout: the BLPOP is waiting now
        gateway.restart()
        with Producer(gateway.url) as late:
            late.produce(topic, b"while waiting")
        waiting.join(3 * WAIT)
        assert not waiting.is_alive(), "the waiting poll never returned"
        [record] = got
        assert record is not None and record.value == b"while waiting"
        assert consumer.reconnects >= 2
        consumer.close()


@pytest.mark.parametrize("batch", [1, 100])
def test_a_consumer_carries_on_when_its_connection_is_cut(backend: Backend, batch: int) -> None:
    topic, group = backend.new_topic(1), new_group()
    values = [b"r%d" % n for n in range(8)]
    with Producer(backend.url) as producer:
        for value in values:
            producer.produce(topic, value)
    port = int(backend.url.rsplit(":", 1)[1])
    with TcpProxy(port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}"
        consumer = Consumer(group, "c", topic, url=url, batch=batch)
        seen: list[Record] = []
        deadline = time.monotonic() + 2 * WAIT
        for record in consumer:  # auto_ack: each record acked once the next is asked for
            seen.append(record)
            if len(seen) == 3:
                assert proxy.cut() == 1  # while the third record is being processed
            if values_of(seen) == set(values) and len(seen) >= len(values) + (
                0 if backend.double else 1
            ):
                break
            assert time.monotonic() < deadline, f"only got {[r.value for r in seen]}"
        consumer.close()
        assert consumer.reconnects == 1
        assert proxy.accepted == 2
    got = [r.value or b"" for r in seen]
    if backend.double:
        # A list forgets what it handed out: after the reconnect, the rest, once. (The
        # client asks a plain Redis for one record at a time, whatever its batch.)
        assert got == values
    elif batch == 1:
        # r0 and r1 were acked (each with the poll for the next record); r2, cut while
        # being processed, was not: it comes again, then everything after it.
        assert got == [*values[:3], *values[2:]]
    else:
        # Acks travel with the next batch's request: the cut came before that request
        # for whatever the last batch held, so the group starts again at the last ack
        # sent, r2 at the latest (r2 was never acked). Nothing is skipped, order holds.
        restart = next(i for i in range(1, len(got)) if got[i] <= got[i - 1])
        assert restart >= 3 and got[:restart] == values[:restart], got
        again = values.index(got[restart])
        assert again <= 2, f"acked only up to r1, yet the group restarted at {got[restart]!r}"
        assert got[restart:] == values[again : again + len(got) - restart], got


def test_a_consumer_gives_up_when_the_server_stays_away(backend: Backend) -> None:
    topic = backend.new_topic(1)
    port = int(backend.url.rsplit(":", 1)[1])
    proxy = TcpProxy(port).start()
    consumer = proxied_consumer(proxy.port, topic)
    assert consumer.poll(0.1) is None
    proxy.close()  # the connection is cut and nothing listens any more
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match=r"^no connection after"):
        consumer.poll(WAIT)
    assert time.monotonic() - started < 3, "gave up later than its reconnect_timeout"
    consumer.close()
    with Producer(backend.url) as producer:  # the server itself is fine
        producer.produce(topic, b"still there")
        assert producer.send() == 1


class ForeverShuttingDown:
    """A server that accepts connections and answers every BLPOP `CONS Server shutdown`,
    as a gateway does while it shuts down (RESP2 only: enough for a protocol=2 client)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    @staticmethod
    def _answer(connection: socket.socket) -> None:
        reader = hiredis.Reader()
        with connection:
            while data := connection.recv(65536):
                reader.feed(data)
                while (command := reader.gets()) is not False:
                    name = command[0].upper()
                    if name == b"BLPOP":
                        connection.sendall(b"-CONS Server shutdown\r\n")
                    else:  # CLIENT SETNAME / SETINFO, QUIT
                        connection.sendall(b"+OK\r\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)


def consumer_of(server: ForeverShuttingDown, reconnect_timeout: float) -> Consumer:
    """A consumer of `server` that backs off from 0.05 to 0.4 s between sessions."""
    return Consumer(
        new_group(),
        "c",
        "t",
        url=f"redis://127.0.0.1:{server.port}",
        protocol=2,
        backoff=(0.05, 0.4),
        reconnect_timeout=reconnect_timeout,
    )


def test_reconnects_back_off_while_the_gateway_keeps_shutting_down() -> None:
    server = ForeverShuttingDown()
    try:
        consumer = consumer_of(server, reconnect_timeout=1.5)
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="CONS Server shutdown"):
            consumer.poll(WAIT)
        elapsed = time.monotonic() - started
        # Waits of 0, 0.05, 0.1, 0.2, 0.4, 0.4...: a handful of sessions, not a storm.
        assert 1.0 < elapsed < 3, f"gave up after {elapsed:.2f}s"
        assert 4 <= server.connections <= 10, f"{server.connections} connections"
        consumer.close()
    finally:
        server.close()


def test_poll_returns_after_its_timeout_while_the_gateway_shuts_down() -> None:
    """README: `poll(timeout)` returns "None after `timeout` seconds", and the consumer
    reconnects with backoff while "sessions end at once" (a gateway shutting down
    answers every BLPOP `CONS Server shutdown`, as ForeverShuttingDown
    does). poll(0.3) must come back after about 0.3 s plus one
    backoff step (as before 7874c13), leaving the application its loop; since 7874c13
    each reconnect is followed by another BLPOP whatever the deadline, so one poll(0.3)
    runs every reconnect until reconnect_timeout and raises ConnectionLost."""
    server = ForeverShuttingDown()
    try:
        consumer = consumer_of(server, reconnect_timeout=6.0)
        started = time.monotonic()
        try:
            outcome: object = consumer.poll(0.3)
        except ConnectionLost as error:
            outcome = error
        elapsed = time.monotonic() - started
        consumer.close()
        assert elapsed < 1.5, (
            f"poll(0.3) came back after {elapsed:.1f}s with {outcome!r}, after"
            f" {consumer.reconnects} reconnects: it ignored its timeout"
        )
    finally:
        server.close()
