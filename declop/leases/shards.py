"""Shard leases: which replica reconciles which hash range of a controller — never two at once.

In sharded mode (``declop run --shards N``) every controller's hash space is split into ``N``
fixed ranges (:mod:`declop.leases.ranges`), each with one ``coordination.k8s.io/v1`` Lease taken,
renewed and released with the protocol and fence of leader election (one
:class:`~declop.leases.leader.LeaderElector` per range). Every replica also holds a member Lease
per controller once that controller's caches synced, so that a replica holding no range yet is
counted (:mod:`declop.leases.members`). :class:`ShardLeases` runs two loops, each every
``retry_period``: :meth:`ShardLeases.renew` renews every held Lease at once, and
:meth:`ShardLeases.balance` reads every Lease with one LIST, counts the live replicas and takes,
drains and releases ranges toward ``ceil(N / live)``. The protocol, round by round, and why it
keeps two replicas from reconciling one key: docs/leases.md.

Invariants:

- a worker starts a reconcile of a key only while :meth:`ShardSet.may_start` of its range: the
  range's elector is ``valid()`` on our own clock and the range is not draining; a closed fence
  reopens only after a *new* acquisition;
- a range is released only when no reconcile of it is in flight; a drained range stays draining
  until its Lease is released;
- a renewal never waits behind a round's LIST, tries or deletions, and a range Lease is never
  renewed and released at once (one lock per Lease);
- a range lost while a reconcile of it runs sets :attr:`ShardLeases.failed`: :meth:`ShardLeases.run`
  returns at once and the manager exits non-zero;
- a lost range whose record still names us is taken back at the next round, whatever the share;
- while a live replica of another split of the controller holds a range, we take none; if both
  splits hold ranges, the one with more ranges drains all of its own;
- Lease traffic uses the transport's ``"leader"`` lane; timings are validated like leader
  election's: ``lease_duration > renew_deadline > 1.2 × retry_period > 0``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any, Callable

from declop.clock import LEASE_CLOCK, WALL_CLOCK, Clock
from declop.errors import ApiError, NotFound
from declop.leases.leader import LEASE_TIMINGS, LeaderElector, LeaseTimings
from declop.leases.members import Members
from declop.leases.ranges import ShardSet as ShardSet
from declop.leases.ranges import lease_name as lease_name
from declop.leases.ranges import member_prefix as member_prefix
from declop.leases.ranges import plan as plan

__all__ = ["ShardLeases", "ShardSet", "lease_name", "member_prefix", "plan"]

log = logging.getLogger("declop.shardlease")


class ShardLeases:
    """The member Lease and every controller's :class:`ShardSet` of one replica."""

    def __init__(
        self,
        transport: Any,
        *,
        lease_id: str,
        namespace: str,
        lease_duration: float = LEASE_TIMINGS.lease_duration,
        renew_deadline: float = LEASE_TIMINGS.renew_deadline,
        retry_period: float = LEASE_TIMINGS.retry_period,
        clock: Clock = LEASE_CLOCK,
        metrics: Any = None,
        identity: str | None = None,
        on_round: Callable[[], None] | None = None,
        wall_clock: Clock = WALL_CLOCK,
    ) -> None:
        LeaseTimings(lease_duration, renew_deadline, retry_period).check("sharding")
        self.transport, self.namespace, self.lease_id = transport, namespace, lease_id
        suffix = uuid.uuid4().hex[:10]
        self.identity = identity or f"{socket.gethostname()}_{suffix}"
        self.timings = dict(lease_duration=lease_duration, renew_deadline=renew_deadline, retry_period=retry_period)
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.clock = clock
        self.wall_clock = wall_clock
        self.metrics = metrics
        #: called after every round (the manager moves the informers' shard filters in a task
        #: of its own: a re-list never delays a renewal)
        self.on_round = on_round
        #: the end of this replica's member Lease names (one per controller)
        self.suffix = suffix
        self.sets: dict[str, ShardSet] = {}
        #: set when a range was lost while a reconcile of it ran: the manager exits non-zero
        self.failed = asyncio.Event()
        self.stopping = False
        #: live replicas as last counted (ourselves included; of the controller with the most)
        self.live = 1
        #: the member and other-split records seen in each round's LIST
        self.members = Members(lease_id, self.identity, lease_duration=lease_duration, renew_deadline=renew_deadline, clock=clock)
        self._locks: dict[str, asyncio.Lock] = {}  # Lease name -> held while renewed / released
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _elector(self, name: str, exclusive: bool = True) -> LeaderElector:
        e = LeaderElector(self.transport, name=name, namespace=self.namespace, identity=self.identity, clock=self.clock, wall_clock=self.wall_clock, exclusive=exclusive, **self.timings)  # type: ignore[arg-type]
        e.release_level = logging.DEBUG
        return e

    def add(self, controller: str, n: int, shard_by: str) -> ShardSet:
        """The ranges of ``controller`` (``n`` of them, keys hashed by ``shard_by``)."""
        electors = [self._elector(lease_name(self.lease_id, controller, i, n)) for i in range(n)]
        s = self.sets[controller] = ShardSet(controller, n, shard_by, electors)
        # only this replica ever holds its member Lease: deleted, it is created again at once
        s.member = self._elector(f"{s.member_prefix}{self.suffix}", exclusive=False)
        self._gauge(s)
        return s

    @property
    def member(self) -> LeaderElector:
        """The member Lease of the first controller (all of them are renewed alike)."""
        s = next(iter(self.sets.values()))
        assert s.member is not None
        return s.member

    def problem(self) -> str:
        """Why a member Lease was refused (401/403: this replica can never own a range), or ""."""
        return next((s.member.problem for s in self.sets.values() if s.member is not None and s.member.problem), "")

    def _lock(self, e: LeaderElector) -> asyncio.Lock:
        lock = self._locks.get(e.name)
        if lock is None:
            lock = self._locks[e.name] = asyncio.Lock()
        return lock

    # -- metrics --------------------------------------------------------------------------------
    def _gauge(self, s: ShardSet) -> None:
        if self.metrics is not None:
            self.metrics.shard_ranges.labels(s.controller).set(len(s.held()))

    def _handover(self, s: ShardSet, kind: str, index: int, **pairs: Any) -> None:
        if self.metrics is not None:
            self.metrics.shard_handovers.labels(s.controller, kind).inc()
        self._gauge(s)
        level = logging.ERROR if kind == "lost" else logging.INFO
        log.log(
            level,
            {"acquired": "Acquired shard", "released": "Released shard", "lost": "Shard lease lost"}[kind],
            extra={"kv": {"controller": s.controller, "shard": f"{index}/{s.n}", "identity": self.identity, **pairs}},
        )

    # -- the loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Renew every held Lease every ``retry_period`` (:meth:`renew`) and, beside it, count
        members and balance every ``retry_period`` (:meth:`balance`) — until cancelled or failed.

        The two loops are independent: a round's LIST, tries and collect (each may wait
        ``renew_deadline / 2``) never delay a renewal, which starts every ``retry_period`` (or
        as soon as the previous one, bounded by ``renew_deadline / 2``, ended)."""
        log.info(
            "Sharding: joining",
            extra={"kv": {"identity": self.identity, "namespace": self.namespace, "controllers": {k: s.n for k, s in self.sets.items()}}},
        )
        # the loops race the failure: once a range is lost under a running call, the process
        # must be gone before another replica can take the range, so both loops are abandoned
        # and the manager's halt starts at once
        loops = [asyncio.ensure_future(self._every_period(self.renew)), asyncio.ensure_future(self._balancing())]
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            done, _ = await asyncio.wait([*loops, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*loops, failed):
                task.cancel()
            await asyncio.gather(*loops, failed, return_exceptions=True)
        for task in loops:
            if task in done and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]  # a bug: the manager logs it and exits

    async def _every_period(self, step: Callable[[], Any]) -> None:
        """``await step()`` every ``retry_period`` on a fixed cadence (a slow one does not
        stretch the time between the next ones), logging what fails."""
        while not self.failed.is_set():
            began = self.clock()
            try:
                await step()
            except (ApiError, asyncio.TimeoutError) as exc:
                log.warning("Shard lease round failed", extra={"kv": {"error": str(exc) or type(exc).__name__}})
            await asyncio.sleep(max(0.0, began + self.retry_period - self.clock()))

    async def _balancing(self) -> None:
        first = [True]

        async def one() -> None:
            balance, first[0] = not first[0], False  # one round to see the members before taking
            await self.balance(balance)

        await self._every_period(one)

    async def step(self, balance: bool = True) -> None:
        """One renewal and one balancing round, one after the other (tests drive replicas so)."""
        await self.renew()
        await self.balance(balance)

    async def renew(self) -> None:
        """Renew every held range Lease and the member Lease of every synced controller, all at
        once; a Lease being released (or renewed still) is left alone."""
        todo: list[Any] = []
        for s in self.sets.values():
            if s.member is not None and (s.member.is_leader or s.synced()):
                todo.append(self._renew(s.member, None))
            todo += [self._renew(s.electors[i], s) for i in s.held()]
        await asyncio.gather(*todo)

    async def balance(self, balance: bool = True) -> None:
        """One round: read every Lease once, count the members, then release drained ranges and
        take or drain toward the share."""
        sent = self.clock()
        leases = await self._list()
        live_holders = self.members.count(leases, self.sets.values())
        self.live = max((self.members.live(s) for s in self.sets.values()), default=1)
        for s in self.sets.values():
            for i, e in enumerate(s.electors):
                spec = leases.get(e.name)
                if spec is not None and not e.is_leader:
                    e.observe(spec)
                elif spec is None:  # every missing range's wait starts now, tried or not
                    e.missing(sent)
            released = set()
            for i in sorted(s.draining):
                if not s.busy(i):
                    await self._release(s, i)
                    released.add(i)
            if not balance or self.stopping or self.failed.is_set() or not s.synced():
                continue  # a failed replica is exiting: it takes nothing, not even its own again
            live = self.members.live(s)
            candidates, ours = [], []
            for i, e in enumerate(s.electors):
                spec = leases.get(e.name)
                holder = (spec or {}).get("holderIdentity") or ""
                if holder == self.identity and not e.is_leader and i not in released:
                    # lost (e.g. an apiserver outage past the renew deadline) yet nobody took it:
                    # the others see a live holder and never will, so it is ours to take again
                    # (and to drain if over the share), or it would stay unowned for ever
                    ours.append(i)
                elif not holder or holder not in live_holders:
                    candidates.append(i)
            drain, tries = plan(s.held(), s.draining, candidates, live, s.n)
            tries = ours + tries  # candidates never include ours
            other, their_n = self.members.other_split(s, leases, live_holders)
            if other:
                if not s.warned:
                    s.warned = True
                    log.warning(
                        "Replicas disagree on --shards (a rolling change, or another operator with the same "
                        "--leader-election-id): the larger number of ranges gives way; taking no range while the other split holds one",
                        extra={"kv": {"controller": s.controller, "shards": s.n, "otherShards": their_n, "lease": other}},
                    )
                tries = []
                if s.n > their_n:  # both splits hold ranges (they started together): ours give way
                    drain = [i for i in s.held() if i not in s.draining]
            for i in drain:
                s.draining.add(i)
                log.info("Draining shard", extra={"kv": {"controller": s.controller, "shard": f"{i}/{s.n}", "replicas": live}})
                if s.on_dropped is not None:
                    s.on_dropped(i)
            await asyncio.gather(*(self._try(s, i) for i in tries))
        if self.on_round is not None:
            self.on_round()
        await self._collect()

    async def _try(self, s: ShardSet, i: int) -> None:
        """One attempt to take range ``i`` (the elector takes it only if free or expired)."""
        e = s.electors[i]
        try:
            if not await e.try_acquire_or_renew():
                return
        except ApiError as exc:
            log.warning("Could not take shard", extra={"kv": {"controller": s.controller, "shard": f"{i}/{s.n}", "error": str(exc)}})
            return
        if self.stopping:  # a stop began while the request was in flight: give it back at once
            await e.release()
            return
        e.won()
        s.draining.discard(i)
        self._handover(s, "acquired", i, replicas=self.members.live(s))
        self._opened(s, i)

    @staticmethod
    def _opened(s: ShardSet, i: int) -> None:
        """Range ``i`` is ours: once its fence is open (a range we created opens only a renew
        deadline later, :attr:`LeaderElector.opening`), the controller queues its keys — not
        before, or the fence would drop them."""
        e = s.electors[i]
        if e.opening:
            s.opening.add(i)
            return
        s.opening.discard(i)
        if s.on_gained is not None:
            s.on_gained(i)

    async def _collect(self) -> None:
        """Delete the member Leases :meth:`Members.forgotten` gives (replicas killed or gone
        without a graceful stop), so restarts do not pile them up."""
        for name in self.members.forgotten():
            try:
                await self._request("DELETE", f"{self._path}/{name}")
                log.info("Deleted the member lease of a replica gone for long", extra={"kv": {"lease": f"{self.namespace}/{name}"}})
            except (ApiError, asyncio.TimeoutError):
                pass  # someone else did, or will

    async def _renew(self, e: LeaderElector, s: ShardSet | None) -> None:
        lock = self._lock(e)
        if lock.locked():
            return  # being released, or its last renewal is still out (bounded by its timeout)
        async with lock:
            await self._renew_locked(e, s)

    async def _renew_locked(self, e: LeaderElector, s: ShardSet | None) -> None:
        if not e.is_leader:
            if s is None:  # the member Lease: (re)join
                try:
                    if await e.try_acquire_or_renew():
                        e.won()
                except ApiError as exc:
                    log.warning("Could not renew member lease", extra={"kv": {"error": str(exc)}})
            return
        assert e.renewed_at is not None
        if not e.live():
            return self._lost(e, s, f"no successful renewal for {self.clock() - e.renewed_at:.3g} s")
        try:
            if await e.try_acquire_or_renew(e.renewed_at + e.renew_deadline):
                if not e.live():
                    return self._lost(e, s, "the renewal came back after the renew deadline")
                if s is not None and s.opening:
                    i = s.electors.index(e)
                    if i in s.opening:
                        self._opened(s, i)
                return
            if e.gone:
                return self._lost(e, s, "the Lease was deleted")
            if e.holder and e.holder != self.identity:
                return self._lost(e, s, f"the Lease is held by {e.holder}")
        except ApiError as exc:
            log.warning("Failed to renew lease", extra={"kv": {"lease": f"{e.namespace}/{e.name}", "error": str(exc)}})
        if not e.live():
            self._lost(e, s, f"no successful renewal for {self.clock() - e.renewed_at:.3g} s")

    def _lost(self, e: LeaderElector, s: ShardSet | None, why: str) -> None:
        e.lose(why, quiet=s is not None)
        if s is None:
            log.warning("Member lease lost; joining again", extra={"kv": {"reason": why}})
            return
        i = s.electors.index(e)
        s.draining.discard(i)
        s.opening.discard(i)
        self._handover(s, "lost", i, reason=why, inFlight=s.in_flight[i])
        if s.on_dropped is not None:
            s.on_dropped(i)
        if s.busy(i):  # a call runs, or ended past the renew deadline: it ran when the Lease lapsed
            s.overran.discard(i)
            log.error(
                "A reconcile of a lost shard is still running; exiting so it cannot overlap with the next owner",
                extra={"kv": {"controller": s.controller, "shard": f"{i}/{s.n}"}},
            )
            self.failed.set()

    async def _release(self, s: ShardSet, i: int) -> None:
        """Release a drained range. It stays draining (its fence shut to new calls) until the
        Lease is released: waiting for the lock (a renewal of it is out) must not reopen it, or
        a call could start in that window and run under a released Lease (I6)."""
        async with self._lock(s.electors[i]):  # not while a renewal of it is out
            if not s.electors[i].is_leader:
                s.draining.discard(i)
                return  # lost meanwhile
            if s.busy(i):
                return  # still draining (released once its calls ended), or lost under a call
            await s.electors[i].release()
        s.draining.discard(i)
        s.opening.discard(i)
        self._handover(s, "released", i)

    async def _request(self, method: str, path: str) -> Any:
        """One Lease request, bounded by half the renew deadline (``TimeoutError``). With
        ``asyncio.timeout``: ``wait_for`` on Python 3.11 can drop a cancellation (leader.py)."""
        timeout = self.renew_deadline / 2
        async with asyncio.timeout(timeout):
            return await self.transport.request(method, path, timeout=timeout, lane="leader")

    async def _list(self) -> dict[str, dict[str, Any]]:
        answer = await self._request("GET", self._path)
        return {
            (item.get("metadata") or {}).get("name", ""): item.get("spec") or {}
            for item in (answer or {}).get("items") or ()
        }

    # -- stop -----------------------------------------------------------------------------------
    def busy(self) -> list[tuple[str, int]]:
        """(controller, range) of every held range with a reconcile still in flight: what
        :meth:`release_all` leaves to expire. A stop that leaves one is a loss under a running
        call — the process must be gone before another replica can take the range, so the
        manager exits within 2 s, as after a loss (its releases and deletes, 5 s each under a
        partition, must not keep the call's thread alive past the Lease's expiry)."""
        return [(s.controller, i) for s in self.sets.values() for i in s.held() if s.busy(i)]

    async def release_all(self) -> None:
        """Release every idle range Lease we hold and delete our member Lease. A range with a
        reconcile still in flight (a plain handler's thread outlived the grace period) is left
        to expire, with one log line (invariant I6) — before the first request, so a caller
        that bounds this (the manager, after :meth:`busy`) has the fence closed at once."""
        self.stopping = True
        for s in self.sets.values():
            busy = [i for i in s.held() if s.busy(i)]
            if busy:
                for i in busy:
                    s.electors[i].lose("a reconcile of it still runs", quiet=True)  # the fence closes
                log.warning(
                    "Leaving shard leases to expire: reconciles of them still run",
                    extra={"kv": {"controller": s.controller, "shards": [f"{i}/{s.n}" for i in busy], "expiresIn": self.lease_duration}},
                )
            for i in s.held():
                await self._release(s, i)
        for s in self.sets.values():
            if s.member is None or not (s.member.is_leader or s.member.renewed_at is not None):
                continue  # never joined (its caches never synced)
            try:
                await self._request("DELETE", f"{self._path}/{s.member.name}")
            except (ApiError, asyncio.TimeoutError) as exc:
                if not isinstance(exc, NotFound):
                    log.warning("Could not delete member lease", extra={"kv": {"error": str(exc)}})
