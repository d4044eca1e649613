"""The `rafka` command on each engine (embedded Dafka; Kafka on a real Tansu broker),
driven by redis-cli and by Ruby's redis-rb."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from backends.ports import free_port
from e2e.helpers import Deployment
from tests.support.proxy import TcpProxy
from tests.support.rafka_process import REPO, RafkaProcess, start_rafka

RUBY_CLIENT = REPO / "clients" / "ruby-example" / "rafka_example.rb"


@pytest.fixture(scope="module")
def rafka(
    deployment: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RafkaProcess]:
    config = deployment.write_config(tmp_path_factory.mktemp("rafka") / "rafka.json")
    server = RafkaProcess(config)
    server.start()
    yield server
    code = server.terminate()
    assert code == 0, f"rafka exited with {code} after SIGTERM: {server.stderr()}"
    assert "Traceback" not in server.stderr(), server.stderr()


def redis_cli(port: int, *args: str, stdin: str | None = None, resp3: bool = False) -> str:
    command = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)]
    if resp3:
        command.append("-3")
    result = subprocess.run(
        [*command, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"redis-cli {args} failed: {result.stderr}"
    return result.stdout


def ruby(*args: str) -> list[str]:
    result = subprocess.run(
        ["ruby", str(RUBY_CLIENT), *args], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"ruby {args} failed ({result.returncode}): {result.stderr}"
    return result.stdout.splitlines()


def test_redis_cli_produces_consumes_and_acks(rafka: RafkaProcess, deployment: Deployment) -> None:
    topic = deployment.new_topic(1)
    assert redis_cli(rafka.port, "RPUSHX", f"topics:{topic}", "hello from redis-cli") == "1\n"
    assert redis_cli(rafka.port, "DUMP", "5000") == "0\n"

    # One connection for the whole session: redis-cli runs stdin lines in order on it.
    session = f"CLIENT SETNAME cli-group:reader\nBLPOP topics:{topic} 20\nRPUSH acks {topic}:0:0\n"
    lines = redis_cli(rafka.port, stdin=session).splitlines()
    assert lines == [
        "OK",
        "topic",
        topic,
        "partition",
        "0",
        "offset",
        "0",
        "value",
        "hello from redis-cli",
        "1",
    ]


def test_redis_cli_errors_keep_the_connection(rafka: RafkaProcess) -> None:
    output = redis_cli(rafka.port, stdin="GET x\nRPUSHX invalid-arg msg\nPING\n")
    # Without a terminal redis-cli prints an empty line after each error reply.
    lines = [line for line in output.splitlines() if line]
    assert lines == [
        "Command not supported: GET",
        "PROD First argument must be in the form of 'topics:<topic>' or 'topics:<topic>:<key>'",
        "PONG",
    ]


def test_redis_cli_resp3_reads_stats_as_a_map(rafka: RafkaProcess) -> None:
    output = redis_cli(rafka.port, "HGETALL", "stats", resp3=True)
    # redis-cli shows a RESP3 map as `key value` lines (a RESP2 array is one item per line).
    fields = dict(line.split(" ", 1) for line in output.splitlines())
    for name in (
        "producer.unflushed.messages",
        "producer.delivery.errors",
        "producer.unknown.events",
    ):
        assert fields[name].isdigit(), f"{name} is not a decimal count: {fields}"


def test_redis_cli_pipe_mass_insertion_finishes(
    rafka: RafkaProcess, deployment: Deployment
) -> None:
    """`redis-cli --pipe` ends its input with `ECHO <20 random bytes>` and waits for that
    bulk to come back before it reports and exits; --pipe-timeout bounds the wait. ECHO
    was refused (Rafka's 'Command not supported'): every --pipe run waited out the
    timeout and exited 1 (found in review)."""
    topic = deployment.new_topic(1)
    lines = "".join(f"RPUSHX topics:{topic} value-{i}\r\n" for i in range(3))
    result = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(rafka.port), "--pipe", "--pipe-timeout", "5"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "errors: 0, replies: 3" in output, (
        f"redis-cli --pipe did not finish cleanly (exit {result.returncode}): {output!r}"
    )


def test_redis_rb_produces_and_consumes_every_record(
    rafka: RafkaProcess, deployment: Deployment
) -> None:
    topic = deployment.new_topic(4)
    assert ruby("produce", str(rafka.port), topic, "40") == ['{"flushed":0}']

    records = [json.loads(line) for line in ruby("consume", str(rafka.port), topic, "rb", "40")]
    assert sorted(int(r["value"]) for r in records) == list(range(40))
    by_partition: dict[int, list[int]] = {}
    for record in records:
        by_partition.setdefault(record["partition"], []).append(record["offset"])
    for partition, offsets in by_partition.items():
        assert offsets == sorted(offsets), f"partition {partition} out of order: {offsets}"

    # The group committed what the Ruby consumer acked: a new member gets nothing old.
    produced_later = ruby("produce", str(rafka.port), topic, "1")
    assert produced_later == ['{"flushed":0}']
    again = [json.loads(line) for line in ruby("consume", str(rafka.port), topic, "rb", "1")]
    assert [r["value"] for r in again] == ["0"], f"expected only the new record, got {again}"


def test_redis_rb_keyed_records_share_one_partition(
    rafka: RafkaProcess, deployment: Deployment
) -> None:
    topic = deployment.new_topic(4)
    assert ruby("produce", str(rafka.port), topic, "30", "foo") == ['{"flushed":0}']
    records = [json.loads(line) for line in ruby("consume", str(rafka.port), topic, "kg", "30")]
    assert len(records) == 30
    assert len({r["partition"] for r in records}) == 1


def test_redis_rb_reads_stats(rafka: RafkaProcess) -> None:
    stats = json.loads(ruby("stats", str(rafka.port))[0])
    assert stats, "HGETALL stats is empty"
    assert all(value.isdigit() for value in stats.values()), stats


def test_sigterm_answers_blocked_consumer_and_exits_zero(
    deployment: Deployment, tmp_path: Path
) -> None:
    topic = deployment.new_topic(1)
    server = RafkaProcess(deployment.write_config(tmp_path / "rafka.json"))
    server.start()
    producer = redis.Redis(port=server.port, protocol=2)
    # redis-py 8 gives up reading after 5 s by default: a blocking BLPOP needs no limit.
    consumer = redis.Redis(
        port=server.port,
        protocol=2,
        # A group of its own: Tansu 0.6.0 wedges a group whose members leave together
        # (see tests/kafka/test_gateway_kafka.py E8), and other tests shut down consumers too.
        client_name=f"shutdown-{uuid.uuid4().hex[:8]}:down",
        socket_timeout=None,
    )
    try:
        assert producer.rpushx(f"topics:{topic}", "before") == 1
        assert producer.execute_command("DUMP", "5000") == 0
        assert consumer.blpop([f"topics:{topic}"], timeout=20) is not None

        outcome: list[BaseException | object] = []

        def block_forever() -> None:
            try:
                outcome.append(consumer.blpop([f"topics:{topic}"], timeout=0))
            except redis.ResponseError as error:
                outcome.append(error)

        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as monitor:
            monitor.sendall(b"MONITOR\r\n")
            lines = monitor.makefile("rb")
            assert lines.readline() == b"+OK\r\n"
            waiter = threading.Thread(target=block_forever)
            waiter.start()
            # The event to wait for: the server has read the blocking BLPOP.
            marker = f'"BLPOP" "topics:{topic}" "0"'.encode()
            line = lines.readline()
            while marker not in line:
                assert line, "MONITOR closed before the blocking BLPOP was seen"
                line = lines.readline()
        code = server.terminate(timeout=30)
        waiter.join(timeout=10)
        assert code == 0, server.stderr()
        assert len(outcome) == 1 and str(outcome[0]) == "CONS Server shutdown", outcome
    finally:
        producer.close()
        consumer.close()
        server.kill()


def test_the_ruby_example_never_reports_records_lost_with_a_connection_as_flushed(
    tmp_path: Path,
) -> None:
    """The Ruby example's producer reconnected (redis-rb's `reconnect_attempts`) and re-sent
    a DUMP cut off while it waited: the new connection had produced nothing, so it
    answered 0 and the example printed {"flushed":0} for records never delivered. A
    connection lost is an error now. (A Kafka engine whose broker does not answer keeps
    the DUMP waiting while the connection is cut.)"""
    document = {"general": {"bootstrap.servers": f"127.0.0.1:{free_port()}"}}
    child, port = start_rafka(tmp_path, document, "--engine", "kafka")
    proxy = TcpProxy(port).start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as monitor:
            monitor.sendall(b"MONITOR\r\n")
            lines = monitor.makefile("rb")
            assert lines.readline() == b"+OK\r\n"
            example = subprocess.Popen(
                ["ruby", str(RUBY_CLIENT), "produce", str(proxy.port), "rbflush", "3"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                while b'"dump"' not in (line := lines.readline()).lower():
                    assert line, "MONITOR closed before the DUMP came"
                proxy.cut()  # a network blip while DUMP waits for the broker
                out, err = example.communicate(timeout=60)
            finally:
                example.kill()
        stats = redis.Redis(port=port, protocol=2, socket_timeout=30).hgetall("stats")
    finally:
        proxy.close()
        child.stop(30)
    assert int(stats[b"producer.delivered.messages"]) == 0
    assert out == "", f"the example printed {out.strip()} for records never delivered"
    assert example.returncode == 1
    assert "rafka_example: connection lost" in err, err
