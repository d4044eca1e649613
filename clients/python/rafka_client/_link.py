"""One redis-py connection, driven explicitly: pipelined commands, per-read timeouts,
and a count of how many times it (re)connected.

The client does not use `redis.Redis`: its connection pool reconnects and retries
behind the caller's back, and the client must know when a connection was replaced (a new
connection is a new gateway session: a new consumer-group member, a producer whose
earlier records no DUMP on this connection can confirm).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from redis.backoff import NoBackoff
from redis.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6380"
Command = Sequence[str | bytes | int | float]


class Link:
    def __init__(
        self,
        url: str,
        *,
        protocol: int,
        client_name: str | None = None,
        socket_timeout: float | None = 30.0,
        **options: Any,
    ) -> None:
        if protocol not in (2, 3):
            raise ValueError(f"protocol must be 2 or 3, not {protocol!r}")
        pool = ConnectionPool.from_url(
            url,
            protocol=protocol,
            client_name=client_name,
            socket_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),  # the client decides about reconnecting
            **{**options, "decode_responses": False},
        )
        self._connection: AbstractConnection = pool.connection_class(**pool.connection_kwargs)
        self._connection.register_connect_callback(self._connected)
        # Successful connects so far: a change means a new gateway session.
        self.connects = 0

    def _connected(self, _: AbstractConnection) -> None:
        self.connects += 1

    @property
    def connected(self) -> bool:
        """Connected as far as redis-py knows (a peer's close is noticed on next use)."""
        return bool(self._connection.is_connected)

    def connect(self) -> None:
        """Connect (and identify) now if not connected; raises redis-py's errors."""
        self._connection.connect()

    def call(self, *args: str | bytes | int | float, timeout: float | None = None) -> Any:
        """One command's reply; `timeout`: seconds to wait for it (None: the socket
        timeout). Raises ResponseError for an error reply, ConnectionError /
        TimeoutError when the connection fails (it is then closed)."""
        [reply] = self.pipeline([args], timeout=timeout)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def pipeline(self, commands: Sequence[Command], *, timeout: float | None = None) -> list[Any]:
        """Every command's reply, in order, sent in one write; error replies are
        returned as ResponseError instances, not raised."""
        connection = self._connection
        connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                if timeout is None:
                    replies.append(connection.read_response())
                else:
                    replies.append(connection.read_response(timeout=timeout))
            except ResponseError as error:
                replies.append(error)
        return replies

    def disconnect(self) -> None:
        self._connection.disconnect()

    def quit(self) -> None:
        """QUIT politely if connected, then close."""
        if self.connected:
            with contextlib.suppress(ConnectionError, ResponseError, RedisTimeout, OSError):
                self.call("QUIT", timeout=5.0)
        self.disconnect()
