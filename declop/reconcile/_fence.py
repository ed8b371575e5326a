"""Fence: may this replica start a reconcile of these keys now?

Two fences guard every reconcile a controller starts. With leader election, the manager's
``fence()`` says whether the leader Lease is still known valid; the controller checks it just
before each key's preparation (its finalizer write) and just before each handler call — also
inside a batch (:func:`~declop.reconcile._call.run_batch`). In sharded mode
(:mod:`declop.leases.shards`), a key belongs to one hash range, whose Lease must be known valid and
not draining: :func:`owned` checks it when a worker takes the key, and ``shards.may_start`` again
just before the handler call. Owns :func:`shard_of` (a key's range), :func:`owned` (a worker's
keys, sorted), :func:`fence_closed` (what a closed leader fence does) and :func:`write_fence`
(the Lease a started call's writes are checked against, :mod:`declop.kube.fencing`).

Invariants:
- no reconcile starts — neither its finalizer write nor its handler call — unless ``fence()`` is
  True at that moment;
- a closed leader fence is final (it closes only when leadership is over): the controller halts,
  and the keys it held are dropped (done(), not retried) — the next leader lists every object;
- keys of other ranges are dropped (done(), not retried: their owner reconciles them), and so is
  their trace and pending delayed add — but a dropped key whose object is gone from the cache (a
  deletion this replica could not deliver: its range was lost, draining, or not yet retaken) is
  kept as a *tombstone* of its range and queued again when that range is gained again
  (``Controller.gained``): a range lost and retaken does not lose the deletions it missed;
- a key's range comes from the primary's uid (cached, or remembered from its last event) or from
  its namespace, per the registration's ``shard_by``; a key whose uid was never seen is dropped;
- every reconcile of a range is counted in flight (``shards.begin``) from the moment its key
  passes :func:`owned` until its batch ends (``shards.end``), so a drain waits for it;
- once started, a call's writes are checked against its Lease alone — the leader Lease, or its
  range's Lease — and *not* against draining: a draining range lets its calls finish, a lost or
  expired one refuses their writes (:class:`~declop.errors.Fenced`).
"""

from __future__ import annotations

from typing import Any, Callable

from declop.kube.fencing import WriteFence
from declop.kube.keys import Request
from declop.reconcile._call import ControllerState

__all__ = ["fence_closed", "lease_of", "owned", "shard_of", "write_fence"]


def shard_of(c: ControllerState, key: Request) -> int | None:
    """The range of ``key`` (None: its uid was never seen)."""
    assert c.shards is not None
    if c._uids is None:
        return c.shards.index(key.namespace)
    obj = c._lookup(key)
    uid = (obj.get("metadata") or {}).get("uid") if obj is not None else None
    if not uid:
        uid = c._uids.get(key)
    return c.shards.index(uid) if uid else None


def owned(c: ControllerState, keys: list[Request], ranges: dict[Request, int]) -> list[Request]:
    """The keys whose range may start a reconcile now, each counted in flight for its range
    (``ranges``); the others are done() at once — their range's owner reconciles them."""
    shards = c.shards
    assert shards is not None
    kept = []
    for key in keys:
        r = shard_of(c, key)
        if r is None or not shards.may_start(r):
            if r is not None and c._lookup(key) is None:
                c._tombstones.setdefault(r, set()).add(key)  # a deletion: owed if r is ours again
            c.unowned += 1
            c._traces.pop(key, None)
            c._delayed.pop(key, None)
            c.queue.done(key)
            continue
        shards.begin(r)
        ranges[key] = r
        kept.append(key)
    return kept


def fence_closed(c: ControllerState, keys: int) -> None:
    """The fence stopped ``keys`` keys. It never reopens: halt (the manager exits next)."""
    if not c.fenced:
        c._log.warning(
            "Not starting reconciles: the leader Lease is not known to be valid",
            extra={"kv": {"controller": c.name}},
        )
    c.fenced += keys
    c.halt()


def lease_of(fence: Callable[[], bool] | None) -> str:
    """``namespace/name`` of the Lease behind a leader fence (an elector's bound ``valid``)."""
    elector: Any = getattr(fence, "__self__", None)
    name, namespace = getattr(elector, "name", None), getattr(elector, "namespace", None)
    return f"{namespace}/{name}" if name and namespace else "of the leader"


def write_fence(c: ControllerState, key: Request, shard: int) -> WriteFence | None:
    """The fence of a call of ``key`` (in range ``shard`` when sharded): its range's Lease, or the
    leader Lease; None without either — then nothing is checked."""
    shards = c.shards
    if shards is not None:
        e = shards.electors[shard]
        return WriteFence(e.valid, f"{e.namespace}/{e.name}", key)
    if c.fence is None:
        return None
    return WriteFence(c.fence, c.fence_lease, key)
