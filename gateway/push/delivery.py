"""One record to every URL of a subscription: the JSON body, the POSTs, the retries.

A record is delivered when every URL answered 2xx; a URL that answered 2xx is not posted
again for that record. After `retry.attempts` rounds with a failure the record is given
up (the caller dead-letters it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from backends.base import Record, Stats
from gateway.push.spec import RetryPolicy, Subscription

# The longest response body quoted in an error.
_BODY_PREVIEW = 200


def _encoded(data: bytes | None) -> tuple[str | None, str | None]:
    """(text, encoding): UTF-8 text as is, anything else as base64; None stays None."""
    if data is None:
        return None, None
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def payload(record: Record) -> dict[str, Any]:
    """The JSON object POSTed for one record."""
    key, key_encoding = _encoded(record.key)
    value, value_encoding = _encoded(record.value)
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "key": key,
        "key_encoding": key_encoding,
        "value": value,
        "value_encoding": value_encoding,
        "timestamp": record.timestamp_ms,
    }


def backoff(policy: RetryPolicy, attempt: int, rand: random.Random) -> float:
    """Seconds to wait after failed attempt `attempt` (from 1)."""
    delay = min(policy.backoff_max, policy.backoff_base * 2 ** min(attempt - 1, 62))
    return delay * (1 - policy.jitter * rand.random())


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one record: delivered, or given up after `attempts` with the last
    error of each URL that never answered 2xx."""

    delivered: bool
    attempts: int
    errors: tuple[str, ...] = ()


class Deliverer:
    """POSTs records of one subscription; counts failed attempts in `stats`."""

    def __init__(
        self,
        subscription: Subscription,
        http: aiohttp.ClientSession,
        stats: Stats,
        failed_counter: str,
    ) -> None:
        self._subscription = subscription
        self._http = http
        self._stats = stats
        self._failed_counter = failed_counter
        self._timeout = aiohttp.ClientTimeout(total=subscription.timeout)
        self._headers = {**subscription.headers, "Content-Type": "application/json"}
        self._random = random.Random()

    async def deliver(self, record: Record) -> Outcome:
        body = json.dumps(payload(record), separators=(",", ":")).encode()
        policy = self._subscription.retry
        pending = list(self._subscription.urls)
        errors: list[str] = []
        for attempt in range(1, policy.attempts + 1):
            async with asyncio.TaskGroup() as group:
                posts = [group.create_task(self._post(url, body)) for url in pending]
            errors = [error for post in posts if (error := post.result()) is not None]
            if not errors:
                return Outcome(delivered=True, attempts=attempt)
            self._stats.incr(self._failed_counter)
            pending = [url for url, post in zip(pending, posts, strict=True) if post.result()]
            if attempt < policy.attempts:
                await asyncio.sleep(backoff(policy, attempt, self._random))
        return Outcome(delivered=False, attempts=policy.attempts, errors=tuple(errors))

    async def _post(self, url: str, body: bytes) -> str | None:
        """None when `url` answered 2xx, else what went wrong."""
        try:
            # A redirect is not a delivery: aiohttp would follow a 301/302/303 with a
            # GET without the body, and that GET's 200 would ack a record never posted.
            async with self._http.post(
                url,
                data=body,
                headers=self._headers,
                timeout=self._timeout,
                allow_redirects=False,
            ) as response:
                if 200 <= response.status < 300:
                    return None
                # Only the start of the body: an error page may be large.
                start = await response.content.read(_BODY_PREVIEW)
                text = start.decode("utf-8", "replace")
                return f"{url}: HTTP {response.status} {text}".rstrip()
        except TimeoutError:
            return f"{url}: no answer within {self._subscription.timeout:g}s"
        except (aiohttp.ClientError, OSError, ValueError) as error:
            return f"{url}: {type(error).__name__}: {error}"
