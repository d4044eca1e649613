"""Configuration: Rafka's JSON file plus our `gateway` section and CLI flags.

Built once, at start, into the frozen `Config`. Precedence, highest first: command-line
flags, the file's `gateway` section, the defaults below.

File format (Rafka 0.6.2, spec §8.2, plus `gateway`)::

    {"general": {...}, "consumer": {...}, "producer": {...}, "gateway": {...},
     "subscriptions": [...]}

The gateway reads only its own `gateway` section, whose `engine` names the engine. That
engine reads its own sections of the same document (the Kafka engine: Rafka's
`general`, `consumer` and `producer`; see backends.registry) into settings the gateway
keeps without looking into them. `subscriptions` lists the HTTP push subscriptions
(gateway.push.spec; docs/push.md). Numbers are decoded as Go did (`JsonNumber`). Missing
sections are empty; unknown top-level keys are ignored, as in Rafka.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from backends.base import EngineConfigError, EngineOptions, EngineSettings
from backends.registry import DEFAULT_ENGINE, ENGINES, engine_entry, engine_for
from backends.settings import REDACTED, JsonNumber, json_decoder, json_int
from gateway import __version__
from gateway.push.spec import Subscription, SubscriptionError, parse_subscriptions

LOG_FORMATS = ("console", "json")
EVENT_LOOPS = ("asyncio", "uvloop")
LOG_LEVELS = ("debug", "info", "warning", "error")
# tls-auth-clients, as in redis.conf: client certificates required, checked when given, or
# not asked for.
TLS_AUTH_CLIENTS = ("yes", "optional", "no")


class ConfigError(Exception):
    """A bad configuration file or flag; the message names the problem."""


@dataclass(frozen=True)
class Config:
    """Everything the server needs, fixed at start."""

    host: str = "0.0.0.0"
    # The plaintext port; None: no plaintext listener (the default once tls_port is set,
    # unless `port` is given).
    port: int | None = 6380
    # The TLS port (redis.conf's tls-port); None: no TLS listener. 0: any free port.
    tls_port: int | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_cert_file: str | None = None
    tls_auth_clients: str = "yes"
    engine: str = DEFAULT_ENGINE
    # The default user's password (`AUTH pass`, requirepass). When it or `users` is set,
    # clients must AUTH (or HELLO ... AUTH) before any other command.
    password: str | None = None
    # More users: name -> password (`AUTH user pass`).
    users: Mapping[str, str] = field(default_factory=dict)
    # Seconds a connection waits before a failed AUTH is answered (others are served).
    auth_failure_delay: float = 0.5
    max_clients: int = 10_000
    # Seconds a connection may stay silent before it is closed; 0 = never.
    idle_timeout: float = 0.0
    # Seconds one command may take to arrive in full once its first byte has come (a
    # client trickling a partial command is silent to no idle timeout); 0 = no bound.
    partial_command_timeout: float = 300.0
    # RESP parser limits (gateway.resp.ParserLimits).
    max_arguments: int = 1024 * 1024
    max_bulk_length: int = 32_768_000
    max_inline_length: int = 64 * 1024
    max_query_buffer: int = 64 * 1024 * 1024
    # BLPOP timeout when the last argument is not a number (Rafka's hard-coded 5 s).
    blpop_default_timeout: float = 5.0
    # How long an RPUSHX whose records do not fit the engine's queue waits for room
    # (Kafka's max.block.ms) before answering `PROD Local: Queue full`; meanwhile its
    # connection is not read. 0 = answer at once (Rafka).
    produce_block_timeout: float = 60.0
    # How long a closing session's producer may flush (Rafka's hard-coded 5 s).
    producer_close_timeout: float = 5.0
    # Bound on the whole shutdown sequence; work still pending after it is abandoned.
    shutdown_timeout: float = 30.0
    # Bound on engine metadata calls (KEYS topics:).
    metadata_timeout: float = 5.0
    # Records a consumer may fetch ahead of its BLPOPs; bounds its memory (lower it for
    # large records).
    consume_batch: int = 500
    # Lines a MONITOR connection may have queued before new ones are dropped (Rafka: 1000).
    monitor_queue_size: int = 1000
    # Bytes of lines a MONITOR connection may have queued before new ones are dropped.
    monitor_queue_bytes: int = 16 * 1024 * 1024
    # Records one LRANGE may answer; a larger range is refused.
    max_range: int = 1000
    log_format: str = "console"
    # The event loop: asyncio's own, or uvloop's (libuv; installed with rafka).
    event_loop: str = "uvloop"
    log_level: str = "info"
    # Where an engine that keeps data on this machine keeps it (Dafka, embedded).
    data_dir: str = "rafka-data"
    # The Prometheus endpoint (gateway.metrics): off while metrics_port is None; 0 picks a
    # free port. metrics_host None: the gateway's own host.
    metrics_port: int | None = None
    metrics_host: str | None = None
    # Bound on reading consumer lag at one scrape, seconds.
    metrics_lag_timeout: float = 5.0
    # What the engine's parse_settings() made of its sections of the document; None
    # means those of an empty document.
    engine_settings: EngineSettings = None
    # HTTP push subscriptions of the configuration file (docs/push.md).
    subscriptions: tuple[Subscription, ...] = ()
    config_path: str | None = None

    def __post_init__(self) -> None:
        if self.engine_settings is None:
            # Frozen: the dataclass way to complete a field at construction.
            object.__setattr__(self, "engine_settings", _engine_settings(self.engine, {}))
        else:
            _engine_name(self.engine)
        _check_listeners(self)

    @property
    def auth_required(self) -> bool:
        return self.password is not None or bool(self.users)

    def engine_options(self) -> EngineOptions:
        """The settings of the `gateway` section that the engine needs too."""
        return EngineOptions(
            metadata_timeout=self.metadata_timeout,
            consume_batch=self.consume_batch,
            data_dir=self.data_dir,
        )

    def redacted(self) -> dict[str, Any]:
        """The configuration as a dict fit for logging: every secret replaced, the
        engine's settings as the engine describes them."""
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "engine_settings":
                out[item.name] = engine_entry(self.engine).describe(value)
            elif item.name == "password" and value is not None:
                out[item.name] = REDACTED
            elif item.name == "users":
                out[item.name] = {user: REDACTED for user in value}
            elif item.name == "subscriptions":
                # Header values may be credentials (Authorization).
                out[item.name] = [
                    {**s.to_json(), "headers": dict.fromkeys(s.headers, REDACTED)} for s in value
                ]
            else:
                out[item.name] = value
        return out


