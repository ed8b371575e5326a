"""Fence: may this replica start a reconcile of these keys now?

Owns :class:`Gate`, whose :meth:`Gate.may_start` is the one decision taken everywhere a call
may start (before a key's preparation, before each async call, before each call of a batch in
its thread): the controller is not stopping, the leader fence (the manager's ``fence()``: is the
leader Lease known valid?) is open, and in sharded mode the key's range
(:mod:`declop.leases.shards`) may start calls. Also :meth:`Gate.owned` (a worker's keys, checked as it
takes them), :meth:`Gate.closed` (what a closed leader fence does) and :meth:`Gate.write_fence`
(the Lease a started call's writes are checked against, :mod:`declop.kube.fencing`). How the fences
and the write fence fit together: docs/contract.md and docs/sharding.md.

Invariants:
- no reconcile starts — neither its finalizer write nor its handler call — unless ``fence()`` is
  True at that moment;
- a closed leader fence is final (it closes only when leadership is over): the controller halts,
  and the keys it held are dropped (done(), not retried) — the next leader lists every object;
- keys of other ranges are dropped (done(), not retried: their owner reconciles them), and so is
  their trace and pending delayed add — but a dropped key whose object is gone from the cache (a
  deletion this replica could not deliver: its range was lost, draining, or not yet retaken) is
  kept as a *tombstone* of its range and queued again when that range is gained again
  (``Controller.gained``, :class:`~declop.reconcile._keys.ShardBook`);
- a key's range comes from the primary's uid (cached, or remembered from its last event) or from
  its namespace, per the registration's ``shard_by``; a key whose uid was never seen is dropped;
- every reconcile of a range is counted in flight (``shards.begin``) from the moment its key
  passes :meth:`Gate.owned` until its batch ends (``shards.end``), so a drain waits for it;
- once started, a call's writes are checked against its Lease alone — the leader Lease, or its
  range's Lease — and *not* against draining: a draining range lets its calls finish, a lost or
  expired one refuses their writes (:class:`~declop.errors.Fenced`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.leases.shards import ShardSet
from declop.queue.workqueue import WorkQueue
from declop.reconcile._keys import KeyNotes, PrimaryCache, ShardBook

__all__ = ["FENCED", "GO", "SKIP", "STOPPING", "Gate", "lease_of"]

#: :meth:`Gate.may_start`'s answers: start the call; skip it (its range is not ours now: dropped);
#: stop here, the controller stops (the rest are dropped like queued keys); stop here, the leader
#: fence closed (:meth:`Gate.closed`)
GO, SKIP, STOPPING, FENCED = 0, 1, 2, 3


class Gate:
    """May a call start now? The leader fence, the shard ranges and the controller's stop.

    ``stopping`` is set once (``Controller.halt``/``stop``) and read by batches in their thread;
    ``fenced`` counts the keys a closed leader fence stopped; ``book`` is the
    :class:`~declop.reconcile._keys.ShardBook` of a sharded controller (else None); ``halt`` stops
    the controller's intake (:meth:`closed`)."""

    __slots__ = ("leader", "lease", "fenced", "shards", "book", "stopping", "halt", "log", "name")

    def __init__(
        self,
        leader: Callable[[], bool] | None,
        shards: ShardSet | None,
        by_uid: bool,
        halt: Callable[[], None],
        log: logging.Logger,
        name: str,
    ) -> None:
        self.leader = leader
        #: the Lease behind ``leader``, for the message of a fenced write
        self.lease = lease_of(leader)
        self.fenced = 0
        self.shards = shards
        self.book = ShardBook(by_uid) if shards is not None else None
        self.stopping = False
        self.halt, self.log, self.name = halt, log, name

    def may_start(self, shard: int, first: bool) -> int:
        """The one fence decision, taken just before a call starts (on the loop, or in a batch's
        thread): :data:`GO`, :data:`SKIP`, :data:`STOPPING` or :data:`FENCED`. ``first``: the
        first call a worker took (taken before a stop: it runs)."""
        if self.stopping and not first:
            return STOPPING
        leader = self.leader
        if leader is not None and not leader():
            return FENCED
        shards = self.shards
        if shards is not None and not shards.may_start(shard):
            return SKIP
        return GO

    def shard_of(self, key: Request, obj: Any) -> int | None:
        """The range of ``key`` (its cached object ``obj``; None: its uid was never seen)."""
        shards, book = self.shards, self.book
        assert shards is not None and book is not None
        if book.uids is None:
            return shards.index(key.namespace)
        uid = book.uid_of(key, obj)
        return shards.index(uid) if uid else None

    def owned(
        self, keys: list[Request], ranges: dict[Request, int], primary: PrimaryCache, notes: KeyNotes, queue: WorkQueue[Request]
    ) -> list[Request]:
        """The keys whose range may start a reconcile now, each counted in flight for its range
        (``ranges``); the others are done() at once — their range's owner reconciles them."""
        shards, book = self.shards, self.book
        assert shards is not None and book is not None
        by_uid = book.uids is not None
        kept = []
        for key in keys:
            obj = primary.get(key) if by_uid else None
            r = self.shard_of(key, obj)
            if r is None or not shards.may_start(r):
                book.refused(key, r, (obj if by_uid else primary.get(key)) is not None)
                notes.drop(key)
                queue.done(key)
                continue
            shards.begin(r)
            ranges[key] = r
            kept.append(key)
        return kept

    def closed(self, keys: int) -> None:
        """The leader fence stopped ``keys`` keys. It never reopens: halt (the manager exits next)."""
        if not self.fenced:
            self.log.warning(
                "Not starting reconciles: the leader Lease is not known to be valid",
                extra={"kv": {"controller": self.name}},
            )
        self.fenced += keys
        self.halt()

    def write_fence(self, key: Request, shard: int) -> WriteFence | None:
        """The fence of a call of ``key`` (in range ``shard`` when sharded): its range's Lease, or
        the leader Lease; None without either — then nothing is checked."""
        shards = self.shards
        if shards is not None:
            e = shards.electors[shard]
            return WriteFence(e.valid, f"{e.namespace}/{e.name}", key, (shards, shard))
        if self.leader is None:
            return None
        return WriteFence(self.leader, self.lease, key)


def lease_of(fence: Callable[[], bool] | None) -> str:
    """``namespace/name`` of the Lease behind a leader fence (an elector's bound ``valid``)."""
    elector: Any = getattr(fence, "__self__", None)
    name, namespace = getattr(elector, "name", None), getattr(elector, "namespace", None)
    return f"{namespace}/{name}" if name and namespace else "of the leader"


