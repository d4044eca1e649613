"""The soak run (e2e/soak.py, `make soak`) in a short version, on each engine: a real
`rafka` process with 1,000 idle and 100 active connections, random disconnects and one
restart; nothing DUMP confirmed is lost, every connection is served, memory stays bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.soak import Options, run_soak
from tests.support.fixtures import NO_BROKER

# Known broker bug, found by the soak: on Tansu, a consumer group whose members leave while
# others join (a consumer's connection dropped and reopened; a graceful gateway restart,
# where every consumer leaves its group) can stop being assigned its partitions: seen for
# 90 s and more, in 1 to 3 of 4 groups, so their records are not delivered. Reproduced by
# `python -m e2e.soak --engine kafka --active 20 --idle 10 --consumers 8 --rate 500
# --disconnect-rate 0 --consumer-disconnect-rate 0 --duration 10` (SIGTERM restart) on
# every run. So on Kafka consumers do not drop their connections here, and the graceful
# restart is expected to fail; kill -9 (members expire instead) recovers every group.
# Not the gateway's: two plain confluent-kafka consumers of one group on Tansu show it, the
# second subscribing just as the first closes is never assigned (15 s), while one that
# subscribes 1.5 s earlier or later is.
TANSU_GROUPS_STALL = pytest.mark.xfail(
    strict=False, reason="Kafka on Tansu: groups stall after members leave (see above)"
)
CASES = [
    pytest.param("dafka", "term"),
    pytest.param("dafka", "kill"),
    pytest.param("kafka", "term", marks=[pytest.mark.kafka, TANSU_GROUPS_STALL]),
    pytest.param("kafka", "kill", marks=pytest.mark.kafka),
]


@pytest.mark.parametrize(("engine", "restart"), CASES)
def test_short_soak_loses_nothing_and_holds_every_connection(
    engine: str, restart: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "kafka" and request.config.getoption("no_broker"):
        pytest.skip(NO_BROKER)
    options = Options(
        engine=engine,
        kill=restart == "kill",
        max_rss_mib=512,
        active=100,
        idle=1000,
        consumers=8,
        duration=10.0,
        drain=30.0,
        consumer_disconnect_rate=0.0 if engine == "kafka" else Options.consumer_disconnect_rate,
    )
    summary = run_soak(options, tmp_path)
    assert summary.failures(options) == [], summary
    assert summary.lost == 0 and summary.confirmed > 1000, summary
    assert summary.idle_held == 1000, "an idle connection was not served after the restart"
    assert summary.reconnects >= 1000 + 100, "every connection had to reconnect once"
    assert summary.random_disconnects > 0, "the run dropped no connection of its own"
    assert summary.restart_seconds < 30, summary.restart_seconds
    # 1,000 idle connections: each a session of a few KiB, not a buffer of its own.
    assert summary.idle_kib_per_connection < 64, summary.idle_kib_per_connection
