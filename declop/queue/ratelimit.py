"""Rate limiters: how long a failed item waits before its next attempt.

This module owns the *arithmetic* of retry delays and nothing else. It never sleeps, never
schedules and never touches a queue: a limiter is asked ``when(item)`` and answers a number of
seconds; the caller (``declop.queue.workqueue``) does the waiting. Time comes only from an injected
:data:`~declop.clock.Clock`, so every limiter is deterministic under a
:class:`~declop.clock.FakeClock`.

The semantics are those of client-go's ``util/workqueue/default_rate_limiters.go``:

* :class:`ItemExponential` — per item, ``base * 2**failures`` (then ``failures += 1``), capped at
  ``cap``. With the defaults (5 ms, 1000 s) the delays run 5 ms, 10 ms, 20 ms, … and the cap is
  first returned on the 19th consecutive failure (5 ms * 2**18 = 1310.72 s > 1000 s).
* :class:`TokenBucket` — one bucket for *all* items, golang ``rate.Limiter.Reserve().Delay()``:
  it starts full with ``burst`` tokens, refills at ``qps`` tokens per second up to ``burst``, and
  every ``when`` reserves one token even if that drives the balance negative; the answer is the
  time until the reservation is covered.
* :class:`MaxOf` — asks every limiter (so all of them record the attempt) and returns the largest
  delay; :func:`default_controller_rate_limiter` is ``MaxOf(ItemExponential, TokenBucket)``.

Invariants:

* ``when`` always returns a finite delay ``>= 0``; for :class:`ItemExponential` it never exceeds
  ``cap`` and never overflows, however many failures an item has had.
* ``forget(item)`` is the only thing that resets an item's history. Callers must call it once an
  item succeeds, or its failures are tracked forever (client-go: "Remember to call Forget!").
* ``num_requeues(item)`` counts the ``when`` calls since the last ``forget`` (0 for limiters that
  keep no per-item state).
* Limiters are not thread-safe; like the work queue they belong to one event-loop thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Protocol, runtime_checkable

from declop.clock import MONOTONIC, Clock
from declop.errors import RegistrationError

__all__ = [
    "ItemExponential",
    "MaxOf",
    "RateLimit",
    "RateLimiter",
    "TokenBucket",
    "default_controller_rate_limiter",
]


@runtime_checkable
class RateLimiter(Protocol):
    """What a work queue needs from a rate limiter (client-go ``TypedRateLimiter``)."""

    def when(self, item: Hashable) -> float:
        """Record one more attempt for ``item``; return how many seconds it should wait first."""
        ...

    def forget(self, item: Hashable) -> None:
        """Drop everything remembered about ``item`` (it succeeded, or was deleted)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many times ``item`` has been requeued through this limiter since ``forget``."""
        ...


class ItemExponential:
    """Per-item exponential backoff: ``min(base * 2**failures, cap)`` seconds, then ``failures += 1``.

    ``failures`` counts ``when`` calls for the item since its last :meth:`forget`; it is also what
    :meth:`num_requeues` reports. Memory grows with the number of distinct items that failed and
    have not been forgotten.
    """

    __slots__ = ("_base", "_cap", "_failures")

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        if not base >= 0.0 or not cap >= 0.0:  # also rejects NaN
            raise ValueError(f"base and cap must be >= 0, got base={base!r}, cap={cap!r}")
        self._base = float(base)
        self._cap = float(cap)
        self._failures: dict[Hashable, int] = {}

    @property
    def base(self) -> float:
        """Delay of the first failure, in seconds."""
        return self._base

    @property
    def cap(self) -> float:
        """Largest delay ever returned, in seconds."""
        return self._cap

    def when(self, item: Hashable) -> float:
        failures = self._failures
        exponent = failures.get(item, 0)
        failures[item] = exponent + 1
        try:
            delay = math.ldexp(self._base, exponent)  # base * 2**exponent, exact, no pow()
        except OverflowError:  # ~1000+ failures: the exact value is past float range
            return self._cap
        return delay if delay < self._cap else self._cap

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(base={self._base!r}, cap={self._cap!r}, "
            f"tracked={len(self._failures)})"
        )


class TokenBucket:
    """One token bucket shared by all items (golang ``rate.Limiter.Reserve().Delay()``).

    The bucket holds at most ``burst`` tokens, starts full, and gains ``qps`` tokens per second.
    Each :meth:`when` takes one token unconditionally; when the balance goes negative the delay
    is ``-balance / qps``, i.e. reservations queue up behind each other ``1/qps`` apart. With
    ``qps=math.inf`` every delay is 0. Per-item state: none (``num_requeues`` is 0, ``forget`` is
    a no-op).
    """

    __slots__ = ("_burst", "_clock", "_last", "_qps", "_tokens")

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = MONOTONIC) -> None:
        if not qps > 0.0:  # also rejects NaN
            raise ValueError(f"qps must be > 0, got {qps!r}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self._qps = float(qps)
        self._burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    @property
    def qps(self) -> float:
        """Refill rate, tokens per second."""
        return self._qps

    @property
    def burst(self) -> int:
        """Bucket size: how many reservations are served without delay after a quiet period."""
        return self._burst

    def when(self, item: Hashable) -> float:
        qps = self._qps
        if qps == math.inf:
            return 0.0
        now = self._clock()
        last = self._last if self._last <= now else now  # as golang: never refill backwards
        tokens = self._tokens + (now - last) * qps
        if tokens > self._burst:
            tokens = float(self._burst)
        tokens -= 1.0
        self._tokens = tokens
        self._last = now
        return -tokens / qps if tokens < 0.0 else 0.0

    def forget(self, item: Hashable) -> None:
        return None

    def num_requeues(self, item: Hashable) -> int:
        return 0

    def refund(self) -> None:
        """Give back the token of a reservation that was abandoned (its wait was cancelled).

        Like golang's ``Reservation.Cancel``: without it, every cancelled wait would keep its
        token and the backlog behind a busy bucket would only grow. The balance never exceeds
        ``burst``.
        """
        if self._qps == math.inf:
            return
        tokens = self._tokens + 1.0
        self._tokens = tokens if tokens < self._burst else float(self._burst)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(qps={self._qps!r}, burst={self._burst!r}, "
            f"tokens={self._tokens:.3f})"
        )


class MaxOf:
    """The most restrictive of several limiters.

    ``when`` asks *every* limiter (each records the attempt) and returns the largest delay;
    ``num_requeues`` is the largest count; ``forget`` goes to all. With no limiters every delay
    is 0. As in client-go, a bucket's burst can appear exceeded when items were also delayed
    separately by another limiter.
    """

    __slots__ = ("_limiters",)

    def __init__(self, *limiters: RateLimiter) -> None:
        self._limiters: tuple[RateLimiter, ...] = limiters

    @property
    def limiters(self) -> tuple[RateLimiter, ...]:
        """The combined limiters, in the order given."""
        return self._limiters

    def when(self, item: Hashable) -> float:
        longest = 0.0
        for limiter in self._limiters:
            delay = limiter.when(item)
            if delay > longest:
                longest = delay
        return longest

    def forget(self, item: Hashable) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        most = 0
        for limiter in self._limiters:
            count = limiter.num_requeues(item)
            if count > most:
                most = count
        return most

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self._limiters))})"


def default_controller_rate_limiter(
    *,
    base: float = 0.005,
    cap: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
    clock: Clock = MONOTONIC,
) -> RateLimiter:
    """client-go's ``DefaultTypedControllerRateLimiter``: per-item exponential backoff
    (5 ms .. 1000 s) combined with an overall token bucket (10 qps, burst 100)."""
    return MaxOf(ItemExponential(base, cap), TokenBucket(qps, burst, clock))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A controller's retry pacing, as a decorator option: ``rate_limit=RateLimit(qps=50)``.

    The defaults are client-go's ``DefaultTypedControllerRateLimiter``: a failed key waits
    ``base * 2**failures`` seconds, at most ``cap`` (5 ms .. 1000 s), and all retries together
    pass an overall token bucket of ``qps`` per second with bursts of ``burst`` (10 qps, 100).
    Bad values raise :class:`~declop.errors.RegistrationError` (a ``ConfigError``) naming the
    field and what it accepts.
    """

    base: float = 0.005
    cap: float = 1000.0
    qps: float = 10.0
    burst: int = 100

    def __post_init__(self) -> None:
        if not (_number(self.base) and 0 <= self.base < math.inf):
            raise RegistrationError(f"rate_limit: base must be a number of seconds >= 0 (client-go: 0.005), got {self.base!r}")
        if not (_number(self.cap) and self.cap >= self.base):
            raise RegistrationError(f"rate_limit: cap must be a number of seconds >= base ({self.base!r}) (client-go: 1000), got {self.cap!r}")
        if not (_number(self.qps) and self.qps > 0):
            raise RegistrationError(f"rate_limit: qps must be a number > 0, or math.inf for no overall limit (client-go: 10), got {self.qps!r}")
        if not (isinstance(self.burst, int) and not isinstance(self.burst, bool) and self.burst >= 1):
            raise RegistrationError(f"rate_limit: burst must be an int >= 1 (client-go: 100), got {self.burst!r}")

    def limiter(self, clock: Clock = MONOTONIC) -> RateLimiter:
        """A fresh limiter with these settings."""
        return default_controller_rate_limiter(base=self.base, cap=self.cap, qps=self.qps, burst=self.burst, clock=clock)
