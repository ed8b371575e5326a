"""Shard leases: which replica reconciles which hash range of a controller — never two at once.

In sharded mode (``declop run --shards N``) the hash space ``[0, 2^64)`` of every controller is
split into ``N`` fixed ranges (:func:`declop.leases.hashing.split`; a key's range is
:func:`declop.leases.hashing.range_index` of its FNV-1a hash — the same rounding as the informers'
shardSelector, so a range's Lease guards exactly the objects its selector returns). Each
range has one ``coordination.k8s.io/v1`` Lease, ``<id>-<controller>-shard-<i>-of-<n>``, taken,
renewed and released with exactly the protocol and fencing of leader election
(:class:`~declop.leases.leader.LeaderElector`, one per range): a worker starts a reconcile for a key only
while the Lease of the key's range is *known valid on our own monotonic clock*
(``clock() < renewed_at + renew_deadline``, the last successful renewal measured from before its
request was sent); another replica takes a range only after it saw the range's record unchanged
for ``leaseDurationSeconds`` > ``renew_deadline``.

Membership: every replica also holds one Lease of its own per controller,
``<id>-<controller>-of-<n>-member-<suffix>`` — created only once that controller's caches
synced (:attr:`ShardSet.synced`: a replica whose informers never sync, e.g. refused with 403,
joins nothing and takes no range, so the others keep its share). Live replicas of a controller
are the members of the same controller *and* the same ``n`` whose record changed within its
``leaseDurationSeconds`` as observed on our clock (plus ourselves): another operator sharing
``--leader-election-id``, or a replica with another ``--shards`` during a rolling change, is not
counted (it would shrink our share and leave ranges to nobody) — its member Leases are logged
once per kind. Members are needed because a replica holding no range yet is invisible in the
range Leases: without its member Lease nobody would make room for it. One LIST of the
namespace's Leases per retry period serves both the member count and the observations of the
ranges we do not hold.

Renewal runs on its own, every ``retry_period`` (:meth:`ShardLeases.renew`): every held range
and member Lease at once, each bounded by ``renew_deadline / 2`` — never behind the round's
LIST, tries or member deletions.

Balancing, every ``retry_period`` (:meth:`ShardLeases.balance`): each replica aims at
``ceil(N / live)`` ranges. Under its share it tries ranges that are free (released, or never
created) or whose holder is not a live member (the elector takes one only once its record is expired). Over its share it **drains**
the excess ranges (highest index first): no new reconcile starts for their keys, in-flight ones
finish, and only then is the Lease released — so the next owner never overlaps with us. A
graceful stop drains every range the same way (the manager stops the controllers first), then
releases the range Leases and deletes the member Leases.

Loss (no successful renewal for ``renew_deadline``, another holder seen — e.g. after a
SIGSTOP —, or the Lease deleted): the range's fence closes at once and its keys are dropped. A lost range whose record
still names us (nobody took it: an apiserver outage past the renew deadline hits every replica
alike) is taken again at the next round whatever the share — the other replicas see a live
holder and would never take it — and drained if over the share. When a reconcile of a lost
range is still running (it cannot be stopped: a plain handler runs in a thread), :attr:`failed`
is set, :meth:`ShardLeases.run` returns at once (abandoning the rest of its round) and the
manager exits non-zero, as after a lost leader Lease.

Invariants:

- :meth:`ShardSet.may_start` is True only while the range's elector is ``valid()`` and the range
  is not draining; a closed fence of a range reopens only after a *new* acquisition;
- a range is released only when no reconcile of it is in flight;
- Lease traffic uses the transport's ``"leader"`` lane, like leader election;
- a range Lease is never renewed and released at once (one lock per Lease);
- another ``--shards`` of the same controller (range Leases ``-of-<m>`` held by a live replica):
  no range is taken while one is held; if both splits hold ranges, the one with more ranges
  drains all of its own (so a rolling change ends with every range of one split owned);
- timings are validated like leader election's: ``lease_duration > renew_deadline > 1.2 ×
  retry_period > 0``.
"""

# size: one protocol — members, renewals, balancing, drains, losses — whose invariants refer to
# each other; the pure parts (hashing, the plan) are already apart.

