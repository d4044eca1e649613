"""The one configuration the tests, e2e and benchmarks give the Kafka engine on Tansu."""

from __future__ import annotations


def kafka_document(bootstrap: str) -> dict[str, dict[str, object]]:
    """Rafka's test configuration (spec §8.2), adapted to modern librdkafka and Tansu.

    As a configuration document's Kafka sections (the `go.*` keys are Rafka's, accepted
    and dropped). Group joins take half of session.timeout.ms on Tansu: 2000 keeps them
    near one second. The producer refuses unknown topics, and quickly (spec §15.2).
    """
    return {
        "general": {"bootstrap.servers": bootstrap, "log_level": 3},
        "consumer": {
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "enable.auto.offset.store": False,
            "go.events.channel.enable": False,
            "go.application.rebalance.enable": False,
        },
        "producer": {
            "go.delivery.reports": True,
            "queue.buffering.max.ms": 0,
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 200,
        },
    }
