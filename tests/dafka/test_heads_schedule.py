"""When GET_HEADS is sent again (issue 7): backoff from 100 ms up to the interval."""

from backends.dafka.heads_schedule import NEVER, HeadsSchedule


def test_asks_again_with_a_doubling_delay_up_to_the_interval() -> None:
    schedule = HeadsSchedule(500)
    schedule.add("t", now=0)
    asked = [now for now in range(0, 3000, 10) if schedule.due(now)]
    assert asked == [100, 300, 700, 1200, 1700, 2200, 2700]


def test_interval_zero_and_removed_topics_never_ask() -> None:
    off = HeadsSchedule(0)
    off.add("t", now=0)
    assert off.next_due == NEVER and off.due(10**9) == []
    schedule = HeadsSchedule(500)
    schedule.add("t", now=0)
    schedule.add("u", now=50)
    schedule.remove("t")
    assert schedule.due(100) == []
    assert schedule.due(150) == ["u"]