from __future__ import annotations

import asyncio
import collections
import logging
import math
import re
import socket
import uuid
from typing import Any, Callable, Iterable

from declop.clock import LEASE_CLOCK, WALL_CLOCK, Clock
from declop.errors import ApiError, NotFound
from declop.leases.leader import LEASE_TIMINGS, LeaderElector, LeaseTimings
from declop.leases.hashing import ShardRange, fnv1a64, range_index, split

__all__ = ["ShardLeases", "ShardSet", "lease_name", "member_prefix", "plan"]

log = logging.getLogger("declop.shardlease")

#: a member Lease unrenewed for this many of its durations is deleted by the other replicas
FORGET_AFTER = 10
_RANGE = re.compile(r"-shard-\d+-of-\d+$")  # the end of a range Lease's name

def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def lease_name(lease_id: str, controller: str, index: int, n: int) -> str:
    """The range Lease's name: ``<id>-<controller>-shard-<i>-of-<n>`` (DNS-safe)."""
    return f"{_dns(lease_id)}-{_dns(controller)}-shard-{index}-of-{n}"


def member_prefix(controller_prefix: str, n: int) -> str:
    """``<id>-<controller>-of-<n>-member-``: replicas count only the members of their own
    controller and ``n`` (another operator under the same id, or a replica with another
    ``--shards``, is not one that makes room or takes a share)."""
    return f"{controller_prefix}-of-{n}-member-"


def plan(held: Iterable[int], draining: Iterable[int], candidates: Iterable[int], live: int, n: int) -> tuple[list[int], list[int]]:
    """One balancing step: ``(to_drain, to_try)``.

    ``held`` ranges (``draining`` among them) count against the share ``ceil(n / live)``;
    the excess among the non-draining ones is drained, highest index first; under the share,
    ``candidates`` (free or not held by a live replica) are tried in order, as many as missing."""
    share = math.ceil(n / max(1, live))
    held, draining = set(held), set(draining)
    keep = sorted(held - draining)
    drain = keep[share:] if len(keep) > share else []
    missing = share - len(held)
    tries = [c for c in candidates if c not in held][: max(0, missing)]
    return drain, tries


