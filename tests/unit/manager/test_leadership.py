"""declop.manager.leadership: the runnables that hold Leases for a manager.

The simulated world runs them under faults (tests/unit/testing/simulation/test_world.py); these
pin what its built-in handler never reaches: a shard Lease loop that raises, the background
Lease that runs a sharded manager's leader-only background tasks (on virtual time, against the
fake apiserver's Leases), and a Lease round that comes while the informers' ranges are moving."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from declop.cache.informer import Backoff
from declop.lifecycle import Lifecycle, make_hook
from declop.manager import leadership
from declop.manager.options import Options
from declop.manager.runnables import RunGroup
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.loop import VirtualLoop

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/background"


def test_a_shard_lease_loop_that_raises_is_logged_and_handled_as_a_loss(caplog: pytest.LogCaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the Lease loop must not leave ranges held without renewals: one line with the
    traceback, then the loss path (stop reconciling, exit 1) — not an exception out of the task."""
    losses: list[bool] = []

    async def broken() -> None:
        raise RuntimeError("a bug in the Lease loop")

    async def after_loss(m: Any, *, leader_only_background: bool) -> None:
        losses.append(leader_only_background)

    monkeypatch.setattr(leadership, "after_loss", after_loss)
    asyncio.run(leadership.RangeLeases(SimpleNamespace(shard_leases=SimpleNamespace(run=broken))).run())
    assert losses == [False]
    failed = [r for r in caplog.records if r.getMessage() == "Shard leases failed; stopping"]
    assert failed and failed[0].exc_info is not None and "a bug in the Lease loop" in str(failed[0].exc_info[1])


def test_a_lost_leader_lease_stops_the_leader_only_background_tasks_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leader election: once the elector's hold returns (the Lease is lost), the loss path runs
    with the leader-only background tasks — they are cancelled at once, not left to the exit."""
    losses: list[bool] = []

    async def after_loss(m: Any, *, leader_only_background: bool) -> None:
        losses.append(leader_only_background)

    async def nothing() -> None:
        return None

    monkeypatch.setattr(leadership, "after_loss", after_loss)
    elector = SimpleNamespace(acquire=nothing, hold=nothing)
    m = SimpleNamespace(elector=elector, leadership=asyncio.Event(), controllers=[], options=Options())
    asyncio.run(leadership.LeaderLease(m).run())
    assert m.leadership.is_set() and losses == [True]


def test_the_background_lease_runs_leader_only_tasks_only_while_it_is_held() -> None:
    """Sharded mode has no leader: a leader-only background task runs on the holder of the
    ``--leader-election-id`` Lease. Held: the task runs. Taken by another holder: the task is
    stopped at once and this replica is a candidate again; its task starts again only once it
    holds the Lease again (after the other holder's record expired)."""
    loop = VirtualLoop()
    server = FakeApiServer()
    ticks: list[float] = []

    async def singleton(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(loop.time())
            await asyncio.sleep(0.25)

    hook = make_hook(singleton, "background")
    assert not hook.every_replica  # leader-only by default
    m = SimpleNamespace(
        transport=server, stopping=False, background_elector=None, left_running=0,
        options=Options(leader_election_id="background", leader_election_namespace="ns",
                        lease_duration=4.0, renew_deadline=3.0, retry_period=0.5),
        lifecycle=Lifecycle([hook], ctx=object(), executor=None, backoff=lambda: Backoff(initial=0.01, cap=0.02)),  # type: ignore[arg-type]
        clocks={"clock": loop.time, "wall_clock": loop.time},
    )  # fmt: skip

    async def until(condition: Any, within: float, what: str) -> float:
        """Poll on virtual time; the instant ``condition`` held."""
        deadline = loop.time() + within
        while not condition():
            assert loop.time() < deadline, f"not within {within} virtual s: {what}"
            await asyncio.sleep(0.05)
        return loop.time()

    def running() -> bool:
        return m.lifecycle.running == ["singleton"]

    async def main() -> None:
        runner = asyncio.ensure_future(leadership.BackgroundLease(m).run())
        try:
            await scenario()
        finally:
            m.stopping = True
            runner.cancel()
            await m.lifecycle.stop_background(grace=0)
            await asyncio.gather(runner, return_exceptions=True)

    async def scenario() -> None:
        # a Lease never seen is created a lease duration on, and leads once it stood for the renew deadline
        held = await until(running, 10.0, "the background Lease held and the task running")
        first = m.background_elector
        assert first is not None and first.valid() and ticks and min(ticks) >= held - 0.05
        await asyncio.sleep(1.0)
        lease = await server.request("GET", LEASE)  # another replica takes it (an admin, a split brain)
        lease["spec"]["holderIdentity"] = "someone-else"
        await server.request("PUT", LEASE, body=lease)
        taken = loop.time()
        stopped = await until(lambda: m.lifecycle.running == [], 2.0, "the task stopped once the Lease was taken")
        assert stopped - taken <= 0.5 + 0.1, "the loss is seen at the next renewal (one retry period)"
        assert max(ticks) <= stopped
        assert m.background_elector is not first and not m.background_elector.valid()  # a candidate again
        await until(running, 10.0, "the Lease held again once the other holder's record expired")
        assert min(t for t in ticks if t > stopped) >= taken + 4.0, "ran again before the other holder's record expired"
        assert m.lifecycle.starts == {"singleton": 2}

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_a_round_during_a_range_move_makes_exactly_one_more_move() -> None:
    """The shard filters follow the Lease rounds, one move at a time: a round that comes while a
    move runs is not lost (the ranges it gained are cached once that move ends) and costs one
    more move, not an endless chain of them."""
    gate = asyncio.Event()
    moves: list[frozenset[str]] = []

    class Informer:
        name = "widgets"
        shard = SimpleNamespace(ranges=(), with_ranges=lambda wanted: SimpleNamespace(ranges=tuple(sorted(wanted))))

        async def set_shard(self, wanted: set[str]) -> Any:
            moves.append(frozenset(wanted))
            await gate.wait()
            self.shard = SimpleNamespace(ranges=tuple(sorted(wanted)), with_ranges=Informer.shard.with_ranges)
            return SimpleNamespace(released=())

        def start(self) -> None:
            pass

    held = {"a"}
    ranges = SimpleNamespace(ranges={"a": "a", "b": "b"}, held=lambda: sorted(held))
    m = SimpleNamespace(group=RunGroup(), sharded={Informer(): [ranges]}, controllers=[])
    resharding = leadership.Resharding(m)

    async def main() -> None:
        resharding.want()
        await asyncio.sleep(0)
        assert moves == [frozenset("a")]  # the first move waits for its relist
        held.add("b")
        resharding.want()  # a round while it runs
        assert moves == [frozenset("a")]
        gate.set()
        task = m.group.task(resharding.name)
        assert task is not None
        await asyncio.wait_for(task, 1)  # a chain of moves would not end (a RecursionError at best)
        assert moves == [frozenset("a"), frozenset("ab")] and not resharding._again

    asyncio.run(main())
