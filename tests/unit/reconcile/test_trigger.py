"""declop.reconcile.trigger: the per-key trace and the frozen trigger a reconcile gets."""

from __future__ import annotations


import pytest

from declop.reconcile.trigger import MAX_DETAILS, NO_TRIGGER, Trace, Trigger


def test_a_trace_counts_sources_in_first_seen_order_and_the_rv_range() -> None:
    trace = Trace()
    trace.note("updated", "10")
    trace.note("owns:Pod", None, "Pod ns/p1")
    trace.note("updated", "12")
    trace.note("owns:Pod", None, "Pod ns/p1")  # the same detail once
    trigger = trace.freeze()
    assert trigger == Trigger(sources=(("updated", 2), ("owns:Pod", 2)), events=4, details=("Pod ns/p1",), resource_versions=("10", "12"))
    assert trigger.names == ("updated", "owns:Pod")
    assert str(trigger) == "updated*2 owns:Pod*2 (Pod ns/p1) rv=10..12"


def test_details_are_bounded() -> None:
    trace = Trace()
    for i in range(3 * MAX_DETAILS):
        trace.note("watches:secrets", None, f"s{i}")
    trigger = trace.freeze()
    assert len(trigger.details) == MAX_DETAILS and trigger.events == 3 * MAX_DETAILS


def test_merge_keeps_the_older_causes_first() -> None:
    older, newer = Trace(), Trace()
    older.note("created", "1")
    newer.note("updated", "2")
    newer.note("retry", None, "Conflict")
    older.merge(newer)
    assert older.freeze() == Trigger((("created", 1), ("updated", 1), ("retry", 1)), 3, ("Conflict",), ("1", "2"))


def test_a_trigger_is_read_only_and_the_empty_one_prints() -> None:
    with pytest.raises(AttributeError):
        NO_TRIGGER.events = 3  # type: ignore[misc]
    assert str(NO_TRIGGER) == "none"
    assert str(Trigger((("requeue_after", 1),), 1)) == "requeue_after"
    assert str(Trigger((("updated", 1),), 1, resource_versions=("7", "7"))) == "updated rv=7"
