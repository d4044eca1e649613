"""`make run`'s program: a Tansu broker and a gateway that Ctrl-C stops together."""

from __future__ import annotations

import signal
import socket
import sys

import pytest
import redis

from backends.ports import free_port
from backends.process import spawn
from tests.support.rafka_process import REPO


@pytest.mark.kafka
def test_dev_run_serves_on_tansu_and_ctrl_c_stops_both() -> None:
    port = free_port()
    # Through backends.process: it (and so its Tansu) dies with the test run, even a
    # SIGKILLed one.
    process = spawn(
        [sys.executable, "-m", "tests.support.devrun_kafka", "--port", str(port)],
        name="devrun_kafka",
        cwd=REPO,
    )
    try:
        # Printed once the gateway listens.
        found = process.wait_line(r"Tansu broker at 127\.0\.0\.1:(\d+)", 60, stream="stdout")
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        assert client.rpushx("topics:devrun", "hello") == 1  # Tansu auto-creates it here
        assert client.execute_command("DUMP", "5000") == 0
        assert int(client.hgetall("stats")[b"producer.delivered.messages"]) == 1
        client.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        process.stop()
    broker = int(found.group(1))
    try:
        socket.create_connection(("127.0.0.1", broker), timeout=2).close()
        raise AssertionError(f"Tansu still listens on {broker} after Ctrl-C")
    except ConnectionRefusedError:
        pass
