"""`rafka-subscriptions`: add, list and remove HTTP push subscriptions of a running
gateway, over its RESP port (the `RAFKA.PUSH` command; docs/push.md).

    rafka-subscriptions [-H HOST] [-p PORT] [-a PASSWORD] add NAME --topic T --group G \\
        --url URL [--url URL ...] [--header 'Name: value' ...] [--concurrency N] \\
        [--timeout S] [--attempts N] [--backoff-base S] [--backoff-max S] [--jitter F] \\
        [--dead-letter-topic T]
    rafka-subscriptions list [--json]
    rafka-subscriptions remove NAME

Exit status 0 on success, 1 with the gateway's error (or why it cannot be reached) on
standard error, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

import redis

COMMAND = "RAFKA.PUSH"
# What socket.settimeout takes (time_t seconds): past it, or <= 0, nan, inf, no wait.
MAX_SECONDS = 365 * 24 * 3600.0


def _seconds(text: str) -> float:
    """A timeout option: a finite number of seconds > 0 (argparse names the option)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds > 0 and <= {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rafka-subscriptions",
        description="Manage the HTTP push subscriptions of a running rafka gateway",
    )
    parser.add_argument("-H", "--host", default="127.0.0.1", help="gateway host (127.0.0.1)")
    parser.add_argument("-p", "--port", type=int, default=6380, help="gateway port (6380)")
    parser.add_argument("-a", "--password", help="the gateway's password, if it has one")
    parser.add_argument("--connect-timeout", type=_seconds, default=10.0, help="seconds (10)")
    parser.add_argument(
        "--reply-timeout", type=_seconds, default=60.0, help="seconds to wait for the answer (60)"
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    add = verbs.add_parser("add", help="add a subscription (kept across restarts)")
    add.add_argument("name")
    add.add_argument("--topic", required=True)
    add.add_argument("--group", required=True, help="the consumer group it consumes as")
    add.add_argument("--url", action="append", required=True, help="POST target (repeatable)")
    add.add_argument("--header", action="append", default=[], help="'Name: value' (repeatable)")
    add.add_argument("--concurrency", type=int, help="records held at once (1)")
    add.add_argument("--timeout", type=float, help="seconds one POST may take (10)")
    add.add_argument("--attempts", type=int, help="attempts before dead-lettering (5)")
    add.add_argument("--backoff-base", type=float, help="first retry delay, seconds (0.5)")
    add.add_argument("--backoff-max", type=float, help="longest retry delay, seconds (30)")
    add.add_argument("--jitter", type=float, help="fraction of a delay cut at random (0.5)")
    add.add_argument("--dead-letter-topic", help="default: <topic>.dead-letter")

    listing = verbs.add_parser("list", help="list the subscriptions")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")

    remove = verbs.add_parser("remove", help="remove a run-time subscription")
    remove.add_argument("name")
    return parser


def _subscription(args: argparse.Namespace) -> dict[str, Any]:
    """The subscription JSON, with only what was given (the gateway checks it)."""
    headers: dict[str, str] = {}
    for header in args.header:
        name, colon, value = header.partition(":")
        if not colon:
            raise ValueError(f"--header must be 'Name: value', got {header!r}")
        headers[name.strip()] = value.strip()
    document: dict[str, Any] = {
        "name": args.name,
        "topic": args.topic,
        "group": args.group,
        "urls": args.url,
    }
    if headers:
        document["headers"] = headers
    for key in ("concurrency", "timeout", "dead_letter_topic"):
        if getattr(args, key) is not None:
            document[key] = getattr(args, key)
    retry = {
        key: getattr(args, key)
        for key in ("attempts", "backoff_base", "backoff_max", "jitter")
        if getattr(args, key) is not None
    }
    if retry:
        document["retry"] = retry
    return document


def _print_list(replies: Sequence[bytes], as_json: bool) -> None:
    items = [json.loads(reply) for reply in replies]
    if as_json:
        for item in items:
            print(json.dumps(item))
        return
    if not items:
        print("no subscriptions")
        return
    rows = [("NAME", "SOURCE", "TOPIC", "GROUP", "CONCURRENCY", "URLS")]
    rows += [
        (
            item["name"],
            item["source"],
            item["topic"],
            item["group"],
            str(item["concurrency"]),
            " ".join(item["urls"]),
        )
        for item in items
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        print("  ".join([*cells, row[-1]]))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    where = f"{args.host}:{args.port}"
    try:
        request = (
            ["ADD", json.dumps(_subscription(args))]
            if args.verb == "add"
            else ["REMOVE", args.name]
            if args.verb == "remove"
            else ["LIST"]
        )
    except ValueError as error:
        print(f"rafka-subscriptions: {error}", file=sys.stderr)
        return 2
    client = redis.Redis(
        host=args.host,
        port=args.port,
        password=args.password,
        socket_connect_timeout=args.connect_timeout,
        socket_timeout=args.reply_timeout,
    )
    try:
        reply = client.execute_command(COMMAND, *request)
    except redis.AuthenticationError as error:  # a ConnectionError to redis-py
        print(f"rafka-subscriptions: the gateway at {where} refused: {error}", file=sys.stderr)
        return 1
    except redis.TimeoutError:
        wait = f"{args.reply_timeout:g}"
        print(
            f"rafka-subscriptions: no answer from the gateway at {where} in {wait} s",
            file=sys.stderr,
        )
        return 1
    except redis.ConnectionError as error:
        print(f"rafka-subscriptions: cannot reach the gateway at {where}: {error}", file=sys.stderr)
        return 1
    except redis.ResponseError as error:
        print(f"rafka-subscriptions: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if args.verb == "list":
        _print_list(reply, args.json)
    elif args.verb == "add":
        print(f"added subscription {args.name}")
    else:
        print(f"removed subscription {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
