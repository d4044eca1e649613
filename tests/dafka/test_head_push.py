"""Which DIRECT_HEADs a store reader pushes to earliest consumers (issue 7), as pure logic:
the clock is an argument, so intervals and durations are exact here."""

from __future__ import annotations

from backends.dafka.head_push import HeadPush


def test_a_change_is_pushed_to_each_watcher_of_its_topic_for_the_duration() -> None:
    push = HeadPush(interval_ms=100, duration_ms=300)
    push.watch("C1", "orders")
    push.watch("C2", "orders")
    push.watch("C3", "other")
    push.changed([("orders", "P", 4)])
    assert sorted(push.due(1000)) == [("C1", "orders", "P", 4), ("C2", "orders", "P", 4)]
    push.changed([("orders", "P", 7)])  # a later head replaces the earlier one
    assert sorted(push.due(1100)) == [("C1", "orders", "P", 7), ("C2", "orders", "P", 7)]
    assert len(push.due(1400)) == 2  # the duration restarted with the change at 1100
    assert push.due(1401) == []  # and is over: a bounded number of pushes per change


def test_nothing_is_pushed_without_a_change_or_a_watcher() -> None:
    push = HeadPush(interval_ms=100, duration_ms=300)
    push.watch("C1", "orders")
    assert push.due(1000) == []
    push.changed([("unwatched", "P", 1)])
    assert push.due(1100) == []
    push.watch("C2", "unwatched")  # it asked after the change: its GET_HEADS answer had it
    assert push.due(1200) == []


def test_store_writers_asking_for_every_subject_are_not_watchers() -> None:
    """A store writer asks heads of "" (every subject) and catches up on its own."""
    push = HeadPush(interval_ms=100, duration_ms=300)
    push.watch("WRITER", "")
    push.watch("", "orders")
    push.watch("BAD\0UUID", "orders")
    assert not push.watching
    push.changed([("orders", "P", 1)])
    assert push.due(1000) == []


def test_zero_interval_or_duration_turns_it_off() -> None:
    for interval, duration in ((0, 10_000), (1000, 0)):
        push = HeadPush(interval, duration)
        push.watch("C1", "orders")
        assert not push.enabled and not push.watching


def test_a_forgotten_consumer_gets_nothing_more() -> None:
    push = HeadPush(interval_ms=100, duration_ms=1000)
    push.watch("C1", "orders")
    push.watch("C1", "other")
    push.watch("C2", "orders")
    push.changed([("orders", "P", 1), ("other", "P", 1)])
    assert len(push.due(1000)) == 3
    push.forget("C1")
    assert push.due(1100) == [("C2", "orders", "P", 1)]
    push.forget("C2")
    assert not push.watching
    assert push.due(1200) == []


def test_watches_are_bounded_and_the_oldest_goes_first() -> None:
    push = HeadPush(interval_ms=100, duration_ms=1000, max_watches=2)
    push.watch("C1", "orders")
    push.watch("C2", "orders")
    push.watch("C1", "orders")  # asked again: now the youngest
    push.watch("C3", "orders")  # C2 goes
    push.changed([("orders", "P", 1)])
    assert sorted(consumer for consumer, *_ in push.due(1000)) == ["C1", "C3"]
