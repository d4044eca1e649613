"""kill -9 of the gateway, on each engine: nothing DUMP confirmed is lost, and a killed
consumer's records come back at least once, duplicates bounded by what it held."""

from __future__ import annotations

from e2e.helpers import (
    WAIT,
    Deployment,
    Producing,
    consume,
    drain,
    kill_and_restart,
    produce,
)
from tests.support.rafka_process import RafkaProcess
from tests.support.waiting import wait_until

ROUNDS = 5


def test_kill_9_mid_produce_loses_no_dumped_record(
    rafka: RafkaProcess, deployment: Deployment
) -> None:
    topic = deployment.new_topic(2)
    server = rafka
    confirmed: list[bytes] = []
    try:
        for round_ in range(ROUNDS):
            producing = Producing(server.port, topic, f"r{round_}")
            producing.start()
            wait_until(lambda p=producing: p.batches >= 3, WAIT, "no batch confirmed")  # type: ignore[misc]
            server = kill_and_restart(server)  # mid-produce: a batch is on its way
            producing.join(WAIT)
            assert not producing.is_alive(), "the producer did not notice the kill"
            confirmed += producing.confirmed
        got = drain(server.port, "after-the-kills", topic, set(confirmed))
    finally:
        server.kill()
    missing = set(confirmed) - set(got)
    assert not missing, f"{len(missing)} DUMP-confirmed records lost: {sorted(missing)[:5]}"


def test_kill_9_mid_consume_delivers_every_record_at_least_once(
    rafka: RafkaProcess, deployment: Deployment
) -> None:
    topic = deployment.new_topic(2)
    values = {f"v{i}".encode() for i in range(120)}
    produce(rafka.port, topic, sorted(v.decode() for v in values))
    server = rafka
    seen: list[bytes] = []
    per_round = 20
    try:
        for _ in range(3):
            seen += [value for _, _, value in consume(server.port, "k", topic, per_round)]
            server = kill_and_restart(server)
        seen += drain(server.port, "k", topic, values - set(seen))
    finally:
        server.kill()
    assert values <= set(seen), f"never delivered: {sorted(values - set(seen))[:5]}"
    # Only what a killed gateway had handed out since its last commit comes back.
    duplicates = len(seen) - len(values)
    assert duplicates <= 3 * per_round, f"{duplicates} records delivered twice"
