"""What an HTTP push subscription is, and how one is read from JSON and checked.

The same checks serve the configuration file's `subscriptions` section, the run-time
`RAFKA.PUSH ADD` command and the run-time subscriptions kept in the data directory; every
error names the key (`subscriptions[0].retry.attempts must be ...`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from backends.settings import JsonNumber, json_int

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# Header names: HTTP tokens (RFC 9110 §5.6.2).
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Header values: no control character but tab (RFC 9110 §5.5; aiohttp refuses them).
HEADER_VALUE_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Set by the gateway on every POST; a subscription cannot override them.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "transfer-encoding"})


class SubscriptionError(ValueError):
    """A subscription that cannot be used; the text names the key."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempt n (from 1) that fails waits min(backoff_max, backoff_base * 2**(n-1)),
    shortened by up to `jitter` of itself at random, before attempt n+1."""

    attempts: int = 5
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.5


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    topic: str
    group: str
    urls: tuple[str, ...]
    headers: Mapping[str, str] = field(default_factory=dict)
    # Records held at once (being delivered or waiting for their partition's turn).
    concurrency: int = 1
    # Bound on one POST, seconds.
    timeout: float = 10.0
    retry: RetryPolicy = RetryPolicy()
    # Where a record goes after retry.attempts failed attempts; default `<topic>.dead-letter`.
    dead_letter_topic: str = ""

    def __post_init__(self) -> None:
        if not self.dead_letter_topic:
            object.__setattr__(self, "dead_letter_topic", f"{self.topic}.dead-letter")

    def to_json(self) -> dict[str, Any]:
        """The subscription as the JSON object `parse_subscription` reads back."""
        out = asdict(self)
        out["urls"] = list(self.urls)
        out["headers"] = dict(self.headers)
        return out


_KEYS = (
    "name",
    "topic",
    "group",
    "urls",
    "headers",
    "concurrency",
    "timeout",
    "retry",
    "dead_letter_topic",
)
_RETRY_KEYS = ("attempts", "backoff_base", "backoff_max", "jitter")


def _text(where: str, value: object) -> str:
    if not isinstance(value, str) or isinstance(value, JsonNumber) or not value:
        raise SubscriptionError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _int(where: str, value: object, minimum: int, maximum: int) -> int:
    return json_int(where, value, minimum, maximum, SubscriptionError)


def _number(where: str, value: object, minimum: float, maximum: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, JsonNumber | int | float):
        raise SubscriptionError(f"{where} must be a number, got {value!r}")
    number = float(value)
    low_ok = number > minimum if open_low else number >= minimum
    if not math.isfinite(number) or not low_ok or number > maximum:
        low = ">" if open_low else ">="
        bounds = f"{low} {minimum:g} and <= {maximum:g}"
        raise SubscriptionError(f"{where} must be {bounds}, got {value}")
    return number


def _url(where: str, value: object) -> str:
    url = _text(where, value)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is no port)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise SubscriptionError(f"{where} must be an http:// or https:// URL, got {url!r}")
    return url


def _urls(where: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list) or not value:
        raise SubscriptionError(f"{where} must be a non-empty list of URLs, got {value!r}")
    urls = tuple(_url(f"{where}[{i}]", item) for i, item in enumerate(value))
    if len(set(urls)) != len(urls):
        raise SubscriptionError(f"{where} lists a URL twice")
    return urls


def _headers(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SubscriptionError(f"{where} must be a JSON object of strings, got {value!r}")
    headers: dict[str, str] = {}
    for name, item in value.items():
        if not HEADER_NAME.fullmatch(name):
            raise SubscriptionError(f"{where}: {name!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise SubscriptionError(f"{where}.{name} is set by the gateway and cannot be changed")
        text = item if isinstance(item, str) and not isinstance(item, JsonNumber) else None
        if text is None or HEADER_VALUE_FORBIDDEN.search(text):
            raise SubscriptionError(
                f"{where}.{name} must be a one-line string without control characters, got {item!r}"
            )
        headers[name] = text
    return headers


def _unknown(where: str, section: Mapping[str, object], known: Sequence[str]) -> None:
    for key in section:
        if key not in known:
            raise SubscriptionError(f"unknown setting {where}.{key} (known: {', '.join(known)})")


def _retry(where: str, value: object) -> RetryPolicy:
    if not isinstance(value, dict):
        raise SubscriptionError(f"{where} must be a JSON object, got {value!r}")
    _unknown(where, value, _RETRY_KEYS)
    default = RetryPolicy()
    policy = RetryPolicy(
        attempts=_int(f"{where}.attempts", value.get("attempts", default.attempts), 1, 1_000_000),
        backoff_base=_number(
            f"{where}.backoff_base",
            value.get("backoff_base", default.backoff_base),
            0,
            3600,
            open_low=False,
        ),
        backoff_max=_number(
            f"{where}.backoff_max",
            value.get("backoff_max", default.backoff_max),
            0,
            86_400,
            open_low=False,
        ),
        jitter=_number(
            f"{where}.jitter", value.get("jitter", default.jitter), 0, 1, open_low=False
        ),
    )
    if policy.backoff_max < policy.backoff_base:
        raise SubscriptionError(
            f"{where}.backoff_max ({policy.backoff_max:g}) must be >= "
            f"{where}.backoff_base ({policy.backoff_base:g})"
        )
    return policy


def parse_subscription(value: object, where: str = "subscription") -> Subscription:
    """A Subscription from its decoded JSON object; SubscriptionError names the key."""
    if not isinstance(value, dict):
        raise SubscriptionError(f"{where} must be a JSON object, got {value!r}")
    _unknown(where, value, _KEYS)
    for key in ("name", "topic", "group", "urls"):
        if key not in value:
            raise SubscriptionError(f"{where}.{key} is required")
    name = _text(f"{where}.name", value["name"])
    if not NAME.fullmatch(name):
        raise SubscriptionError(
            f"{where}.name must be 1-100 letters, digits, '.', '_' or '-' (not first), got {name!r}"
        )
    topic = _text(f"{where}.topic", value["topic"])
    dead_letter = _text(f"{where}.dead_letter_topic", value.get("dead_letter_topic", "-"))
    if dead_letter == "-":
        dead_letter = ""
    if dead_letter == topic:
        raise SubscriptionError(f"{where}.dead_letter_topic must differ from the topic")
    default = Subscription(name="-", topic="-", group="-", urls=())
    return Subscription(
        name=name,
        topic=topic,
        group=_text(f"{where}.group", value["group"]),
        urls=_urls(f"{where}.urls", value["urls"]),
        headers=_headers(f"{where}.headers", value.get("headers", {})),
        concurrency=_int(
            f"{where}.concurrency", value.get("concurrency", default.concurrency), 1, 10_000
        ),
        timeout=_number(
            f"{where}.timeout", value.get("timeout", default.timeout), 0, 3600, open_low=True
        ),
        retry=_retry(f"{where}.retry", value.get("retry", {})),
        dead_letter_topic=dead_letter,
    )


def parse_subscriptions(value: object, where: str = "subscriptions") -> tuple[Subscription, ...]:
    """The configuration file's `subscriptions` section: a JSON array of subscriptions
    with distinct names."""
    if not isinstance(value, list):
        raise SubscriptionError(f"section '{where}' must be a JSON array, got {value!r}")
    subscriptions = tuple(
        parse_subscription(item, f"{where}[{index}]") for index, item in enumerate(value)
    )
    seen: set[str] = set()
    for index, subscription in enumerate(subscriptions):
        if subscription.name in seen:
            raise SubscriptionError(
                f"{where}[{index}].name: a subscription named {subscription.name!r} exists already"
            )
        seen.add(subscription.name)
    return subscriptions
