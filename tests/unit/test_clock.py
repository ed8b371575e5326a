"""The clocks: FakeClock moves only when told; Lease fencing measures on a suspend-aware clock."""

from __future__ import annotations

import inspect
import time

import pytest

from declop import clock
from declop.clock import FakeClock
from declop.leases.leader import LeaderElector
from declop.leases.shards import ShardLeases


def test_a_fake_clock_moves_only_forward_and_only_when_told() -> None:
    c = FakeClock(5.0)
    assert c() == c() == 5.0
    c.advance(1.5)
    assert c() == 6.5
    with pytest.raises(ValueError, match="time does not go backwards"):
        c.advance(-1)


def test_leases_are_fenced_on_a_clock_that_counts_suspended_time() -> None:
    """LEASE_CLOCK is CLOCK_BOOTTIME where it exists (Linux): CLOCK_MONOTONIC stops during a
    suspend, so a resumed replica would trust Leases that expired while it slept."""
    assert hasattr(time, "CLOCK_BOOTTIME"), "this suite runs on Linux"
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = clock.LEASE_CLOCK()
    assert before <= now <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert now >= time.monotonic() - 1e-3  # BOOTTIME = MONOTONIC + time suspended
    assert inspect.signature(ShardLeases).parameters["clock"].default is clock.LEASE_CLOCK
    assert inspect.signature(LeaderElector).parameters["clock"].default is clock.LEASE_CLOCK
