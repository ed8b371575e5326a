"""Shard filtering: a sharded informer holds only the objects whose shard hash is in its ranges.

Owns :class:`ShardScope`, the filter value an informer's list and watch consult (the owned
ranges, a :class:`~declop.leases.hashing.ShardFilter`, and how they are filtered: by the
apiserver or here), :func:`release`, which takes a range change's released objects out of the
store,
:class:`ShardChange` and :data:`ShardMode`. Which replica owns which ranges is
:mod:`declop.leases.shards`'; how the informer changes its ranges is
:meth:`~declop.cache.informer.Informer.set_shard`; the choice of filtering mode and of a relist on
a range change is explained in docs/sharding.md.

Invariants:
- the mode is detected once, by the first pass of a sharded informer: one LIST of at most one
  item with the ``shardSelector``; ``metadata.shardInfo`` in the answer means ``"server"``,
  its absence (or a 400/422) ``"client"``;
- in both modes every object is checked against the filter before the store, with the same
  FNV-1a hash as the apiserver's, so an apiserver that stops filtering (a restart with the gate
  off) costs bandwidth, never correctness: the store never holds an object outside the ranges;
- an object that leaves the store because its range was released is never emitted as a
  deletion (it was not deleted: it is someone else's now);
- a uid-sharded informer keeps ``metadata.uid`` through any transform (:func:`keeping_uid`),
  so its cached objects can be hashed again when the ranges change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from declop.cache.stats import InformerStats
from declop.cache.store import Store, Transform, Writer
from declop.errors import ApiError
from declop.kube.keys import Request
from declop.kube.transport import Transport
from declop.leases.hashing import ShardFilter, ShardRange

__all__ = ["ShardChange", "ShardMode", "ShardScope", "keeping_uid", "release"]

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


class ShardScope:
    """The shard filter of one informer: its ranges (``filter``, None when not sharded) and how
    they are applied (``mode``). Objects it drops are counted in ``stats.dropped``."""

    def __init__(self, filter: ShardFilter | None, mode: ShardMode, stats: InformerStats, kv: dict[str, str]) -> None:
        #: the owned ranges; replaced (never changed) by a range change, with the loop stopped
        self.filter = filter
        self.mode: ShardMode = mode
        self._stats = stats
        self._kv = kv
        self._warned = False

    @property
    def undetected(self) -> bool:
        """Sharded, and the filtering mode not known yet: the next pass asks (:meth:`detect`)."""
        return self.filter is not None and not self.mode

    def params(self, params: dict[str, Any]) -> None:
        """Add the ``shardSelector`` to a LIST's or watch's parameters when the apiserver filters."""
        if self.filter is not None and self.mode == "server":
            params["shardSelector"] = self.filter.selector

    def outside(self, obj: dict[str, Any]) -> bool:
        """Whether the filter drops ``obj`` (counted; warned about once in server mode)."""
        shard = self.filter
        if shard is None or shard.matches(obj):
            return False
        self._stats.dropped += 1
        if self.mode == "server" and not self._warned:
            self._warned = True
            log.warning(
                "The apiserver sent an object outside the shardSelector (was it restarted with the "
                "ShardedListAndWatch gate off?); dropping such objects client-side",
                extra={"kv": self._kv},
            )
        return True

    async def detect(self, transport: Transport, path: str) -> None:
        """One LIST of at most one object with the shardSelector: ``shardInfo`` in the answer
        means the apiserver filters (server mode); its absence, or a 400/422 refusing the
        parameter, that it does not (client mode). Other failures raise (the pass backs off)."""
        assert self.filter is not None and not self.filter.empty
        params = {"limit": 1, "shardSelector": self.filter.selector}
        try:
            page = await transport.request("GET", path, params=params, timeout=60, lane="informer")
            served = bool((page.get("metadata") or {}).get("shardInfo"))
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            served = False
        self.mode = "server" if served else "client"
        if served:
            log.info("Sharded list and watch: the apiserver filters by shard", extra={"kv": self._kv})
        else:
            log.info(
                "Sharded list and watch: the apiserver does not filter (feature gate ShardedListAndWatch "
                "off, or Kubernetes before v1.36); filtering client-side, every event is received",
                extra={"kv": self._kv},
            )


def release(store: Store, writer: Writer, new: ShardFilter) -> list[Request]:
    """Take the objects outside ``new`` out of the store, without emitting anything; their keys."""
    keys: list[Request] = []
    for key in store.keys():
        obj = store.get(key)
        if obj is not None and not new.matches(obj):
            writer.delete(key)
            keys.append(key)
    return keys


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