class ShardSet:
    """The ranges of one controller on this replica: electors, drains, in-flight counts.

    The controller calls :meth:`range_of`, :meth:`may_start`, :meth:`begin` and :meth:`end`;
    :class:`ShardLeases` drives the Leases."""

    def __init__(self, controller: str, n: int, shard_by: str, electors: list[LeaderElector], member: LeaderElector | None = None) -> None:
        self.controller, self.n, self.shard_by = controller, n, shard_by
        self.electors = electors
        #: this replica's member Lease for this controller and this ``n``; held only once
        #: :attr:`synced` says so (others count it then, and make room for it)
        self.member = member
        #: have this controller's caches synced? (the manager: the controller's sync gate)
        #: until then the replica joins nothing and takes no range: it could not reconcile them
        self.synced: Callable[[], bool] = lambda: True
        #: the ranges, by index (:func:`declop.leases.hashing.split`)
        self.ranges: tuple[ShardRange, ...] = split(n)
        #: ranges being drained: no reconcile starts for their keys; released once idle
        self.draining: set[int] = set()
        #: ranges we created and hold whose fence has not opened yet (queued once it does)
        self.opening: set[int] = set()
        #: range -> reconciles of its keys in flight
        self.in_flight: collections.Counter[int] = collections.Counter()
        #: called with a range index once it is ours (the controller queues its keys)
        self.on_gained: Callable[[int], None] | None = None
        #: called with a range index once it is not ours any more (released or lost)
        self.on_dropped: Callable[[int], None] | None = None
        self.warned = False  # logged that another split of the hash space is in use

    @property
    def member_prefix(self) -> str:
        """The name prefix of every replica's member Lease of this controller and this ``n``."""
        return member_prefix(self.electors[0].name.split("-shard-")[0], self.n) if self.electors else ""

    def index(self, value: str) -> int:
        """The range ``value`` (a uid or a namespace) hashes into."""
        return range_index(fnv1a64(value), self.n)

    def held(self) -> list[int]:
        return [i for i, e in enumerate(self.electors) if e.is_leader]

    def may_start(self, index: int) -> bool:
        """The fence: may a reconcile of a key of range ``index`` start now?"""
        return index not in self.draining and self.electors[index].valid()

    def begin(self, index: int) -> None:
        self.in_flight[index] += 1

    def end(self, index: int) -> None:
        self.in_flight[index] -= 1
        if self.in_flight[index] <= 0:
            del self.in_flight[index]


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
        #: every member Lease under our id starts with this (any controller, any ``n``)
        self.members_prefix = f"{_dns(lease_id)}-"
        self.sets: dict[str, ShardSet] = {}
        #: set when a range was lost while a reconcile of it ran: the manager exits non-zero
        self.failed = asyncio.Event()
        self.stopping = False
        #: live replicas as last counted (ourselves included; of the controller with the most)
        self.live = 1
        self._members: dict[str, tuple[Any, float]] = {}  # member Lease -> (record, first seen)
        #: another split's range Lease -> (record, first seen): one unchanged for long holds nothing
        self._splits: dict[str, tuple[Any, float]] = {}
        self._live_names: set[str] = set()
        self._foreign: set[str] = set()  # member prefixes of other controllers / splits, logged
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
        live_holders = self._count_members(leases)
        self.live = max((self._live(s) for s in self.sets.values()), default=1)
        for s in self.sets.values():
            for i, e in enumerate(s.electors):
                spec = leases.get(e.name)
                if spec is not None and not e.is_leader:
                    e.observe(spec)
                elif spec is None:  # every missing range's wait starts now, tried or not
                    e.missing(sent)
            released = set()
            for i in sorted(s.draining):
                if not s.in_flight[i]:
                    await self._release(s, i)
                    released.add(i)
            if not balance or self.stopping or self.failed.is_set() or not s.synced():
                continue  # a failed replica is exiting: it takes nothing, not even its own again
            live = self._live(s)
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
            other, their_n = self._other_split(s, leases, live_holders)
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
        await self._collect(leases)

    def _other_split(self, s: ShardSet, leases: dict[str, dict[str, Any]], live: set[Any]) -> tuple[str, int]:
        """A range Lease of this controller for another number of ranges, held by a live
        replica, and that number (``("", 0)`` if none): its ranges overlap ours, so we must not
        take any (a rolling change of ``--shards``: the new replicas wait for the old ones to
        stop; two splits that both hold ranges: the larger gives way).

        Held means renewed: a record that has not changed for a lease duration on our clock
        (a renew deadline more when its split is the smaller one) holds nothing, whoever it
        names — its holder's fence closed a renew deadline after its last renewal. Without this,
        records lost by live replicas (a pause, slow requests past the renew deadline) kept both
        splits waiting for each other for ever, every range unowned (``rolling`` seeds 2631,
        3345, 6662, 9309). The smaller split takes first: by the time the larger one would, the
        smaller one's records change again (every retry period) and it keeps giving way. Not two
        lease durations: a replica that just started counts from its first LIST, and that long
        left a newcomer's share unowned past I7's bound (``rolling`` seed 8725)."""
        prefix, own = s.electors[0].name.split("-shard-")[0] + "-shard-", f"-of-{s.n}"
        now = self.clock()
        found: tuple[str, int] = ("", 0)
        for name, spec in leases.items():
            if not name.startswith(prefix) or name.endswith(own) or _RANGE.search(name) is None:
                continue
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            old = self._splits.get(name)
            if old is None or old[0] != record:
                self._splits[name] = old = (record, now)
            if found[0] or record[0] not in live:
                continue
            n_text = name.rsplit("-of-", 1)[1]
            n = int(n_text) if n_text.isdigit() else 0
            duration = float(record[2] or self.lease_duration)
            if now < old[1] + duration + (self.renew_deadline if s.n > n else 0.0):
                found = (name, n)
        for name in set(self._splits) - set(leases):
            del self._splits[name]
        return found

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
        self._handover(s, "acquired", i, replicas=self._live(s))
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

    async def _collect(self, leases: dict[str, dict[str, Any]]) -> None:
        """Delete member Leases nobody renewed for :data:`FORGET_AFTER` lease durations (replicas
        killed or gone without a graceful stop), so restarts do not pile them up."""
        now = self.clock()
        for name, (record, since) in list(self._members.items()):
            duration = float(record[2] or self.lease_duration)
            if now < since + FORGET_AFTER * duration:
                continue
            del self._members[name]
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
        if s.in_flight[i]:
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
            if s.in_flight[i]:
                return  # still draining: released by a later round, once its calls ended
            await s.electors[i].release()
        s.draining.discard(i)
        s.opening.discard(i)
        self._handover(s, "released", i)

    async def _request(self, method: str, path: str) -> Any:
        timeout = self.renew_deadline / 2
        return await asyncio.wait_for(self.transport.request(method, path, timeout=timeout, lane="leader"), timeout)

    async def _list(self) -> dict[str, dict[str, Any]]:
        answer = await self._request("GET", self._path)
        return {
            (item.get("metadata") or {}).get("name", ""): item.get("spec") or {}
            for item in (answer or {}).get("items") or ()
        }

    def _count_members(self, leases: dict[str, dict[str, Any]]) -> set[Any]:
        """Note every member Lease under our id (any controller, any ``n``); the live ones are
        those whose record changed within its ``leaseDurationSeconds`` on our clock. Returns the
        identities of the live members (ourselves included): a range they hold is not free."""
        now = self.clock()
        live: set[str] = set()
        seen = set()
        ours = {s.member.name for s in self.sets.values() if s.member is not None}
        holders: set[Any] = {self.identity}
        for name, spec in leases.items():
            if not name.startswith(self.members_prefix) or "-member-" not in name or name in ours or _RANGE.search(name):
                continue  # not a member Lease (a controller's name may hold "-member-")
            seen.add(name)
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            old = self._members.get(name)
            if old is None or old[0] != record:
                self._members[name] = old = (record, now)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if record[0] and now < old[1] + duration:
                live.add(name)
                holders.add(record[0])
        for name in set(self._members) - seen:
            del self._members[name]
        self._live_names = live
        self._note_foreign(live)
        return holders

    def _live(self, s: ShardSet) -> int:
        """Live replicas of ``s``'s controller with ``s``'s ``n`` (ourselves included)."""
        prefix = s.member_prefix
        return 1 + sum(1 for name in self._live_names if name.startswith(prefix))

    def _note_foreign(self, live: set[str]) -> None:
        """Log once per kind of member Lease under our id that is not of our controllers and
        ``n``: another operator shares ``--leader-election-id``, or replicas disagree on
        ``--shards`` (each side then counts only its own kind)."""
        own = {s.member_prefix for s in self.sets.values()}
        for name in live:
            prefix = name.rsplit("-member-", 1)[0] + "-member-"
            if prefix in own or prefix in self._foreign:
                continue
            self._foreign.add(prefix)
            log.warning(
                "Another operator, or a replica with another --shards, shares this --leader-election-id; "
                "counting only the replicas of the same controller and --shards",
                extra={"kv": {"theirs": prefix.removeprefix(self.members_prefix)[: -len("-member-")], "ours": sorted(f"{c}-of-{s.n}" for c, s in self.sets.items())}},
            )

    # -- stop -----------------------------------------------------------------------------------
    def busy(self) -> list[tuple[str, int]]:
        """(controller, range) of every held range with a reconcile still in flight: what
        :meth:`release_all` leaves to expire. A stop that leaves one is a loss under a running
        call — the process must be gone before another replica can take the range, so the
        manager exits within 2 s, as after a loss (its releases and deletes, 5 s each under a
        partition, must not keep the call's thread alive past the Lease's expiry)."""
        return [(s.controller, i) for s in self.sets.values() for i in s.held() if s.in_flight[i]]

    async def release_all(self) -> None:
        """Release every idle range Lease we hold and delete our member Lease. A range with a
        reconcile still in flight (a plain handler's thread outlived the grace period) is left
        to expire, with one log line (invariant I6) — before the first request, so a caller
        that bounds this (the manager, after :meth:`busy`) has the fence closed at once."""
        self.stopping = True
        for s in self.sets.values():
            busy = [i for i in s.held() if s.in_flight[i]]
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
