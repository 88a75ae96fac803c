"""The virtual clock and event queue: (time, sequence) order, never back in time."""

from __future__ import annotations

from arl_tangram.sim.engine import EventQueue


def test_entries_fire_in_time_then_insertion_order() -> None:
    q = EventQueue()
    fired: list[str] = []
    q.at(2.0, lambda: fired.append("b"))
    q.at(1.0, lambda: fired.append("a1"))
    q.at(1.0, lambda: fired.append("a2"))
    q.at(3.0, lambda: fired.append("c"))
    batches = []
    while q:
        due = q.pop_due()
        batches.append((q.now_s, len(due)))
        for cb in due:
            cb()
    assert fired == ["a1", "a2", "b", "c"]
    assert batches == [(1.0, 2), (2.0, 1), (3.0, 1)]


def test_never_schedules_in_the_past_and_after_is_relative() -> None:
    q = EventQueue()
    q.at(5.0, lambda: None)
    q.pop_due()
    assert q.now_s == 5.0
    fired: list[float] = []
    q.at(1.0, lambda: fired.append(q.now_s))  # in the past: clamped to now
    q.after(2.0, lambda: fired.append(q.now_s))
    while q:
        for cb in q.pop_due():
            cb()
    assert fired == [5.0, 7.0]
    assert q.pop_due() == []


def test_callbacks_may_schedule_more_at_the_same_time() -> None:
    q = EventQueue()
    fired: list[str] = []
    q.at(1.0, lambda: (fired.append("first"), q.after(0.0, lambda: fired.append("second"))))
    while q:
        for cb in q.pop_due():
            cb()
    assert fired == ["first", "second"]
    assert q.now_s == 1.0
