"""Shard filtering: a sharded informer holds only the objects whose shard hash is in its ranges.

Owns the informer's part of sharding (``shard=``, a :class:`~declop.leases.hashing.ShardFilter`;
which replica owns which ranges is :mod:`declop.leases.shards`'): :class:`ShardFiltering`, the
methods of :class:`~declop.cache.informer.Informer` that detect the filtering mode, add the
``shardSelector`` to requests, drop objects outside the ranges, and change the ranges
(:meth:`~ShardFiltering.set_shard`); and :class:`ShardChange`, :data:`ShardMode`.

At the start of its first pass a sharded informer asks the apiserver once (a LIST of one item
with the ``shardSelector``): an answer carrying ``metadata.shardInfo`` means server-side
filtering (``shard_mode == "server"``: every LIST and watch carries the selector, so the
apiserver sends only owned objects); an answer without it (the ``ShardedListAndWatch`` gate off,
an apiserver before v1.36) means client-side filtering (``"client"``: the full list and watch,
objects outside the ranges dropped before the store). docs/sharding.md explains the choice of
re-list on a range change.

Invariants:
- in both modes every object is checked against the filter before the store, with the same
  FNV-1a hash as the apiserver's, so an apiserver that stops filtering (a restart with the gate
  off) costs bandwidth, never correctness: the store never holds an object outside the ranges;
- an object that leaves the store because its range was released is never emitted as a
  deletion (it was not deleted: it is someone else's now);
- a range change never cuts short a sync whose changes are being emitted, and range changes
  take effect one after the other, in call order;
- ranges only narrowed: no sync (the watch resumes from the store's resourceVersion); a range
  gained: a sync, owed until one completes, even across later changes;
- a uid-sharded informer keeps ``metadata.uid`` through any transform (:func:`keeping_uid`),
  so its cached objects can be hashed again when the ranges change.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Literal

from declop.cache.store import Store, Transform, Writer
from declop.errors import ApiError
from declop.kube.keys import Request
from declop.kube.transport import Transport
from declop.leases.hashing import ShardFilter, ShardRange, difference

__all__ = ["ShardChange", "ShardFiltering", "ShardMode", "keeping_uid"]

log = logging.getLogger("declop.informer")

#: how a sharded informer filters: "server" (the apiserver applies the shardSelector), "client"
#: (full list and watch, filtered here), "" (not detected yet, or not sharded)
ShardMode = Literal["", "server", "client"]


@dataclass(frozen=True)
class ShardChange:
    """What :meth:`Informer.set_shard` did. ``released`` are the keys that left the store (never
    emitted as deletions: a controller forgets them, it does not reconcile them); ``gained`` the
    ranges newly owned; ``relisted`` whether a sync was needed to bring their objects in."""

    released: tuple[Request, ...]
    gained: tuple[ShardRange, ...]
    relisted: bool


class ShardFiltering:
    """The shard filtering of :class:`~declop.cache.informer.Informer` (a part of it, not used alone)."""

    # the informer's state this part reads or writes (set in Informer.__init__)
    transport: Transport
    name: str
    store: Store
    _writer: Writer
    _kv: dict[str, str]
    _task: asyncio.Task[None] | None
    shard: ShardFilter | None
    shard_mode: ShardMode
    dropped: int
    released: int
    _warned_unfiltered: bool
    _resharding: asyncio.Lock
    _emitting: int
    _calm: asyncio.Event
    _resume_watch: bool
    _sync_owed: bool

    if TYPE_CHECKING:  # defined by the Informer

        @property
        def path(self) -> str: ...

        def start(self) -> None: ...

        async def stop(self) -> None: ...

    async def set_shard(self, ranges: Iterable[ShardRange]) -> ShardChange:
        """Own exactly ``ranges`` from now on; returns what changed.

        - Objects of released ranges leave the store at once and are *not* emitted: they were
          not deleted, they are someone else's now. Their keys are in the result so that the
          caller can drop them from its queue.
        - Ranges only released (no range gained): the watch restarts with the narrower selector
          from the store's resourceVersion; no sync, no request beyond the new watch.
        - A range gained: the informer syncs again with the new selector (server-side) or the
          full list (client-side). The sync's diff against the store emits the gained objects as
          additions, plus any change missed in kept ranges; unchanged objects emit nothing.
        - A sync whose changes are being emitted is never cut short: this waits for it.

        Call on the informer's loop; concurrent calls take effect one after the other, in order.
        Must be a sharded informer (``shard=`` given)."""
        if self.shard is None:
            raise ValueError(f"informer {self.name} is not sharded; create it with shard=")
        async with self._resharding:
            return await self._set_shard(ranges)

    async def _set_shard(self, ranges: Iterable[ShardRange]) -> ShardChange:
        assert self.shard is not None
        new = self.shard.with_ranges(ranges)
        old = self.shard
        gained = difference(new.ranges, old.ranges)
        if new == old:
            return ShardChange((), (), False)
        while self._emitting:
            self._calm.clear()
            await self._calm.wait()
        running = self._task is not None
        if running:
            await self.stop()
        self.shard = new
        released: list[Request] = []
        for key in self.store.keys():
            obj = self.store.get(key)
            if obj is not None and not new.matches(obj):
                self._writer.delete(key)
                released.append(key)
        self.released += len(released)
        # a sync still owed to an earlier gain (cut short by this change) is owed still
        relist = bool(gained) or self._sync_owed or not self.store.synced or not self.store.resource_version
        self._resume_watch = not relist
        self._sync_owed = relist and not new.empty
        log.info(
            f"Shard ranges changed: now {new}; {len(released)} objects released"
            + (", re-listing for the gained ranges" if relist and not new.empty else ""),
            extra={"kv": {**self._kv, "released": len(released), "gained": len(gained)}},
        )
        if running:
            self.start()
        return ShardChange(tuple(released), gained, relist and not new.empty)

    async def _detect_shard_mode(self) -> None:
        """One LIST of at most one object with the shardSelector: ``shardInfo`` in the answer
        means the apiserver filters (server mode); its absence, or a 400/422 refusing the
        parameter, that it does not (client mode). Other failures raise (the pass backs off)."""
        assert self.shard is not None and not self.shard.empty
        params = {"limit": 1, "shardSelector": self.shard.selector}
        try:
            page = await self.transport.request("GET", self.path, params=params, timeout=60, lane="informer")
            served = bool((page.get("metadata") or {}).get("shardInfo"))
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            served = False
        self.shard_mode = "server" if served else "client"
        if served:
            log.info("Sharded list and watch: the apiserver filters by shard", extra={"kv": self._kv})
        else:
            log.info(
                "Sharded list and watch: the apiserver does not filter (feature gate ShardedListAndWatch "
                "off, or Kubernetes before v1.36); filtering client-side, every event is received",
                extra={"kv": self._kv},
            )

    def _shard_params(self, params: dict[str, Any]) -> None:
        if self.shard is not None and self.shard_mode == "server":
            params["shardSelector"] = self.shard.selector

    def _outside(self, obj: dict[str, Any]) -> bool:
        """Whether the shard filter drops ``obj`` (counted; warned once in server mode)."""
        shard = self.shard
        if shard is None or shard.matches(obj):
            return False
        self.dropped += 1
        if self.shard_mode == "server" and not self._warned_unfiltered:
            self._warned_unfiltered = True
            log.warning(
                "The apiserver sent an object outside the shardSelector (was it restarted with the "
                "ShardedListAndWatch gate off?); dropping such objects client-side",
                extra={"kv": self._kv},
            )
        return True


def keeping_uid(fn: Transform) -> Transform:
    """``fn``, with ``metadata.uid`` put back if it dropped it: a uid-sharded informer hashes its
    cached objects again when its ranges change (transforms must keep name, namespace and
    resourceVersion anyway; the uid is kept for them)."""

    def transform(obj: Any) -> Any:
        uid = (obj.get("metadata") or {}).get("uid")
        out = fn(obj)
        meta = out.get("metadata") if isinstance(out, dict) else None
        if uid and isinstance(meta, dict) and "uid" not in meta:
            meta["uid"] = uid
        return out

    transform.__name__ = getattr(fn, "__name__", "transform")
    return transform
