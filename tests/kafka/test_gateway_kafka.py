"""Rafka's end-to-end flows (spec §11.2, E1-E17) with redis-py against a gateway with a
real KafkaEngine on the Tansu fixture. The helpers below do what rafka-rb does: SETNAME
on connect, BLPOP for one record, `RPUSH acks` per topic-partition with the max offset,
QUIT on close. Group joins take about 1 s on Tansu, so scenarios reuse consumers where
the original allows it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from gateway.runner import ServerThread
from tests.support.fixtures import GatewayConfig
from tests.support.gateway import client, group_state, running
from tests.support.tansu import TansuBroker
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def server(gateway_config: GatewayConfig) -> Iterator[ServerThread]:
    with running(gateway_config("kafka")) as gateway:
        yield gateway


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    value: str


class Producer:
    def __init__(self, server: ServerThread, protocol: int = 3) -> None:
        self.redis = client(server, protocol=protocol)

    def produce(self, topic: str, value: str | int, key: str | None = None) -> int:
        target = f"topics:{topic}" + (f":{key}" if key is not None else "")
        return int(self.redis.rpushx(target, str(value)))

    def flush(self, timeout_ms: int = 5000) -> int:
        return int(self.redis.execute_command("DUMP", str(timeout_ms)))

    def close(self) -> None:
        self.redis.close()


class Consumer:
    """rafka-rb's Rafka::Consumer, over redis-py."""

    def __init__(
        self,
        server: ServerThread,
        group: str,
        topic: str,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        protocol: int = 3,
    ) -> None:
        self.name = name or secrets.token_hex(16)
        self.redis = client(server, client_name=f"{group}:{self.name}", protocol=protocol)
        self.key = f"topics:{topic}" + (f":{json.dumps(config)}" if config else "")

    def consume(self, timeout: float = 1) -> Message | None:
        reply: Any = self.redis.blpop([self.key], timeout)
        if reply is None:
            return None
        assert len(reply) == 8
        assert list(reply[0::2]) == [b"topic", b"partition", b"offset", b"value"]
        return Message(reply[1].decode(), int(reply[3]), int(reply[5]), reply[7].decode())

    def consume_with_retry(self, timeout: float = 1, retries: int = 10) -> Message:
        for _ in range(retries):
            message = self.consume(timeout)
            if message is not None:
                return message
        raise AssertionError(f"no message on {self.key} after {retries} x {timeout}s")

    def commit(self, *messages: Message) -> None:
        highest: dict[tuple[str, int], int] = {}
        for message in messages:
            tp = (message.topic, message.partition)
            highest[tp] = max(highest.get(tp, -1), message.offset)
        for (topic, partition), offset in highest.items():
            assert self.redis.rpush("acks", f"{topic}:{partition}:{offset}") == 1

    def consume_committed(self, count: int, timeout: float = 1) -> list[Message]:
        """Consume `count` messages, acking each (rafka-rb's auto-commit)."""
        out = []
        for _ in range(count):
            message = self.consume_with_retry(timeout)
            self.commit(message)
            out.append(message)
        return out

    def close(self) -> None:
        self.redis.execute_command("QUIT")
        self.redis.close()


def produce_all(
    server: ServerThread, topic: str, values: list[Any], key: str | None = None
) -> None:
    producer = Producer(server)
    for value in values:
        assert producer.produce(topic, value, key) == 1
    assert producer.flush() == 0
    producer.close()


def close_one_at_a_time(
    server: ServerThread, tansu: TansuBroker, group: str, consumers: list[Consumer]
) -> list[Message]:
    """Close a group's consumers one by one; before the next one leaves, the others BLPOP
    (the gateway polls librdkafka only inside BLPOP) until the group has re-formed.
    Returns, acked, what they received meanwhile.

    A workaround for a Tansu 0.6 group-coordinator bug that a Kafka broker does not have.
    Tansu keeps a group that is rebalancing ("Forming") with its leader's member id even
    after that leader's LeaveGroup removed it: every later JoinGroup names the departed
    member as leader, no one sends the assignment, and SyncGroup answers
    REBALANCE_IN_PROGRESS for ever, so the group id is dead until the broker restarts.
    Closing two members at once (E8) does it whenever the follower's LeaveGroup lands
    first, as the first leave makes the group rebalance. Leaving from a re-formed group
    ("Formed") is safe: Tansu then drops the leader and the next joiner takes over. No
    consumer setting avoids it: with static membership (no LeaveGroup) Tansu holds every
    JoinGroup and SyncGroup 3 s and rebalances for ever, cooperative-sticky still leaves
    by LeaveGroup, and Tansu lacks KIP-848 (group.protocol=consumer).
    """
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    received: list[Message] = []

    def leave(consumer: Consumer) -> None:
        live = server.server.connections
        consumer.close()
        # The connection ends once close() has committed and left the group.
        wait_until(lambda: server.server.connections < live, 15, "a consumer to leave")

    def re_form(survivors: list[Consumer]) -> None:
        def stable() -> bool:
            for consumer in survivors:
                message = consumer.consume(0.1)
                if message is not None:
                    consumer.commit(message)
                    received.append(message)
            return group_state(admin, group) == ConsumerGroupState.STABLE

        wait_until(stable, 15, f"group {group} to re-form after a member left")

    for index, consumer in enumerate(consumers):
        leave(consumer)
        if index + 1 < len(consumers):
            re_form(consumers[index + 1 :])
    return received


