"""The gap of the timers that repeat soon after a start (beacon, HEADs, GET_HEADS)."""

from backends.dafka.doubling import DoublingGap


def test_the_gap_doubles_from_first_up_to_the_interval() -> None:
    gaps = DoublingGap(50, 1000)
    assert [gaps.gap] + [gaps.double() for _ in range(6)] == [50, 100, 200, 400, 800, 1000, 1000]
    assert not gaps.quick


def test_a_first_gap_over_the_interval_is_the_interval() -> None:
    assert DoublingGap(100, 30).gap == 30
    assert not DoublingGap(100, 30).quick


def test_settle_ends_the_quick_gaps() -> None:
    gaps = DoublingGap(50, 1000)
    assert gaps.quick
    gaps.settle()
    assert not gaps.quick
    assert (gaps.gap, gaps.double()) == (1000, 1000)
