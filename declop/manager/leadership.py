"""The Lease tasks of one manager, and what a loss does.

- :class:`LeaderLease`: once every cache synced, acquire the leader Lease, open the
  controllers' gate, renew it until the stop cancels it (only after the drain).
- :class:`RangeLeases`: sharded mode: hold and balance the range Leases; :class:`Resharding`
  moves the informers' shard filters after each round.
- :class:`BackgroundLease`: sharded mode has no leader, yet a leader-only background task runs
  on one replica at a time: the holder of the Lease named ``leader_election_id``.

A lost leader Lease, or a range lost under a running reconcile (:func:`after_loss`): intake
stops at once, no drain — another replica may already reconcile — the exit status is 1, and the
rest of the stop shares the loss's budget (:mod:`declop.manager.loss`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

from declop.kube.kubeconfig import pod_namespace
from declop.leases.hashing import ShardRange
from declop.leases.leader import LeaderElector
from declop.manager.loss import LOST_CLEANUP_SECONDS
from declop.manager.runnables import Task

__all__ = ["BACKGROUND", "LEADER_ONLY_BACKGROUND", "BackgroundLease", "LeaderLease", "RangeLeases", "Resharding", "after_loss"]

log = logging.getLogger("declop.manager")

#: the runnables that start background tasks (every replica's, and the leader-only ones)
BACKGROUND = "background tasks"
LEADER_ONLY_BACKGROUND = "leader-only background tasks"


async def after_loss(m: Any, *, leader_only_background: bool) -> None:
    """A Lease was lost: exit 1, stop intake now, cancel the workers (and the leader-only
    background tasks) within the budget, then ask the manager to stop."""
    m.lose()
    for c in m.controllers:
        c.halt()  # intake stops now, before any await
    stopping: list[Coroutine[Any, Any, Any]] = [c.stop(0) for c in m.controllers]
    if leader_only_background:
        m.group.cancel([BACKGROUND, LEADER_ONLY_BACKGROUND])
        if m.lifecycle is not None:
            stopping.append(m.lifecycle.stop_background(grace=0, leader_only=True, settle=min(0.5, m.loss.left())))
    await m.loss.bounded(asyncio.gather(*stopping), LOST_CLEANUP_SECONDS, "stopping the workers after the loss")
    m.request_stop()


class LeaderLease:
    """Acquire the Lease, let the workers start, hold it; on loss stop reconciling at once."""

    name = "leader election"
    leader_only = False

    def __init__(self, manager: Any) -> None:
        self.m = manager

    async def run(self) -> None:
        m = self.m
        assert m.elector is not None and m.leadership is not None
        try:
            # campaign only once every cache synced, as a range is taken only then
            # (ShardSet.synced): a replica whose caches never sync (a 403 on a watched resource)
            # would otherwise hold the Lease for ever and reconcile nothing, while a synced
            # standby waits behind it
            await asyncio.gather(*(c.synced.wait() for c in m.controllers))
            await m.elector.acquire()
            m.leadership.set()
            await m.elector.hold()
        except Exception:  # a bug in leader election must not leave a leader without renewals
            log.exception("Leader election failed; stopping", extra={"kv": {"lease": m.options.leader_election_id}})
            m.elector.lose("leader election failed")
        await after_loss(m, leader_only_background=True)


class RangeLeases:
    """Hold and balance the range Leases; when a range is lost under a running reconcile, stop
    reconciling at once and exit 1 (as after a lost leader Lease)."""

    name = "shard leases"
    leader_only = False

    def __init__(self, manager: Any) -> None:
        self.m = manager

    async def run(self) -> None:
        assert self.m.shard_leases is not None
        try:
            await self.m.shard_leases.run()
        except Exception:  # a bug in the Lease loop must not leave ranges held without renewals
            log.exception("Shard leases failed; stopping")
        await after_loss(self.m, leader_only_background=False)


class Resharding:
    """After a Lease round: every sharded informer caches the union of the ranges its
    controllers hold (draining ones included: their in-flight reconciles read the cache). A
    gained range is re-listed (its objects arrive as additions and are queued); a released one
    leaves the cache without deletions. At most one move runs at a time; a round while one runs
    makes it run once more."""

    name = "shard filters"

    def __init__(self, manager: Any) -> None:
        self.m = manager
        self._again = False

    def want(self) -> None:
        """The shard Leases' ``on_round``."""
        if self.m.group.running(self.name):
            self._again = True
            return
        self._again = False
        self.m.group.start(Task(self.name, self._move))

    async def _move(self) -> None:
        for informer, sets in self.m.sharded.items():
            wanted: set[ShardRange] = set()
            for s in sets:
                wanted.update(s.ranges[i] for i in s.held())
            assert informer.shard is not None
            if set(informer.shard.ranges) == set(informer.shard.with_ranges(wanted).ranges):
                continue
            try:
                change = await informer.set_shard(wanted)
                for c in self.m.controllers:
                    if c.shards in sets:
                        c.forget(informer, change.released)
                if wanted:
                    # an informer that owned nothing was never started (Informer.start returns
                    # at once for empty ranges) and set_shard restarts only a running one
                    informer.start()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("Could not change the shard ranges of an informer", extra={"kv": {"informer": informer.name}})
        if self._again:
            self._again = False
            await self._move()


class BackgroundLease:
    """Sharded mode: the leader-only background tasks run on the holder of the Lease named
    ``leader_election_id`` (leader election's own Lease, so a task stays single across a switch
    between the two modes), acquired, renewed and released exactly as in leader election. Lost:
    its tasks are cancelled at once (they are ``async def``) and this replica is a candidate
    again — the ranges and their reconciles are not affected. Renewed until the stop cancels it.
    The tasks' writes are fenced by this Lease (:meth:`~declop.lifecycle.Lifecycle.start_background`)."""

    name = "background lease"
    leader_only = False

    def __init__(self, manager: Any) -> None:
        self.m = manager

    async def run(self) -> None:
        m = self.m
        assert m.lifecycle is not None
        o = m.options
        while not m.stopping:
            e = m.background_elector = LeaderElector(
                m.transport, name=o.leader_election_id, namespace=o.leader_election_namespace or pod_namespace(),
                lease_duration=o.lease_duration, renew_deadline=o.renew_deadline, retry_period=o.retry_period,
                **m.clocks,
            )  # fmt: skip
            await e.acquire()
            if m.stopping or not e.valid():
                continue  # the stop releases it
            log.info("Holding the background lease; starting leader-only background tasks", extra={"kv": {"lease": f"{e.namespace}/{e.name}"}})
            m.lifecycle.start_background(every_replica=False, lease=(e.valid, f"{e.namespace}/{e.name}"))
            await e.hold()
            log.warning("Background lease lost; leader-only background tasks stopped", extra={"kv": {"lease": f"{e.namespace}/{e.name}"}})
            left = await m.lifecycle.stop_background(grace=0, leader_only=True)
            if left:  # a task that would not stop must not run twice: no new candidacy
                m.left_running += len(left)
                return
