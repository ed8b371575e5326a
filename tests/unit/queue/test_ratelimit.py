"""declop.queue.ratelimit: client-go's default rate limiters, driven by a FakeClock."""

from __future__ import annotations

import math
from typing import Hashable

import pytest

from declop.clock import FakeClock
from declop.queue.ratelimit import (
    ItemExponential,
    MaxOf,
    RateLimiter,
    TokenBucket,
    default_controller_rate_limiter,
)

# ---------------------------------------------------------------------------- ItemExponential


def test_exponential_sequence_doubles_from_5ms() -> None:
    limiter = ItemExponential()
    delays = [limiter.when("a") for _ in range(5)]
    assert delays == pytest.approx([0.005, 0.010, 0.020, 0.040, 0.080])
    assert limiter.num_requeues("a") == 5


def test_exponential_cap_first_hit_on_19th_failure() -> None:
    limiter = ItemExponential(0.005, 1000.0)
    delays = [limiter.when("a") for _ in range(19)]
    assert delays[17] == pytest.approx(655.36)  # 18th failure: 5 ms * 2**17, still below the cap
    assert max(delays[:18]) < 1000.0
    assert delays[18] == 1000.0  # 5 ms * 2**18 = 1310.72 s > cap
    assert limiter.when("a") == 1000.0


def test_exponential_never_overflows() -> None:
    limiter = ItemExponential(0.005, 1000.0)
    for _ in range(3000):  # 2**3000 is far past float range
        delay = limiter.when("a")
    assert delay == 1000.0
    assert limiter.num_requeues("a") == 3000


def test_exponential_is_per_item_and_forget_resets() -> None:
    limiter = ItemExponential()
    for _ in range(3):
        limiter.when("a")
    assert limiter.when("b") == pytest.approx(0.005)
    assert limiter.num_requeues("a") == 3
    assert limiter.num_requeues("b") == 1
    limiter.forget("a")
    limiter.forget("never-seen")  # no error
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == pytest.approx(0.005)
    assert limiter.num_requeues("b") == 1


def test_exponential_validates_and_reprs() -> None:
    with pytest.raises(ValueError):
        ItemExponential(-1.0)
    with pytest.raises(ValueError):
        ItemExponential(0.005, math.nan)
    limiter = ItemExponential(0.001, 10.0)
    limiter.when("x")
    assert repr(limiter) == "ItemExponential(base=0.001, cap=10.0, tracked=1)"
    assert (limiter.base, limiter.cap) == (0.001, 10.0)


# ---------------------------------------------------------------------------- TokenBucket


def test_bucket_burst_then_one_per_qps() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10.0, burst=3, clock=clock)
    assert [bucket.when("x") for _ in range(3)] == [0.0, 0.0, 0.0]
    # the bucket is empty: reservations queue up 1/qps apart
    assert [bucket.when("x") for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_bucket_refills_at_qps_up_to_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10.0, burst=3, clock=clock)
    for _ in range(3):
        bucket.when("x")
    assert bucket.when("x") == pytest.approx(0.1)  # balance -1
    clock.advance(0.1)  # balance 0
    assert bucket.when("x") == pytest.approx(0.1)  # balance -1
    clock.advance(0.35)  # balance 2.5
    assert bucket.when("x") == 0.0  # 1.5
    assert bucket.when("x") == 0.0  # 0.5
    assert bucket.when("x") == pytest.approx(0.05)  # -0.5
    clock.advance(3600.0)  # refill is capped at burst
    assert [bucket.when("x") for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


def test_bucket_is_global_and_keeps_no_item_state() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=1.0, burst=1, clock=clock)
    assert bucket.when("a") == 0.0
    assert bucket.when("b") == pytest.approx(1.0)  # another item shares the bucket
    assert bucket.num_requeues("a") == 0
    bucket.forget("a")
    assert bucket.when("a") == pytest.approx(2.0)  # forget does not refill


def test_bucket_refund_returns_an_abandoned_token_up_to_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10.0, burst=2, clock=clock)
    bucket.when("x"), bucket.when("x")
    assert bucket.when("x") == pytest.approx(0.1)  # balance -1: this one would wait
    bucket.refund()  # ...but its wait was cancelled
    assert bucket.when("x") == pytest.approx(0.1)  # so the next waits 0.1 s, not 0.2 s
    for _ in range(5):
        bucket.refund()
    assert [bucket.when("x") for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])  # capped at burst


def test_bucket_infinite_qps_and_validation() -> None:
    bucket = TokenBucket(qps=math.inf, burst=1, clock=FakeClock())
    assert [bucket.when("x") for _ in range(10)] == [0.0] * 10
    with pytest.raises(ValueError):
        TokenBucket(qps=0.0)
    with pytest.raises(ValueError):
        TokenBucket(burst=0)
    assert repr(TokenBucket(2.0, 5, FakeClock())) == "TokenBucket(qps=2.0, burst=5, tokens=5.000)"


# ---------------------------------------------------------------------------- MaxOf


class _Recording:
    """A limiter with scripted answers that records every call."""

    def __init__(self, delay: float, requeues: int) -> None:
        self.delay = delay
        self.requeues = requeues
        self.calls: list[tuple[str, Hashable]] = []

    def when(self, item: Hashable) -> float:
        self.calls.append(("when", item))
        return self.delay

    def forget(self, item: Hashable) -> None:
        self.calls.append(("forget", item))

    def num_requeues(self, item: Hashable) -> int:
        return self.requeues


def test_max_of_asks_all_and_takes_the_max() -> None:
    slow, fast = _Recording(2.0, 1), _Recording(0.5, 7)
    limiter = MaxOf(fast, slow)
    assert limiter.when("k") == 2.0
    assert fast.calls == [("when", "k")] and slow.calls == [("when", "k")]
    assert limiter.num_requeues("k") == 7
    limiter.forget("k")
    assert fast.calls[-1] == ("forget", "k") and slow.calls[-1] == ("forget", "k")
    assert limiter.limiters == (fast, slow)
    assert MaxOf().when("k") == 0.0
    assert MaxOf().num_requeues("k") == 0


def test_default_controller_rate_limiter() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    assert isinstance(limiter, RateLimiter)
    # exponential dominates for one item: 5 ms, 10 ms, 20 ms
    assert [limiter.when("a") for _ in range(3)] == pytest.approx([0.005, 0.010, 0.020])
    assert limiter.num_requeues("a") == 3
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0


def test_default_controller_bucket_dominates_after_burst() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(qps=10.0, burst=100, clock=clock)
    delays = [limiter.when(i) for i in range(102)]  # 102 distinct items, first failure each
    assert delays[:100] == pytest.approx([0.005] * 100)
    assert delays[100:] == pytest.approx([0.1, 0.2])  # bucket empty: 1/qps spacing wins
    assert "ItemExponential" in repr(limiter) and "TokenBucket" in repr(limiter)


def test_rate_limit_builds_client_go_s_limiter_with_its_values() -> None:
    from declop.clock import FakeClock
    from declop.queue.ratelimit import RateLimit

    clock = FakeClock()
    limiter = RateLimit(base=0.5, cap=2.0, qps=1.0, burst=1).limiter(clock)
    assert [limiter.when("a") for _ in range(4)] == [0.5, 1.0, 2.0, 3.0]  # the bucket: 1/s after a burst of 1
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert RateLimit() == RateLimit(base=0.005, cap=1000.0, qps=10.0, burst=100)