def gid() -> str:
    return f"grp-{secrets.token_hex(4)}"


def test_consume_many_and_keyed_partition(server: ServerThread, tansu: TansuBroker) -> None:
    topic = tansu.create_topic()  # E1 then E2 on the same topic and consumer
    produce_all(server, topic, [0, 1, 2])
    consumer = Consumer(server, gid(), topic, protocol=2)
    values = sorted(consumer.consume_with_retry().value for _ in range(3))
    assert values == ["0", "1", "2"]
    produce_all(server, topic, [f"k{n}" for n in range(100)], key="foo")
    keyed = [consumer.consume_with_retry() for _ in range(100)]
    assert sorted(m.value for m in keyed) == sorted(f"k{n}" for n in range(100))
    assert len({m.partition for m in keyed}) == 1
    consumer.close()


def test_two_consumers_one_group_and_rebalance(server: ServerThread, tansu: TansuBroker) -> None:
    topic, group = tansu.create_topic(), gid()  # E3
    first = Consumer(server, group, topic)
    second = Consumer(server, group, topic)
    produce_all(server, topic, ["a", "b"])
    seen: list[str] = []
    for _ in range(10):
        for consumer in (first, second):
            message = consumer.consume(1)
            if message is not None:
                consumer.commit(message)
                seen.append(message.value)
        if len(seen) >= 2:
            break
    assert sorted(seen) == ["a", "b"]
    first.close()
    second.close()

    topic, group = tansu.create_topic(), gid()  # E4
    cons1 = Consumer(server, group, topic)
    produce_all(server, topic, ["hi"])
    assert [m.value for m in cons1.consume_committed(1)] == ["hi"]
    cons1.close()  # commits on close
    cons2 = Consumer(server, group, topic)
    produce_all(server, topic, ["hello"])
    got = [cons2.consume_with_retry().value]
    if got == ["hi"]:  # cons1's commit had not landed yet
        got.append(cons2.consume_with_retry().value)
    assert got[-1] == "hello"
    cons2.close()


def test_different_topics(server: ServerThread, tansu: TansuBroker) -> None:  # E5
    topic1, topic2 = tansu.create_topic(), tansu.create_topic()
    produce_all(server, topic1, ["I'm Mr. Meeseeks"])
    produce_all(server, topic2, ["Look at me"])
    one = Consumer(server, gid(), topic1)
    two = Consumer(server, gid(), topic2)
    assert one.consume_with_retry().value == "I'm Mr. Meeseeks"
    assert two.consume_with_retry().value == "Look at me"
    one.close()
    two.close()


def test_produce_wrong_topic_and_stats_reset(server: ServerThread) -> None:  # E6, E12
    producer = Producer(server)
    assert producer.redis.delete("stats") == 1
    missing = f"idontexist-{secrets.token_hex(3)}"
    assert producer.produce(missing, "x") == 1  # the first produce is accepted...
    assert producer.flush() == 0  # ...and fails on delivery

    def errors() -> int:
        return int(producer.redis.hgetall("stats")[b"producer.delivery.errors"])

    wait_until(lambda: errors() == 1, 5, "producer.delivery.errors to be 1")
    with pytest.raises(redis.ResponseError, match=r"^PROD Local: Unknown topic$"):
        producer.produce(missing, "x")  # now librdkafka knows: refused at once
    assert producer.redis.delete("stats") == 1
    assert errors() == 0
    producer.close()


def test_reconnect_single_partition(server: ServerThread, tansu: TansuBroker) -> None:  # E7
    topic, group = tansu.create_topic(1), gid()
    produce_all(server, topic, ["foo"])
    first = Consumer(server, group, topic)
    assert [m.value for m in first.consume_committed(1)] == ["foo"]
    first.close()
    produce_all(server, topic, ["bar"])
    again = Consumer(server, group, topic)
    assert again.consume_with_retry().value == "bar"
    again.close()
    other = Consumer(server, gid(), topic)
    assert [other.consume_with_retry().value for _ in range(2)] == ["foo", "bar"]
    other.close()


