"""The source's options, named as spark-sql-kafka's, and offsets resolved through the
reads by offset (LLEN, LRANGE) of rafka_client's Reader.

Offsets are `{topic: {partition (str): offset}}`, the JSON shape of spark-sql-kafka's
`startingOffsets`, and what the stream keeps in Spark's checkpoint: for each partition
the next offset to read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rafka_client import NotHeld, Reader, UnknownPartition

from rafka_spark.sink import BATCH_SIZE, DEFAULT_URL

EARLIEST, LATEST = -2, -1  # spark-sql-kafka's markers in per-partition JSON
MAX_PARTITIONS = 10_000  # the probe's bound: partitions of one topic
Offsets = dict[str, dict[str, int]]


class OptionError(ValueError):
    """An option the source or writer cannot use; the text names it."""


@dataclass(frozen=True)
class SourceOptions:
    url: str
    topics: tuple[str, ...]  # from `subscribe`, or the topics of `assign`
    assign: Mapping[str, tuple[int, ...]] | None
    starting: str | Offsets  # "earliest", "latest" or per-partition offsets
    ending: str | Offsets
    max_per_trigger: int | None
    range_size: int
    fail_on_data_loss: bool

    @staticmethod
    def parse(options: Mapping[str, str], *, stream: bool) -> SourceOptions:
        lower = {name.lower(): value for name, value in options.items()}
        subscribe = lower.get("subscribe")
        assign_text = lower.get("assign")
        if "subscribepattern" in lower:
            raise OptionError("subscribePattern is not supported: use subscribe or assign")
        if (subscribe is None) == (assign_text is None):
            raise OptionError("set exactly one of the options subscribe and assign")
        assign: dict[str, tuple[int, ...]] | None = None
        if subscribe is not None:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
            if not topics:
                raise OptionError(f"subscribe names no topic: {subscribe!r}")
        else:
            assign = _assign(assign_text or "")
            topics = tuple(assign)
        for topic in topics:
            if ":" in topic:
                raise OptionError(f"a topic has no ':', got {topic!r}")
        if stream and "endingoffsets" in lower:
            raise OptionError("endingOffsets is for batch queries only")
        starting = _offsets("startingOffsets", lower.get("startingoffsets"))
        ending = _offsets("endingOffsets", lower.get("endingoffsets"))
        for name, given in (("startingOffsets", starting), ("endingOffsets", ending)):
            others = sorted(set(given) - set(topics)) if isinstance(given, dict) else []
            if others:
                raise OptionError(
                    f"{name} names topics the query does not read: {', '.join(others)}"
                )
        if not stream and starting == "latest":
            raise OptionError("startingOffsets=latest is not allowed in a batch query")
        if not stream and ending == "earliest":
            raise OptionError("endingOffsets=earliest is not allowed in a batch query")
        max_text = lower.get("maxoffsetspertrigger")
        return SourceOptions(
            url=lower.get("url", DEFAULT_URL),
            topics=topics,
            assign=assign,
            starting=starting or ("latest" if stream else "earliest"),
            ending=ending or "latest",
            max_per_trigger=None
            if max_text is None
            else _positive("maxOffsetsPerTrigger", max_text),
            range_size=_positive("rangeSize", lower.get("rangesize", str(BATCH_SIZE))),
            fail_on_data_loss=_boolean("failOnDataLoss", lower.get("failondataloss", "true")),
        )


def _positive(name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise OptionError(f"{name} must be a positive integer, got {text!r}")
    return number


def _boolean(name: str, text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, got {text!r}")
    return text.lower() == "true"


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise OptionError(f"{name} is not valid JSON ({error}): {text!r}") from None


def _assign(text: str) -> dict[str, tuple[int, ...]]:
    document = _json("assign", text)
    if (
        not isinstance(document, dict)
        or not document
        or not all(
            isinstance(parts, list) and all(isinstance(p, int) and p >= 0 for p in parts)
            for parts in document.values()
        )
    ):
        raise OptionError(f'assign must be JSON like {{"topicA":[0,1]}}, got {text!r}')
    return {topic: tuple(parts) for topic, parts in document.items()}


def _offsets(name: str, text: str | None) -> str | Offsets | None:
    if text is None:
        return None
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    document = _json(name, text)
    shape = f'{name} must be earliest, latest or JSON like {{"topicA":{{"0":23,"1":-2}}}}'
    if not isinstance(document, dict):
        raise OptionError(f"{shape}, got {text!r}")
    offsets: Offsets = {}
    for topic, parts in document.items():
        if not isinstance(parts, dict):
            raise OptionError(f"{shape}, got {text!r}")
        for partition, offset in parts.items():
            if not str(partition).isdigit() or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(f"{shape}, got {text!r}")
        offsets[topic] = {str(int(p)): o for p, o in parts.items()}
    return offsets


def partitions_of(reader: Reader, topic: str) -> list[int]:
    """The partitions of `topic`: 0, 1, ... while LLEN knows them (the gateway answers
    `unknown topic or partition` past the last one). A topic that does not exist yet has
    none."""
    return list(_probe(reader, topic))


def _probe(reader: Reader, topic: str) -> dict[int, int]:
    """Partitions 0, 1, ... of `topic` with their next offsets, until one is unknown."""
    found: dict[int, int] = {}
    while True:
        try:
            head = reader.next_offset(topic, len(found))
        except UnknownPartition:
            return found
        if len(found) == MAX_PARTITIONS:
            # A plain Redis double answers LLEN 0 for any key: it never ends the probe.
            raise OptionError(
                f"topic {topic!r} has more than {MAX_PARTITIONS} partitions, or this is "
                "not a rafka gateway (plain Redis never says a partition is unknown): "
                "name the partitions with the assign option"
            )
        found[len(found)] = head


def first_held(reader: Reader, topic: str, partition: int) -> int:
    """The partition's first held offset (0 unless retention took records)."""
    try:
        records = reader.read(topic, partition, 0, 0)
    except NotHeld as gone:
        return gone.first_held
    except UnknownPartition:
        return 0
    return records[0].offset if records else 0


