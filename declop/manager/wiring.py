"""Wiring: one :class:`~declop.reconcile.registration.Registration` → one controller.

The controller's sources are the registration's primary, ``owns=`` and ``watches=`` resources,
each read through the shared informers of the pool (one per resource, namespace, selectors and
metadata-only). With leader election the controller's fence is the elector's
:meth:`~declop.leases.leader.LeaderElector.valid`; sharded, it gets its
:class:`~declop.leases.shards.ShardSet`, and the informers whose cache follows the held ranges are
recorded for the shard filter moves (:mod:`declop.manager.leadership`).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from declop.cache.informer import Informer, InformerPool
from declop.clock import Clock
from declop.registry.options import _BadShardKey
from declop.kube.discovery import Discovery
from declop.leases.hashing import ShardFilter
from declop.leases.leader import LeaderElector
from declop.leases.shards import ShardLeases, ShardSet
from declop.reconcile.client import AsyncClient, ClientContext
from declop.reconcile.controller import Controller, Source
from declop.reconcile.mapping import enqueue_mapped, enqueue_owner, enqueue_self
from declop.reconcile.registration import Registration

__all__ = ["build_controller"]


def build_controller(
    reg: Registration,
    *,
    discovery: Discovery,
    pool: InformerPool,
    ctx: ClientContext,
    executor: concurrent.futures.Executor | None,
    metrics: Any,
    elector: LeaderElector | None,
    shard_leases: ShardLeases | None,
    shards: int,
    recent: int,
    clock: Clock,
    sharded: dict[Informer, list[ShardSet]],
) -> Controller:
    """The controller of ``reg``; its sharded informers are added to ``sharded``."""
    primary = discovery.resolve_cached(reg.resource)
    ranges = None
    if shard_leases is not None:
        if reg.shard_by == "namespace" and not primary.namespaced:
            raise _BadShardKey(
                f"controller {reg.name!r}: shard_by='namespace' on {primary.group_resource}, which is cluster-scoped: "
                "every object has the empty namespace, so one replica would own them all; use shard_by='uid'"
            )
        ranges = shard_leases.add(reg.name, shards, reg.shard_by)
    # sharded: the primary's informers cache only the held ranges (empty until the first is
    # taken); owned resources too when sharded by namespace (a child's uid is not its owner's,
    # so by uid they are cached whole and mapped to the owner's key, whose range decides)
    own = ShardFilter(reg.shard_by, ()) if ranges is not None else None  # type: ignore[arg-type]
    primary_informers = pool.for_resource(
        primary, reg.namespaces, reg.labels, field_selector=reg.fields, metadata_only=reg.metadata_only, shard=own
    )
    following = list(primary_informers)
    sources = [Source(tuple(primary_informers), enqueue_self, reg.predicates, primary=True)]
    for owned in reg.owns:
        info = discovery.resolve_cached(owned.name)
        mapper = enqueue_owner(primary.group, primary.kind, namespaced=primary.namespaced)
        by_namespace = own if reg.shard_by == "namespace" and info.namespaced else None
        informers = pool.for_resource(
            info, reg.namespaces, field_selector=owned.fields, metadata_only=owned.metadata_only, shard=by_namespace
        )
        if by_namespace is not None:
            following += informers
        sources.append(Source(tuple(informers), mapper, label=f"owns:{info.kind}"))
    for watched, fn in reg.watches:
        info = discovery.resolve_cached(watched.name)
        informers = pool.for_resource(info, reg.namespaces, field_selector=watched.fields, metadata_only=watched.metadata_only)
        sources.append(
            Source(
                tuple(informers),
                enqueue_mapped(fn, AsyncClient(ctx)),
                label=f"watches:{info.group_resource}",
                via=getattr(fn, "__name__", "map function"),
            )
        )
    if ranges is not None:
        for informer in following:
            sharded.setdefault(informer, []).append(ranges)
    controller = Controller(
        reg, primary, sources, ctx, executor=executor, metrics=metrics, fence=elector.valid if elector is not None else None,
        recent=recent, shards=ranges, clock=clock,
    )  # fmt: skip
    if ranges is not None:  # join and take ranges only once this controller's caches synced
        ranges.synced = controller.synced.is_set
    return controller
