"""The producer: buffers records, one RPUSHX per (topic, key) batch, DUMP as flush."""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from rafka_client._closing import Closing
from rafka_client._link import DEFAULT_URL, Command, Link
from rafka_client.errors import (
    BatchFailure,
    ConnectionLost,
    DeliveryUnknown,
    FlushTimeout,
    ProduceError,
)

log = logging.getLogger("rafka_client.producer")

Target = tuple[str, bytes | None]  # (topic, key)


def _bytes(value: bytes | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, bytes | bytearray | memoryview):
        # bytes(3) would be three zero bytes.
        raise TypeError(f"a value or key is bytes or str, got {type(value).__name__}")
    return bytes(value)


class Producer(Closing):
    """Produces records through a rafka gateway (or a plain Redis test double).

    `produce()` buffers; the buffer is sent when it holds `batch_size` records or
    `batch_bytes` bytes, by `send()`, and by `flush()`. Sending is one RPUSHX per
    (topic, key) batch, all of them in one round trip. `flush(timeout)` sends and then
    waits with DUMP until the gateway has every record of this connection durable, and
    raises FlushTimeout when some are still outstanding. As a context manager it flushes
    on exit.

    Not thread-safe: one producer per thread.
    """

    _close_on_exit = "the flush on exit"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        protocol: int = 3,
        batch_size: int = 1000,
        batch_bytes: int = 1 << 20,
        flush_timeout: float = 10.0,
        socket_timeout: float | None = 30.0,
        produce_block_timeout: float = 60.0,
        **options: Any,
    ) -> None:
        """`url`: redis://[[user]:password@]host[:port]; `protocol`: RESP 2 or 3;
        `flush_timeout`: seconds `close()` and the context manager's exit wait for the
        records; `options`: further redis-py connection settings (e.g.
        `socket_connect_timeout`); `produce_block_timeout`: how long the gateway may hold
        an RPUSHX while its queue is full before answering `PROD Local: Queue full` (the
        gateway's `produce_block_timeout`): replies to a send are awaited that much
        longer than `socket_timeout`.
        """
        if batch_size < 1 or batch_bytes < 1:
            raise ValueError("batch_size and batch_bytes must be >= 1")
        self._link = Link(url, protocol=protocol, socket_timeout=socket_timeout, **options)
        self._socket_timeout = socket_timeout
        self._send_timeout = (
            None if socket_timeout is None else socket_timeout + produce_block_timeout
        )
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes
        self.flush_timeout = flush_timeout
        self._buffer: dict[Target, list[bytes]] = {}
        self._buffered = 0
        self._buffered_bytes = 0
        # Sent since the last flush that confirmed them, on connection number `_sent_on`.
        self._unconfirmed = 0
        self._sent_on = 0
        self._closed = False

    @property
    def buffered(self) -> int:
        """Records produced but not sent yet."""
        return self._buffered

    def produce(self, topic: str, value: bytes | str, key: bytes | str | None = None) -> None:
        """Buffer one record (str is sent as UTF-8); sends the buffer once it is full.

        Raises ValueError for a topic or key the gateway cannot take (empty topic, `:`),
        TypeError for a value or key that is neither bytes nor str, and what `send()`
        raises when the buffer is sent.
        """
        self._check_open()
        if not topic or ":" in topic:
            raise ValueError(f"a topic is not empty and has no ':', got {topic!r}")
        raw_key = None if key is None else _bytes(key)
        if raw_key is not None and b":" in raw_key:
            raise ValueError(f"a key has no ':', got {key!r}")
        data = _bytes(value)
        self._buffer.setdefault((topic, raw_key), []).append(data)
        self._buffered += 1
        self._buffered_bytes += len(data)
        if self._buffered >= self._batch_size or self._buffered_bytes >= self._batch_bytes:
            self.send()

    def _commands(self) -> list[tuple[Target, list[bytes]]]:
        """The buffer as RPUSHX batches of at most batch_size records and batch_bytes."""
        batches: list[tuple[Target, list[bytes]]] = []
        for target, values in self._buffer.items():
            batch: list[bytes] = []
            size = 0
            for value in values:
                if batch and (
                    len(batch) >= self._batch_size or size + len(value) > self._batch_bytes
                ):
                    batches.append((target, batch))
                    batch, size = [], 0
                batch.append(value)
                size += len(value)
            batches.append((target, batch))
        return batches

    def send(self) -> int:
        """Send every buffered record now (one round trip); return how many were sent.

        Raises ProduceError when the gateway refused batches (the others are sent; the
        refused ones are dropped from the buffer, see `failures`), ConnectionLost when the
        connection failed (everything stays buffered: sending again may duplicate
        records the gateway got before it failed).
        """
        self._check_open()
        if not self._buffered:
            return 0
        batches = self._commands()
        commands: list[Command] = [("RPUSHX", _target(t), *values) for t, values in batches]
        try:
            replies = self._link.pipeline(commands, timeout=self._send_timeout)
            # A plain Redis double answers 0 for a list that does not exist yet, and
            # stores nothing: push those batches with RPUSH, which creates the list.
            missing = [i for i, reply in enumerate(replies) if reply == 0]
            if missing:
                pushed = self._link.pipeline([("RPUSH", *commands[i][1:]) for i in missing])
                for i, reply in zip(missing, pushed, strict=True):
                    replies[i] = reply
        except (ConnectionError, RedisTimeout) as error:
            raise ConnectionLost(f"connection lost while sending: {error}") from error
        failures = [
            BatchFailure(target[0], target[1], len(values), str(reply))
            for (target, values), reply in zip(batches, replies, strict=True)
            if isinstance(reply, ResponseError)
        ]
        sent = self._buffered - sum(failure.records for failure in failures)
        self._clear()
        # Records sent on an earlier connection that no flush confirmed: that session is
        # gone, and no DUMP on this connection can tell what became of them.
        lost = self._unconfirmed if self._link.connects != self._sent_on else 0
        self._unconfirmed = sent + (self._unconfirmed - lost)
        self._sent_on = self._link.connects
        if lost:
            unknown = DeliveryUnknown(lost)
            if failures:
                unknown.add_note(f"and the gateway refused: {failures[0].text}")
            raise unknown
        if failures:
            raise ProduceError(failures[0].text, failures)
        return sent

    def _clear(self) -> None:
        self._buffer.clear()
        self._buffered = self._buffered_bytes = 0

    def flush(self, timeout: float = 10.0) -> None:
        """Send the buffer, then wait up to `timeout` seconds (DUMP) until every record
        sent on this connection is durable.

        Raises FlushTimeout when some are still outstanding, DeliveryUnknown when the
        connection was replaced since records were sent, and what `send()` raises.
        """
        self._check_open()
        self.send()
        millis = max(0, round(timeout * 1000))
        wait = None if self._socket_timeout is None else timeout + self._socket_timeout
        try:
            reply = self._link.call("DUMP", millis, timeout=wait)
        except ResponseError as error:
            raise ProduceError(str(error)) from None
        except (ConnectionError, RedisTimeout) as error:
            lost, self._unconfirmed = self._unconfirmed, 0
            if lost:
                raise DeliveryUnknown(lost) from error
            raise ConnectionLost(f"connection lost while flushing: {error}") from error
        if self._unconfirmed and self._link.connects != self._sent_on:
            lost, self._unconfirmed = self._unconfirmed, 0
            raise DeliveryUnknown(lost)
        # The gateway answers how many records are outstanding. Plain Redis's DUMP
        # serialises the key named `millis`: null (no such key) or bytes; its records are
        # stored as soon as RPUSHX answers, so nothing is outstanding.
        outstanding = reply if isinstance(reply, int) else 0
        if outstanding:
            raise FlushTimeout(outstanding, timeout)
        self._unconfirmed = 0

    def _check_open(self) -> None:
        # After close() a call would open a connection that nothing closes.
        if self._closed:
            raise ProduceError("producer closed")

    def close(self, timeout: float | None = None) -> None:
        """Flush for `timeout` seconds (default: `flush_timeout`), raising as `flush`
        does, then close the connection. Idempotent."""
        if self._closed:
            return
        try:
            self.flush(self.flush_timeout if timeout is None else timeout)
        finally:
            self._closed = True
            self._link.quit()


def _target(target: Target) -> bytes:
    topic, key = target
    return b"topics:" + topic.encode() + (b"" if key is None else b":" + key)