def next_offsets(reader: Reader, options: SourceOptions) -> dict[tuple[str, int], int]:
    """Every partition of the options' topics with its next offset (LLEN), now. An
    assigned partition that does not exist raises UnknownPartition."""
    heads: dict[tuple[str, int], int] = {}
    for topic in options.topics:
        if options.assign:
            for partition in options.assign[topic]:
                heads[(topic, partition)] = reader.next_offset(topic, partition)
        else:
            for partition, head in _probe(reader, topic).items():
                heads[(topic, partition)] = head
    return heads


def resolve(
    reader: Reader,
    wanted: str | Offsets,
    heads: Mapping[tuple[str, int], int],
    unnamed: int = EARLIEST,
    option: str = "startingOffsets",
) -> Offsets:
    """`wanted` (earliest, latest or per-partition JSON) as offsets of every partition in
    `heads`; partitions the JSON does not name get `unnamed` (EARLIEST or LATEST). JSON
    naming a partition the query does not read (a typo would go unnoticed: its offset
    ignored) is refused, as spark-sql-kafka refuses it."""
    if isinstance(wanted, dict):
        named = {(topic, int(p)) for topic, parts in wanted.items() for p in parts}
        if unknown := sorted(named - set(heads)):
            where = ", ".join(f"{topic}:{partition}" for topic, partition in unknown)
            raise OptionError(f"{option} names partitions the query does not read: {where}")
    offsets: Offsets = {}
    for (topic, partition), head in sorted(heads.items()):
        if wanted == "latest":
            offset = head
        elif wanted == "earliest":
            offset = EARLIEST
        else:
            assert isinstance(wanted, dict)
            offset = wanted.get(topic, {}).get(str(partition), unnamed)
        if offset == LATEST:
            offset = head
        elif offset == EARLIEST:
            offset = first_held(reader, topic, partition)
        offsets.setdefault(topic, {})[str(partition)] = offset
    return offsets


def flat(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


def nested(offsets: Mapping[tuple[str, int], int]) -> Offsets:
    result: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = offset
    return result


def limit_offsets(
    start: Mapping[tuple[str, int], int], heads: Mapping[tuple[str, int], int], budget: int
) -> dict[tuple[str, int], int]:
    """The end offsets to read up to with at most `budget` records in all, shared among
    the partitions in proportion to what each has waiting (as spark-sql-kafka does)."""
    lag = {tp: max(head - start.get(tp, 0), 0) for tp, head in heads.items()}
    total = sum(lag.values())
    if total <= budget:
        return {tp: max(head, start.get(tp, 0)) for tp, head in heads.items()}
    # Every partition with records waiting gets one first (when the budget allows), so a
    # small partition is not starved while a large one has a backlog.
    lagging = [tp for tp, waiting in lag.items() if waiting]
    floor = 1 if len(lagging) <= budget else 0
    share = {tp: min(waiting, floor) for tp, waiting in lag.items()}
    rest = budget - sum(share.values())
    more = {tp: lag[tp] - share[tp] for tp in lag}
    more_total = sum(more.values())
    for tp in share:
        share[tp] += more[tp] * rest // more_total if more_total else 0
    left = budget - sum(share.values())
    for tp in sorted(lag, key=lambda tp: -lag[tp]):
        if left <= 0:
            break
        if share[tp] < lag[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start.get(tp, 0) + share[tp] for tp in heads}
