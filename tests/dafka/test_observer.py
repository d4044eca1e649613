"""The gateway's observer (`observer.Observer`): the heads of every partition, per topic,
from HEADs (published) and the stores' answers (stored), with a real store and producers
on the test's tower."""

from __future__ import annotations

import zmq

from backends.dafka.config import Config
from backends.dafka.observer import Observer
from backends.dafka.producer import Producer
from backends.dafka.store import Store
from tests.support.waiting import wait_until


def test_heads_of_a_topic_are_its_own_partitions_only(dafka_config: Config, store: Store) -> None:
    ctx: zmq.Context = zmq.Context.instance()
    producers = [Producer(dafka_config, topic, ctx) for topic in ("a", "ab", "a", "b")]
    observer = Observer(dafka_config, ctx)
    try:
        for number, producer in enumerate(producers):
            producer.publish_many([b"x"] * (number + 1))
        expected = {
            "a": {producers[0].address: 0, producers[2].address: 2},
            "ab": {producers[1].address: 1},
            "b": {producers[3].address: 3},
        }
        wait_until(
            lambda: all(observer.heads(topic) == heads for topic, heads in expected.items()),
            10,
            f"the heads of each topic ({ {t: observer.heads(t) for t in expected} })",
        )
        assert observer.topics() == {"a", "ab", "b"}
        assert observer.heads("c") == {}
        # What a store acknowledged to a producer of this process counts at once.
        observer.note_stored("c", producers[0].address, 7)
        assert observer.heads("c") == {producers[0].address: 7}
        assert observer.stored_head("c", producers[0].address) == 7
    finally:
        observer.close()
        for producer in producers:
            producer.close(timeout=0)
