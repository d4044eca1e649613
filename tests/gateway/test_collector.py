"""The `rafka` command keeps Python's garbage collector out of serving's way (gateway/cli.py:
start-up frozen, young collections every 10,000 container objects): under a steady
produce load it runs no full collection and few young ones, as its own Prometheus metrics
(`python_gc_collections_total`) show. Every full collection pauses every record on its
way (6.6 ms measured at 1,000 topics)."""

from __future__ import annotations

import json
from pathlib import Path

from backends.ports import free_port
from tests.support.gateway import Raw
from tests.support.metrics import Scrape, scrape
from tests.support.rafka_process import RafkaProcess
from tests.support.resp import command

RECORDS = 100_000
TOPICS = 100
PIPELINE = 1000


def collections(metrics: Scrape) -> list[float]:
    """Collections so far, young (0) to full (2)."""
    counts = [metrics.value("python_gc_collections_total", generation=str(g)) for g in range(3)]
    assert None not in counts, "rafka's metrics report no collections"
    return [float(count or 0) for count in counts]


def test_a_steady_produce_load_runs_no_full_collection_and_few_young_ones(
    tmp_path: Path,
) -> None:
    metrics_port = free_port()
    config = tmp_path / "rafka.json"
    gateway_section = {"data_dir": str(tmp_path / "data"), "metrics_port": metrics_port}
    config.write_text(json.dumps({"gateway": gateway_section}))
    gateway = RafkaProcess(config)
    gateway.start()
    try:
        keys = [b"topics:collected-%03d" % n for n in range(TOPICS)]
        with Raw(gateway.port, timeout=60) as raw:
            # The topics made first: what creating them makes is not the steady load.
            raw.send(b"".join(command(b"RPUSHX", key, b"first") for key in keys))
            for _ in keys:
                assert raw.read_reply() == 1
            before = collections(scrape(metrics_port))
            value = b"v" * 100
            for first in range(0, RECORDS, PIPELINE):
                raw.send(
                    b"".join(
                        command(b"RPUSHX", keys[n % TOPICS], value)
                        for n in range(first, first + PIPELINE)
                    )
                )
                for _ in range(PIPELINE):
                    assert raw.read_reply() == 1
            raw.send(command(b"DUMP", b"60000"))
            assert raw.read_reply() == 0, "records not durable after DUMP"
            young, middle, full = (
                after - then
                for after, then in zip(collections(scrape(metrics_port)), before, strict=True)
            )
        # With Python's default threshold (700): ~100 young and ~10 middle collections.
        assert (young, middle, full) == (young, 0, 0), (young, middle, full)
        assert young <= 20, f"{young:.0f} young collections for {RECORDS:,} records"
    finally:
        gateway.terminate()