@pytest.mark.slow
def test_reconnect_many_partitions(server: ServerThread, tansu: TansuBroker) -> None:  # E8
    topic, group = tansu.create_topic(), gid()
    seen: list[str] = []

    def drain(consumers: list[Consumer], wanted: int) -> None:
        for _ in range(30):
            for consumer in consumers:
                message = consumer.consume(0.5)
                if message is not None:
                    consumer.commit(message)
                    seen.append(message.value)
            if len(set(seen)) >= wanted:
                return
        raise AssertionError(f"saw {sorted(set(seen))}, wanted {wanted} values")

    pair = [Consumer(server, group, topic), Consumer(server, group, topic)]
    produce_all(server, topic, list(range(1, 11)))
    drain(pair, 10)
    # Rafka's test closes both and sleeps 2 s; we close them one at a time, each waited
    # for until it has committed and left, so as not to kill the group on Tansu.
    seen.extend(message.value for message in close_one_at_a_time(server, tansu, group, pair))
    pair = [Consumer(server, group, topic), Consumer(server, group, topic)]
    produce_all(server, topic, list(range(11, 21)))
    drain(pair, 20)
    for consumer in pair:
        consumer.close()
    assert set(seen) == {str(n) for n in range(1, 21)}
    assert len(seen) - len(set(seen)) <= 6


def test_consumer_id_reclaim_and_uniqueness(server: ServerThread, tansu: TansuBroker) -> None:
    topic, group = tansu.create_topic(), gid()  # E9, E10
    produce_all(server, topic, ["one"])
    first = Consumer(server, group, topic, name="i")
    assert [m.value for m in first.consume_committed(1)] == ["one"]
    with pytest.raises(redis.ResponseError, match=f"^CONS id {group}:i is already taken$"):
        Consumer(server, group, topic, name="i").redis.ping()  # SETNAME on connect
    first.close()
    again = Consumer(server, group, topic, name="i")  # reclaimed at once
    produce_all(server, topic, ["two"])
    assert again.consume_with_retry().value == "two"
    again.close()


def test_manual_commit(server: ServerThread, tansu: TansuBroker) -> None:  # E13
    topic, group = tansu.create_topic(2), gid()
    produce_all(server, topic, list(range(50)))
    consumer = Consumer(server, group, topic)
    unacked = [consumer.consume_with_retry() for _ in range(50)]
    assert sorted(int(m.value) for m in unacked) == list(range(50))
    consumer.close()
    consumer = Consumer(server, group, topic)
    assert consumer.consume_with_retry().offset == 0  # nothing was committed
    consumer.close()
    consumer = Consumer(server, group, topic)
    messages = [consumer.consume_with_retry() for _ in range(50)]
    consumer.commit(*messages)
    consumer.close()  # closing commits the acked offsets
    produce_all(server, topic, list(range(50, 100)))
    consumer = Consumer(server, group, topic)
    later = [consumer.consume_with_retry() for _ in range(50)]
    assert sorted(int(m.value) for m in later) == list(range(50, 100))
    consumer.close()


def test_batches_and_commit_on_close(server: ServerThread, tansu: TansuBroker) -> None:
    topic, group = tansu.create_topic(1), gid()  # E14, E15, E16
    produce_all(server, topic, list(range(50)))

    def batch(consumer: Consumer, size: int) -> list[Message]:
        return [consumer.consume_with_retry(0.3, retries=20) for _ in range(size)]

    consumer = Consumer(server, group, topic)
    first = batch(consumer, 10)
    consumer.commit(*first)
    assert first[-1].value == "9"
    consumer.close()
    consumer = Consumer(server, group, topic)
    second = batch(consumer, 5)
    consumer.commit(*second)
    assert second[-1].value == "14"
    consumer.close()
    consumer = Consumer(server, group, topic)
    failed = batch(consumer, 5)  # the block raised: no commit
    assert [m.value for m in failed] == ["15", "16", "17", "18", "19"]
    consumer.close()
    consumer = Consumer(server, group, topic)
    again = batch(consumer, 5)
    assert again[-1].value == "19"
    # E14: the rest arrives in one go with a short timeout per BLPOP.
    rest = batch(consumer, 30)
    assert [m.value for m in rest] == [str(n) for n in range(20, 50)]
    assert consumer.consume(0.3) is None
    consumer.close()


def test_librdkafka_config_overrides(server: ServerThread, tansu: TansuBroker) -> None:  # E17
    topic = tansu.create_topic(1)
    # `logger`: confluent-kafka's key for a Python object; as a string every poll failed
    # (`ERR internal error` for each BLPOP) instead of the registration.
    for bad in ({"foo": "bar"}, {"session.timeout.ms": True}, {"logger": "x"}):
        consumer = Consumer(server, gid(), topic, config=bad)
        with pytest.raises(redis.ResponseError, match=r"^CONS Failed to register Consumer"):
            consumer.consume(1)
        consumer.close()
    for good in ({}, {"session.timeout.ms": 12345, "log.connection.close": False}):
        consumer = Consumer(server, gid(), topic, config=good)
        assert consumer.consume(0.1) is None
        consumer.close()
    produce_all(server, topic, ["foo"])
    latest = Consumer(server, gid(), topic, config={"auto.offset.reset": "latest"})
    assert latest.consume(1) is None
    # Produce until the consumer's assignment exists; it must never see "foo".
    for _ in range(20):
        produce_all(server, topic, ["bar"])
        message = latest.consume(0.5)
        if message is not None:
            assert message.value == "bar"
            break
    else:
        raise AssertionError("the latest-reset consumer never received bar")
    latest.close()
