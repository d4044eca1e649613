"""The metrics endpoint of a real `rafka` process on the embedded Dafka engine (the
default): the data directory's size, consumer lag read from the gateway's own network,
the endpoint's end with SIGTERM, and a metrics port that cannot be had."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import redis

from backends.ports import free_port
from e2e.helpers import WAIT, consume, dafka_document
from tests.support.metrics import Scrape, scrape, scrape_until
from tests.support.rafka_process import RAFKA, REPO, RafkaProcess

RECORDS = 16
VALUE_SIZE = 128 * 1024  # random bytes: nothing compresses them


def disk_usage(metrics: Scrape, data_dir: Path) -> float:
    usage = metrics.value("rafka_store_disk_usage_bytes", path=str(data_dir))
    assert usage is not None, metrics.labelled("rafka_store_disk_usage_bytes")
    return usage


def test_embedded_gateway_reports_disk_usage_and_lag(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    config = tmp_path / "rafka.json"
    config.write_text(json.dumps(dafka_document(data_dir)))
    metrics_port = free_port()
    server = RafkaProcess(config, None, "--metrics-port", str(metrics_port))
    server.start()
    try:
        before = disk_usage(scrape(metrics_port), data_dir)
        assert before > 0, "the stores' files take no space"
        topic = "p1-metrics"
        client = redis.Redis(port=server.port, socket_timeout=WAIT)
        values = [os.urandom(VALUE_SIZE) for _ in range(RECORDS)]
        assert client.execute_command("RPUSHX", f"topics:{topic}", *values) == RECORDS
        assert client.execute_command("DUMP", "10000") == 0
        client.close()
        written = RECORDS * VALUE_SIZE
        scrape_until(
            metrics_port,
            lambda metrics: disk_usage(metrics, data_dir) >= before + written,
            30,
            f"the data directory's usage grows by the {written} bytes stored",
        )
        got = consume(server.port, "billing", topic, 3)  # acked, then QUIT: committed
        assert [offset for _, offset, _ in got] == [0, 1, 2]
        labels = {"group": "billing", "topic": topic, "partition": "0"}
        metrics = scrape_until(
            metrics_port,
            lambda metrics: metrics.value("rafka_consumer_lag", **labels) == RECORDS - 3,
            60,
            f"lag {RECORDS - 3} of billing on {topic}:0",
        )
        assert metrics.value("rafka_consumer_committed_offset", **labels) == 3
        assert metrics.value("rafka_partition_next_offset", topic=topic, partition="0") == RECORDS
        assert server.terminate() == 0, server.stderr()
    finally:
        server.kill()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", metrics_port)) != 0, "metrics port still open"


def test_taken_metrics_port_ends_rafka_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway_port = free_port()
        argv = [str(RAFKA), "--host", "127.0.0.1", "-p", str(gateway_port)]
        argv += ["--data-dir", str(tmp_path / "data"), "--metrics-port", str(port)]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"rafka: cannot serve metrics on 127.0.0.1:{port}: Address already in use" in (
        done.stderr
    )
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", gateway_port)) != 0, "the gateway listened"


def test_invalid_metrics_port_flag(tmp_path: Path) -> None:
    argv = [str(RAFKA), "--data-dir", str(tmp_path / "data"), "--metrics-port", "70000"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == "rafka: --metrics-port must be between 0 and 65535, got 70000"
    assert not (tmp_path / "data").exists(), "nothing started"
