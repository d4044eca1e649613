"""Dafka settings: a zconfig-like tree of `/`-separated paths to string values (spec §7),
and its text form ZPL (ZeroMQ Property Language, CZMQ `zconfig`), which the C programs load
with `-c file`:

    beacon
        sub_address = tcp://10.0.0.5:5556   # a comment
    consumer
        offset
            reset = "earliest"

Indentation is 4 spaces per level; a value may be bare (up to a `#` comment) or quoted with
`"` or `'`. A node may have both a value and children.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULTS: dict[str, str] = {
    "producer/verbose": "0",
    "producer/terminate_unacked": "0",
    "producer/head_interval": "1000",
    "producer/high_watermark": "1000000",
    # Not in C (issue 7), ms; README "Settings beyond C" says what each costs.
    "producer/subscribe_settle": "200",  # the first RECORDs wait this long after start
    "producer/close_timeout": "30000",  # close() waits this long for ACKs; -1 = forever
    "consumer/offset/reset": "latest",
    "consumer/verbose": "0",
    "consumer/high_watermark": "1000000",
    "consumer/heads_interval": "5000",  # issue 7: earliest GET_HEADS backoff cap; 0 = once
    "store/db": "storedb",
    "store/verbose": "0",
    "store/high_watermark": "1000000",
    "store/push_heads/interval": "1000",  # issue 7: DIRECT_HEAD to earliest consumers; 0 = off
    "store/push_heads/duration": "10000",  # ... for this long after a partition changed
    "beacon/interval": "1000",
    "beacon/timeout": "4000",
    "beacon/ready_timeout": "10000",
    "beacon/sub_address": "tcp://127.0.0.1:5556",
    "beacon/pub_address": "tcp://127.0.0.1:5557",
    "beacon/address": "",
    "beacon/verbose": "0",
    "tower/sub_address": "tcp://*:5556",
    "tower/pub_address": "tcp://*:5557",
    "tower/verbose": "0",
    "test/verbose": "0",
    "threads/batch": "0",  # not in C: scheduling.py (the gateway sets 1)
}

# zconfig accepts these characters in names (rfc.zeromq.org/spec/4).
_NAME = re.compile(r"[A-Za-z0-9$\-_@.&+/]+")
_INDENT = 4


class ConfigError(ValueError):
    """A malformed ZPL text, or a value that is not what its key needs."""


def _check_path(path: str) -> str:
    parts = path.strip("/").split("/")
    if not path or not all(parts) or not all(_NAME.fullmatch(p) for p in parts):
        raise ConfigError(f"invalid config path {path!r}")
    return "/".join(parts)


class Config:
    """String values by path. Unset paths fall back to the spec §7 defaults."""

    def __init__(self, values: Mapping[str, str | int] | None = None) -> None:
        # Insertion-ordered; intermediate nodes without a value are not stored.
        self._values: dict[str, str] = {}
        for path, value in (values or {}).items():
            self.set(path, value)

    # --- access --------------------------------------------------------------------------

    def get(self, path: str, default: str | None = None) -> str:
        """The value at `path`; else `default` if given; else the spec default; else ""."""
        key = _check_path(path)
        if key in self._values:
            return self._values[key]
        if default is not None:
            return default
        return DEFAULTS.get(key, "")

    def get_int(self, path: str, default: int | None = None) -> int:
        """The value at `path` as an integer (zconfig uses atoi; we refuse garbage)."""
        key = _check_path(path)
        if key not in self._values and default is not None:
            return default
        text = self.get(key)
        try:
            return int(text.strip() or "0")
        except ValueError:
            raise ConfigError(f"config {key} = {text!r} is not an integer") from None

    def get_bool(self, path: str) -> bool:
        """Booleans are "0"/"1" in Dafka configs (anything but 0 is true, as with atoi)."""
        return self.get_int(path) != 0

    def set(self, path: str, value: str | int) -> None:
        self._values[_check_path(path)] = str(value)

    def has(self, path: str) -> bool:
        return _check_path(path) in self._values

    def items(self) -> list[tuple[str, str]]:
        """The explicitly set values, in insertion order."""
        return list(self._values.items())

    def copy(self) -> Config:
        return Config(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._values == other._values

    def __repr__(self) -> str:
        return f"Config({self._values!r})"

    # --- ZPL -----------------------------------------------------------------------------

    @classmethod
    def from_zpl(cls, text: str, source: str = "<zpl>") -> Config:
        config = cls()
        stack: list[str] = []  # names of the current line's ancestors
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.rstrip()
            body = line.lstrip(" ")
            if not body or body.startswith("#"):
                continue
            where = f"{source}:{lineno}"
            indent = len(line) - len(body)
            if "\t" in line[: indent + 1]:
                raise ConfigError(f"{where}: tabs are not allowed for indentation: {raw!r}")
            if indent % _INDENT:
                raise ConfigError(
                    f"{where}: indentation must be a multiple of {_INDENT} spaces: {raw!r}"
                )
            level = indent // _INDENT
            if level > len(stack):
                raise ConfigError(f"{where}: indented too far (no parent line): {raw!r}")
            del stack[level:]
            name, value = _parse_line(body, where)
            stack.append(name)
            path = "/".join(stack)
            if value is not None:
                config.set(path, value)
        return config

    @classmethod
    def load(cls, path: str | Path) -> Config:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
        return cls.from_zpl(text, str(file))

    def to_zpl(self) -> str:
        """The ZPL text; paths are grouped under their parents, whatever the order they
        were set in (a child written after another section would land under that one)."""
        tree: dict[str, Any] = {}
        for path in self._values:
            node = tree
            for part in path.split("/"):
                node = node.setdefault(part, {})
        lines: list[str] = []

        def emit(node: dict[str, Any], prefix: str, depth: int) -> None:
            for name, children in node.items():
                path = f"{prefix}/{name}" if prefix else name
                text = " " * (_INDENT * depth) + name
                if path in self._values:
                    text += " = " + _quote(self._values[path], path)
                lines.append(text)
                emit(children, path, depth + 1)

        emit(tree, "", 0)
        return "".join(line + "\n" for line in lines)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_zpl(), encoding="utf-8")


def _parse_line(body: str, where: str) -> tuple[str, str | None]:
    match = _NAME.match(body)
    if not match or "/" in match.group():
        raise ConfigError(f"{where}: expected a name: {body!r}")
    name = match.group()
    rest = body[match.end() :].lstrip(" ")
    if not rest or rest.startswith("#"):
        return name, None
    if not rest.startswith("="):
        raise ConfigError(f"{where}: expected '=' or end of line after {name!r}: {body!r}")
    rest = rest[1:].lstrip(" ")
    if rest[:1] in ("'", '"'):
        quote = rest[0]
        end = rest.find(quote, 1)
        if end < 0:
            raise ConfigError(f"{where}: missing closing {quote} in {body!r}")
        tail = rest[end + 1 :].strip()
        if tail and not tail.startswith("#"):
            raise ConfigError(f"{where}: unexpected text after the quoted value: {body!r}")
        return name, rest[1:end]
    return name, rest.split("#", 1)[0].rstrip()


def _quote(value: str, path: str) -> str:
    if "\n" in value or "\r" in value:
        raise ConfigError(f"config {path}: ZPL cannot hold a line break in a value")
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    raise ConfigError(f"config {path}: ZPL cannot hold a value with both quote kinds")
