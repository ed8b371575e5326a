"""Lease leader election against a fake in-memory Lease store (the protocol, not the network)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from declop.clock import FakeClock
from declop.errors import ConfigError, Conflict, NotFound
from declop.leader import LeaderElector


class LeaseServer:
    """Just enough of the coordination.k8s.io Lease API: GET, POST, PUT with resourceVersion checks."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            if self.lease is None:
                raise NotFound()
            return copy.deepcopy(self.lease)
        if method == "POST":
            if self.lease is not None:
                raise Conflict()
            self.rv += 1
            self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.rv)}}
            return copy.deepcopy(self.lease)
        if method == "PUT":
            assert self.lease is not None
            if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
                raise Conflict()
            self.rv += 1
            self.lease = copy.deepcopy(body)
            self.lease["metadata"]["resourceVersion"] = str(self.rv)
            return copy.deepcopy(self.lease)
        raise AssertionError(method)


def elector(server: LeaseServer, identity: str, clock: FakeClock) -> LeaderElector:
    return LeaderElector(server, name="lock", namespace="ns", identity=identity, clock=clock)


def test_first_candidate_creates_the_lease() -> None:
    server, clock = LeaseServer(), FakeClock()
    a = elector(server, "a", clock)
    assert asyncio.run(a.try_acquire_or_renew())
    assert server.lease["spec"]["holderIdentity"] == "a"
    assert server.lease["spec"]["leaseDurationSeconds"] == 15


def test_a_held_lease_is_not_taken_until_it_expires_on_our_clock() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    assert asyncio.run(a.try_acquire_or_renew())
    assert not asyncio.run(b.try_acquire_or_renew())
    clock.advance(14)
    assert not asyncio.run(b.try_acquire_or_renew())
    clock.advance(1.5)  # 15.5 s since b first saw this record: expired
    assert asyncio.run(b.try_acquire_or_renew())
    assert server.lease["spec"]["holderIdentity"] == "b"
    assert server.lease["spec"]["leaseTransitions"] == 1


def test_renewals_keep_it_and_reset_the_expiry_seen_by_others() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    asyncio.run(a.try_acquire_or_renew())
    for _ in range(10):
        clock.advance(10)
        server.lease["spec"]["renewTime"] = f"t{clock()}"  # a renews (renewTime changes)
        assert asyncio.run(a.try_acquire_or_renew())
        assert not asyncio.run(b.try_acquire_or_renew())


def test_a_released_lease_is_taken_at_once() -> None:
    server, clock = LeaseServer(), FakeClock()
    a, b = elector(server, "a", clock), elector(server, "b", clock)
    asyncio.run(a.try_acquire_or_renew())
    a.is_leader = True
    assert not asyncio.run(b.try_acquire_or_renew())
    asyncio.run(a.release())
    assert server.lease["spec"]["holderIdentity"] == ""
    assert asyncio.run(b.try_acquire_or_renew())


def test_a_lost_race_is_not_leadership() -> None:
    server, clock = LeaseServer(), FakeClock()
    a = elector(server, "a", clock)
    asyncio.run(a.try_acquire_or_renew())
    real = server.request

    async def racing(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if method == "PUT":
            raise Conflict()
        return await real(method, path, body, **kw)

    server.request = racing  # type: ignore[method-assign]
    assert not asyncio.run(a.try_acquire_or_renew())


def test_invalid_timings_are_refused() -> None:
    with pytest.raises(ConfigError, match="lease_duration > renew_deadline"):
        LeaderElector(LeaseServer(), name="l", namespace="n", lease_duration=10, renew_deadline=10, retry_period=2)
