"""declop.cache.backoff.Backoff: client-go's reflector backoff (0.8 s doubling to 30 s, jitter in
[d, 2d), reset after 2 quiet minutes). How the informer uses it: tests/unit/cache/test_informer.py."""

from __future__ import annotations

import random

import pytest

from declop.cache.backoff import Backoff


def test_backoff_at_real_defaults_allows_about_ten_lists_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.8 s doubling to 30 s with jitter in [d, 2d) (capped at 30 s): at most 7 attempts fit in
    a minute even with the smallest jitter, 6 with the largest — "no more than ~10"."""
    for jitter, most in ((0.0, 7), (0.999999, 6)):
        monkeypatch.setattr(random, "random", lambda j=jitter: j)
        clock = [0.0]
        backoff = Backoff(clock=lambda: clock[0])
        attempts = 1
        while True:
            clock[0] += backoff.next()
            if clock[0] > 60:
                break
            attempts += 1
        assert attempts == most


def test_backoff_doubles_caps_and_resets_after_two_quiet_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)
    now = [0.0]
    backoff = Backoff(clock=lambda: now[0])
    assert [backoff.next() for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    now[0] += 119
    assert backoff.next() == 30.0
    now[0] += 121  # a healthy watch of two minutes
    assert backoff.next() == 0.8
