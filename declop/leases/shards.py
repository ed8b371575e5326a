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

Membership: every replica also holds one Lease of its own, ``<id>-member-<suffix>``, renewed
with the ranges. Live replicas are the members whose record changed within its
``leaseDurationSeconds`` as observed on our clock (plus ourselves). Members are needed because a
replica holding no range yet is invisible in the range Leases: without its member Lease nobody
would make room for it. One LIST of the namespace's Leases per retry period serves both the
member count and the observations of the ranges we do not hold.

Balancing, every ``retry_period``: each replica aims at ``ceil(N / live)`` ranges. Under its
share it tries ranges that are free (released, or never created) or whose holder is not a live
member (the elector takes one only once its record is expired). Over its share it **drains**
the excess ranges (highest index first): no new reconcile starts for their keys, in-flight ones
finish, and only then is the Lease released — so the next owner never overlaps with us. A
graceful stop drains every range the same way (the manager stops the controllers first), then
releases the range Leases and deletes the member Lease.

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
- timings are validated like leader election's: ``lease_duration > renew_deadline > 1.2 ×
  retry_period > 0``.
"""

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
from declop.errors import ApiError, ConfigError, NotFound
from declop.leases.leader import LeaderElector
from declop.leases.hashing import ShardRange, fnv1a64, range_index, split

__all__ = ["ShardLeases", "ShardSet", "lease_name", "plan"]

log = logging.getLogger("declop.shardlease")

#: a member Lease unrenewed for this many of its durations is deleted by the other replicas
FORGET_AFTER = 10

def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def lease_name(lease_id: str, controller: str, index: int, n: int) -> str:
    """The range Lease's name: ``<id>-<controller>-shard-<i>-of-<n>`` (DNS-safe)."""
    return f"{_dns(lease_id)}-{_dns(controller)}-shard-{index}-of-{n}"


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

    def __init__(self, controller: str, n: int, shard_by: str, electors: list[LeaderElector]) -> None:
        self.controller, self.n, self.shard_by = controller, n, shard_by
        self.electors = electors
        #: the ranges, by index (:func:`declop.leases.hashing.split`)
        self.ranges: tuple[ShardRange, ...] = split(n)
        #: ranges being drained: no reconcile starts for their keys; released once idle
        self.draining: set[int] = set()
        #: range -> reconciles of its keys in flight
        self.in_flight: collections.Counter[int] = collections.Counter()
        #: called with a range index once it is ours (the controller queues its keys)
        self.on_gained: Callable[[int], None] | None = None
        #: called with a range index once it is not ours any more (released or lost)
        self.on_dropped: Callable[[int], None] | None = None
        self.warned = False  # logged that another split of the hash space is in use

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
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Clock = LEASE_CLOCK,
        metrics: Any = None,
        identity: str | None = None,
        on_round: Callable[[], None] | None = None,
        wall_clock: Clock = WALL_CLOCK,
    ) -> None:
        if not (lease_duration > renew_deadline > retry_period * 1.2 and retry_period > 0):
            raise ConfigError(
                "sharding needs lease_duration > renew_deadline > 1.2 × retry_period > 0, got "
                f"{lease_duration} / {renew_deadline} / {retry_period}"
            )
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
        self.member_prefix = f"{_dns(lease_id)}-member-"
        # only this replica ever holds its member Lease: deleted, it is created again at once
        self.member = self._elector(f"{self.member_prefix}{suffix}", exclusive=False)
        self.sets: dict[str, ShardSet] = {}
        #: set when a range was lost while a reconcile of it ran: the manager exits non-zero
        self.failed = asyncio.Event()
        self.stopping = False
        #: live replicas as last counted (ourselves included)
        self.live = 1
        self._members: dict[str, tuple[Any, float]] = {}  # member Lease -> (record, first seen)
        self._live_names: set[str] = set()
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _elector(self, name: str, exclusive: bool = True) -> LeaderElector:
        e = LeaderElector(self.transport, name=name, namespace=self.namespace, identity=self.identity, clock=self.clock, wall_clock=self.wall_clock, exclusive=exclusive, **self.timings)  # type: ignore[arg-type]
        e.release_level = logging.DEBUG
        return e

    def add(self, controller: str, n: int, shard_by: str) -> ShardSet:
        """The ranges of ``controller`` (``n`` of them, keys hashed by ``shard_by``)."""
        electors = [self._elector(lease_name(self.lease_id, controller, i, n)) for i in range(n)]
        s = self.sets[controller] = ShardSet(controller, n, shard_by, electors)
        self._gauge(s)
        return s

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
        """Renew, count members, balance — every ``retry_period`` until cancelled or failed."""
        log.info(
            "Sharding: joining",
            extra={"kv": {"identity": self.identity, "namespace": self.namespace, "controllers": {k: s.n for k, s in self.sets.items()}}},
        )
        first = True
        while not self.failed.is_set():
            began = self.clock()
            # the round races the failure: once a range is lost under a running call, the
            # process must be gone before another replica can take the range, so the rest of
            # the round (LIST, tries, collect — each may wait renew_deadline / 2) and the sleep
            # after it are abandoned and the manager's halt starts at once
            round_ = asyncio.ensure_future(self.step(balance=not first))
            if not await self._unless_failed(round_):
                return
            try:
                round_.result()
            except (ApiError, asyncio.TimeoutError) as exc:
                log.warning("Shard lease round failed", extra={"kv": {"error": str(exc) or type(exc).__name__}})
            first = False  # one round to see the other members before taking a share
            # a fixed cadence: a slow round does not stretch the time between renewals
            pause = asyncio.ensure_future(asyncio.sleep(max(0.0, began + self.retry_period - self.clock())))
            await self._unless_failed(pause)

    async def _unless_failed(self, task: asyncio.Future[Any]) -> bool:
        """Wait for ``task``; False (``task`` cancelled) if :attr:`failed` is set first."""
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            await asyncio.wait((task, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not task.done():  # failed, or we were cancelled (a graceful stop)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return not task.cancelled()

    async def step(self, balance: bool = True) -> None:
        """One round: renew the member Lease and every held range, read every Lease once, then
        release drained ranges and take or drain toward the share."""
        await self._renew(self.member, None)
        for s in self.sets.values():
            await asyncio.gather(*(self._renew(s.electors[i], s) for i in s.held()))
        leases = await self._list()
        self.live = self._count_members(leases)
        live_holders = {spec.get("holderIdentity") for name, spec in leases.items() if name in self._live_names}
        live_holders.add(self.identity)
        for s in self.sets.values():
            for i, e in enumerate(s.electors):
                spec = leases.get(e.name)
                if spec is not None and not e.is_leader:
                    e.observe(spec)
                elif spec is None:  # every missing range's wait starts now, tried or not
                    e.missing()
            released = set()
            for i in sorted(s.draining):
                if not s.in_flight[i]:
                    await self._release(s, i)
                    released.add(i)
            if not balance or self.stopping or self.failed.is_set():
                continue  # a failed replica is exiting: it takes nothing, not even its own again
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
            drain, tries = plan(s.held(), s.draining, candidates, self.live, s.n)
            tries = ours + tries  # candidates never include ours
            other = self._other_split(s, leases, live_holders)
            if other:
                if not s.warned:
                    s.warned = True
                    log.warning(
                        "Another replica holds ranges of a different --shards; taking no range until it is gone",
                        extra={"kv": {"controller": s.controller, "shards": s.n, "lease": other}},
                    )
                tries = []
            for i in drain:
                s.draining.add(i)
                log.info("Draining shard", extra={"kv": {"controller": s.controller, "shard": f"{i}/{s.n}", "replicas": self.live}})
                if s.on_dropped is not None:
                    s.on_dropped(i)
            await asyncio.gather(*(self._try(s, i) for i in tries))
        if self.on_round is not None:
            self.on_round()
        await self._collect(leases)

    def _other_split(self, s: ShardSet, leases: dict[str, dict[str, Any]], live: set[Any]) -> str:
        """A range Lease of this controller for another number of ranges, held by a live
        replica ("" if none): its ranges overlap ours, so we must not take any (a rolling
        change of ``--shards``: the new replicas wait for the old ones to stop)."""
        prefix, own = s.electors[0].name.split("-shard-")[0] + "-shard-", f"-of-{s.n}"
        for name, spec in leases.items():
            if name.startswith(prefix) and not name.endswith(own) and spec.get("holderIdentity") in live:
                return name
        return ""

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
        self._handover(s, "acquired", i, replicas=self.live)
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
        if not e.is_leader:
            if s is None:  # the member Lease: (re)join
                try:
                    if await e.try_acquire_or_renew():
                        e.won()
                except ApiError as exc:
                    log.warning("Could not renew member lease", extra={"kv": {"error": str(exc)}})
            return
        assert e.renewed_at is not None
        if not e.valid():
            return self._lost(e, s, f"no successful renewal for {self.clock() - e.renewed_at:.3g} s")
        try:
            if await e.try_acquire_or_renew(e.renewed_at + e.renew_deadline):
                if not e.valid():
                    return self._lost(e, s, "the renewal came back after the renew deadline")
                return
            if e.gone:
                return self._lost(e, s, "the Lease was deleted")
            if e.holder and e.holder != self.identity:
                return self._lost(e, s, f"the Lease is held by {e.holder}")
        except ApiError as exc:
            log.warning("Failed to renew lease", extra={"kv": {"lease": f"{e.namespace}/{e.name}", "error": str(exc)}})
        if not e.valid():
            self._lost(e, s, f"no successful renewal for {self.clock() - e.renewed_at:.3g} s")

    def _lost(self, e: LeaderElector, s: ShardSet | None, why: str) -> None:
        e.lose(why, quiet=s is not None)
        if s is None:
            log.warning("Member lease lost; joining again", extra={"kv": {"reason": why}})
            return
        i = s.electors.index(e)
        s.draining.discard(i)
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
        s.draining.discard(i)
        await s.electors[i].release()
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

    def _count_members(self, leases: dict[str, dict[str, Any]]) -> int:
        now = self.clock()
        live: set[str] = set()
        seen = set()
        for name, spec in leases.items():
            if not name.startswith(self.member_prefix) or name == self.member.name:
                continue
            seen.add(name)
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            old = self._members.get(name)
            if old is None or old[0] != record:
                self._members[name] = old = (record, now)
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if record[0] and now < old[1] + duration:
                live.add(name)
        for name in set(self._members) - seen:
            del self._members[name]
        self._live_names = live
        return 1 + len(live)

    # -- stop -----------------------------------------------------------------------------------
    async def release_all(self) -> None:
        """Release every idle range Lease we hold and delete our member Lease. A range with a
        reconcile still in flight (a plain handler's thread outlived the grace period) is left
        to expire, with one log line (invariant I6)."""
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
        try:
            await self._request("DELETE", f"{self._path}/{self.member.name}")
        except (ApiError, asyncio.TimeoutError) as exc:
            if not isinstance(exc, NotFound):
                log.warning("Could not delete member lease", extra={"kv": {"error": str(exc)}})
