"""Helpers for the gateway tests: servers, clients, raw sockets, Kafka group states."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from backends.base import Engine, Stats
from backends.registry import engine_entry
from gateway.config import Config
from gateway.runner import ServerThread
from tests.support import resp

T = TypeVar("T")


def configured_engine(config: Config) -> Engine:
    """The engine `config` names, made as the server makes it (not started)."""
    entry = engine_entry(config.engine)
    return entry.create(config.engine_settings, Stats(), config.engine_options())


@contextmanager
def running(config: Config) -> Iterator[ServerThread]:
    with ServerThread(config) as server:
        yield server


def group_state(admin: AdminClient, group: str) -> ConsumerGroupState:
    """The coordinator's state of `group` (on Tansu, STABLE once a SyncGroup completed)."""
    state: ConsumerGroupState = admin.describe_consumer_groups([group])[group].result(5).state
    return state


def refused(port: int) -> bool:
    """Nothing listens on 127.0.0.1:`port` any more."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def client(server: ServerThread, **kwargs: Any) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=30, **kwargs)


class Raw:
    """A raw socket to the server, for tests where exact bytes matter."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(
                    f"connection closed after {self._buffer!r}, expected {size} bytes"
                )
            self._buffer += chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def expect(self, expected: bytes) -> None:
        got = self.read_exact(len(expected))
        assert got == expected, f"expected {expected!r}, got {got!r}"

    def read_line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed after {self._buffer!r}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line + b"\r\n"

    def read_reply(self) -> Any:
        """One whole reply, decoded (RESP2 and RESP3 types; errors as ("ERR", text))."""
        line = self.read_line()[:-2]
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return (kind.decode(), rest.decode()) if kind == b"-" else rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"_":
            return None
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.read_exact(size + 2)[:-2]
        if kind in (b"*", b"~", b">"):
            size = int(rest)
            return None if size < 0 else [self.read_reply() for _ in range(size)]
        if kind == b"%":
            return {self.read_reply(): self.read_reply() for _ in range(int(rest))}
        raise AssertionError(f"unexpected reply line {line!r}")

    def command(self, *args: bytes | str) -> None:
        self.send(resp.command(*args))

    def assert_closed(self, timeout: float = 5.0) -> None:
        """The server closed the connection (EOF or reset) with nothing more to read."""
        self.sock.settimeout(timeout)
        try:
            rest = self.sock.recv(65536)
        except ConnectionResetError:
            rest = b""
        assert self._buffer + rest == b"", f"unexpected bytes {self._buffer + rest!r}"

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