def _check_listeners(config: Config) -> None:
    """A port at least, for TLS its files (their contents are checked when the server
    starts: gateway.tls), and one password per user."""
    if config.port is None and config.tls_port is None:
        raise ConfigError("nothing to listen on: set gateway.port or gateway.tls-port")
    if config.password is not None and "default" in config.users:
        raise ConfigError("gateway.password and gateway.users.default both set a password")
    if config.tls_port is None:
        return
    for key in ("tls_cert_file", "tls_key_file"):
        if not getattr(config, key):
            raise ConfigError(f"gateway.tls-port is set but gateway.{_redis_name(key)} is not")
    if config.tls_auth_clients != "no" and not config.tls_ca_cert_file:
        raise ConfigError(
            f"gateway.tls-auth-clients is {config.tls_auth_clients!r} but "
            "gateway.tls-ca-cert-file is not set: give the CA that signs client "
            "certificates, or set tls-auth-clients to no"
        )


# --- gateway section ---------------------------------------------------------------------


def _as_int(key: str, value: object, minimum: int, maximum: int | None = None) -> int:
    return json_int(f"gateway.{key}", value, minimum, maximum, ConfigError)


# The longest wait an engine call takes: librdkafka counts its timeouts in milliseconds as a
# 32-bit int (a longer one overflowed, and failed at once as "Local: Timed out").
ENGINE_WAIT_MAX = 2_147_483.0


def _as_seconds(key: str, value: object, *, allow_zero: bool, most: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, JsonNumber | int | float):
        raise ConfigError(f"gateway.{key} must be a number of seconds, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"gateway.{key} must be a finite number {bound}, got {value}")
    if number > most:
        raise ConfigError(f"gateway.{key} must be at most {most:.0f} s, got {value}")
    return number


def _as_choice(key: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or isinstance(value, JsonNumber) or value not in choices:
        raise ConfigError(f"gateway.{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _as_text(key: str, value: object) -> str:
    if not isinstance(value, str) or isinstance(value, JsonNumber):
        raise ConfigError(f"gateway.{key} must be a string, got {value!r}")
    return value


def _as_path(key: str, value: object) -> str:
    text = _as_text(key, value)
    if not text:  # "" would be the working directory, whatever it is
        raise ConfigError(f"gateway.{key} must not be empty")
    return text


def _as_users(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ConfigError("gateway.users must be an object of user name -> password")
    users: dict[str, str] = {}
    for name, password in value.items():
        if not name or any(c.isspace() for c in name):
            raise ConfigError(f"gateway.users: bad user name {name!r}")
        if not isinstance(password, str) or isinstance(password, JsonNumber):
            # The value is a secret: never repeat it.
            raise ConfigError(f"gateway.users.{name} must be a string (the password)")
        users[name] = password
    return users


def _engine_name(value: object) -> str:
    return _as_choice("engine", value, tuple(ENGINES))


def _engine_settings(engine: str, document: Mapping[str, object]) -> EngineSettings:
    try:
        return engine_entry(_engine_name(engine)).parse_settings(document)
    except EngineConfigError as error:
        raise ConfigError(str(error)) from None


_GATEWAY_KEYS: dict[str, Any] = {
    "engine": _engine_name,
    "host": lambda v: _as_text("host", v),
    "port": lambda v: _as_int("port", v, 0, 65535),
    "tls_port": lambda v: _as_int("tls-port", v, 0, 65535),
    "tls_cert_file": lambda v: _as_text("tls-cert-file", v),
    "tls_key_file": lambda v: _as_text("tls-key-file", v),
    "tls_ca_cert_file": lambda v: _as_text("tls-ca-cert-file", v),
    "tls_auth_clients": lambda v: _as_choice("tls-auth-clients", v, TLS_AUTH_CLIENTS),
    "password": lambda v: _as_text("password", v),
    "users": _as_users,
    "auth_failure_delay": lambda v: _as_seconds("auth_failure_delay", v, allow_zero=True),
    "max_clients": lambda v: _as_int("max_clients", v, 1),
    "idle_timeout": lambda v: _as_seconds("idle_timeout", v, allow_zero=True),
    "partial_command_timeout": lambda v: _as_seconds("partial_command_timeout", v, allow_zero=True),
    "max_arguments": lambda v: _as_int("max_arguments", v, 1),
    "max_bulk_length": lambda v: _as_int("max_bulk_length", v, 1),
    "max_inline_length": lambda v: _as_int("max_inline_length", v, 1),
    "max_query_buffer": lambda v: _as_int("max_query_buffer", v, 1),
    "blpop_default_timeout": lambda v: _as_seconds("blpop_default_timeout", v, allow_zero=False),
    "produce_block_timeout": lambda v: _as_seconds("produce_block_timeout", v, allow_zero=True),
    "producer_close_timeout": lambda v: _as_seconds("producer_close_timeout", v, allow_zero=True),
    "shutdown_timeout": lambda v: _as_seconds("shutdown_timeout", v, allow_zero=False),
    "metadata_timeout": lambda v: _as_seconds(
        "metadata_timeout", v, allow_zero=False, most=ENGINE_WAIT_MAX
    ),
    "monitor_queue_size": lambda v: _as_int("monitor_queue_size", v, 1),
    "monitor_queue_bytes": lambda v: _as_int("monitor_queue_bytes", v, 1),
    "consume_batch": lambda v: _as_int("consume_batch", v, 1, 1_000_000),
    "max_range": lambda v: _as_int("max_range", v, 1, 1_000_000),
    "log_format": lambda v: _as_choice("log_format", v, LOG_FORMATS),
    "event_loop": lambda v: _as_choice("event_loop", v, EVENT_LOOPS),
    "log_level": lambda v: _as_choice("log_level", v, LOG_LEVELS),
    "data_dir": lambda v: _as_path("data_dir", v),
    "metrics_port": lambda v: None if v is None else _as_int("metrics_port", v, 0, 65535),
    "metrics_host": lambda v: _as_text("metrics_host", v),
    "metrics_lag_timeout": lambda v: _as_seconds("metrics_lag_timeout", v, allow_zero=False),
}


# The TLS settings are named as in redis.conf (`tls-port`); `tls_port` is accepted too.
_TLS_KEYS = [key for key in _GATEWAY_KEYS if key.startswith("tls_")]


def _redis_name(key: str) -> str:
    return key.replace("_", "-") if key in _TLS_KEYS else key


def _gateway_settings(section: Mapping[str, object]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for spelled, value in section.items():
        key = spelled.replace("-", "_") if spelled.startswith("tls-") else spelled
        convert = _GATEWAY_KEYS.get(key)
        if convert is None:
            known = ", ".join(sorted(_redis_name(name) for name in _GATEWAY_KEYS))
            raise ConfigError(f"unknown setting gateway.{spelled} (known: {known})")
        if key in settings:
            raise ConfigError(f"gateway.{_redis_name(key)} is given twice (- and _ spellings)")
        settings[key] = convert(value)
    if "tls_port" in settings and "port" not in settings:
        settings["port"] = None  # TLS only, unless a plaintext port is asked for
    return settings


def decode_document(text: str, source: str) -> dict[str, Any]:
    try:
        document = json_decoder().decode(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source}: invalid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the configuration must be a JSON object")
    return document


def parse_document(text: str, source: str) -> dict[str, Any]:
    """Check a configuration document; return Config keyword arguments."""
    return check_document(decode_document(text, source))


def check_document(document: Mapping[str, Any]) -> dict[str, Any]:
    gateway = document.get("gateway")
    if gateway is not None and not isinstance(gateway, dict):
        raise ConfigError("section 'gateway' must be a JSON object")
    settings = _gateway_settings(gateway or {})
    if "engine" not in settings:
        try:
            settings["engine"] = engine_for(document)
        except EngineConfigError as error:
            raise ConfigError(str(error)) from None
    engine = settings["engine"]
    settings["engine_settings"] = _engine_settings(engine, document)
    if "subscriptions" in document:
        try:
            settings["subscriptions"] = parse_subscriptions(document["subscriptions"])
        except SubscriptionError as error:
            raise ConfigError(str(error)) from None
    return settings


def read_file(path: str) -> dict[str, Any]:
    """The decoded document of a configuration file."""
    if not path:
        raise ConfigError("No librdkafka configuration provided")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read configuration file {path}: {error}") from None
    return decode_document(text, path)


# --- command line ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


DEFAULT_CONFIG = "librdkafka.json"


def argument_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rafka", description="Kafka with a Redis API")
    parser.add_argument(
        "-c",
        "--config",
        help=f"path to the JSON configuration file (default: {DEFAULT_CONFIG} if it "
        "exists, else every default: the embedded Dafka engine)",
    )
    parser.add_argument("--host", help="listen address (default: 0.0.0.0)")
    parser.add_argument("-p", "--port", type=int, help="listen port (default: 6380)")
    parser.add_argument("--engine", choices=sorted(ENGINES), help="the log engine")
    parser.add_argument(
        "--tls-port",
        type=int,
        help="TLS listen port; the plaintext port is then off unless -p/--port is given",
    )
    parser.add_argument("--tls-cert-file", help="the server's certificate (PEM)")
    parser.add_argument("--tls-key-file", help="the server's private key (PEM, unencrypted)")
    parser.add_argument("--tls-ca-cert-file", help="CA certificates that sign client certificates")
    parser.add_argument(
        "--tls-auth-clients",
        choices=TLS_AUTH_CLIENTS,
        help="client certificates: required (yes, the default), checked if given, or not asked",
    )
    parser.add_argument("--data-dir", help="where the embedded engine keeps its data")
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port (default: off; 0: any free port)",
    )
    parser.add_argument(
        "--metrics-host", help="the metrics endpoint's address (default: the --host one)"
    )
    parser.add_argument("-v", "--version", action="version", version=f"rafka version {__version__}")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines")
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, help="the event loop (uvloop)")
    for entry in ENGINES.values():
        for flag in entry.flags():
            parser.add_argument(flag.flag, type=flag.type, help=flag.help, metavar="VALUE")
    return parser


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def from_args(argv: Sequence[str]) -> Config:
    """The Config for a command line; raises ConfigError (or SystemExit for -h/-v).

    Flags win over the file: they are written into the document before it is checked.
    """
    args = argument_parser().parse_args(list(argv))
    path = args.config
    if path is None and Path(DEFAULT_CONFIG).exists():
        path = DEFAULT_CONFIG
    document: dict[str, Any] = read_file(path) if path is not None else {}
    gateway = document.setdefault("gateway", {})
    if not isinstance(gateway, dict):
        raise ConfigError("section 'gateway' must be a JSON object")
    for key in ("port", "tls_port", "metrics_port"):
        value = getattr(args, key)
        if value is not None and not 0 <= value <= 65535:
            option = "--" + key.replace("_", "-")
            raise ConfigError(f"{option} must be between 0 and 65535, got {value}")
    flags = ("host", "port", "engine", "data_dir", "event_loop", "metrics_port", "metrics_host")
    for key in (*flags, *_TLS_KEYS):
        if getattr(args, key) is not None:
            gateway.pop(_redis_name(key), None)  # the flag wins over either spelling
            gateway[key] = getattr(args, key)
    if args.log_json:
        gateway["log_format"] = "json"
    for entry in ENGINES.values():
        for flag in entry.flags():
            value = getattr(args, _flag_name(flag.flag))
            if value is not None:
                section = document.setdefault(flag.section, {})
                if not isinstance(section, dict):
                    raise ConfigError(f"section '{flag.section}' must be a JSON object")
                section[flag.key] = value
    settings = check_document(document)
    settings["config_path"] = path
    return Config(**settings)


def from_dict(document: Mapping[str, Any], **overrides: Any) -> Config:
    """A Config from an in-memory document (tests, embedding); same checks as a file."""
    settings = parse_document(json.dumps(document), "<dict>")
    settings.update(overrides)
    return Config(**settings)
