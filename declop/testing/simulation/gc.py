"""The garbage collector of the simulated world, and the **ownership** property of the user's handlers.

A world run with a handlers file (:mod:`declop.testing.simulation.world`) runs :func:`collect` next to
its replicas: Kubernetes' garbage collector, from ``metadata.ownerReferences``, with background
propagation. When an object is gone from the fake apiserver, every object whose owners (by uid)
are all gone is deleted too — one with several owners stays while any of them is there; one
with finalizers gets its ``deletionTimestamp`` and waits for them, as any delete; its own
dependents go at a later sweep (the cascade is asynchronous, as in a cluster).

:func:`ownership` is the property (docs/simulation.md, "Ownership"): once the world settled,
no child a handler call created (a changing ``POST`` recorded by
:class:`~declop.testing.simulation.props.Writes`, with the call's primary key) is left when that primary
is gone — unless the child carries the annotation :data:`OUTLIVES` ``"true"``, the way to say a
child is meant to outlive its parent.

Invariants:
- :func:`sweep` deletes only objects that have ownerReferences, none of whose uids is stored
  now, and that are not being deleted already; it never deletes an object without owners;
- :func:`ownership` reports at most one violation: the first create (in time) of an orphan — a
  child left after its creator's primary went, with no owner stored and no :data:`OUTLIVES`
  annotation; the last create of a child's name is the one that made it.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Mapping

from declop.errors import ApiError, ConfigError
from declop.kube.keys import Request
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.leases import Violation
from declop.testing.simulation.props import Write, Writes

__all__ = ["EVERY", "OUTLIVES", "collect", "ownership", "sweep"]

#: a child meant to outlive its parent says so with this annotation, ``"true"``
OUTLIVES = "sim.declop.dev/outlives-parent"
#: virtual seconds between two sweeps of the garbage collector
EVERY = 1.0


async def sweep(server: FakeApiServer) -> int:
    """One pass of the garbage collector: delete every object whose owners are all gone.
    Returns how many deletes it sent."""
    stores = list(server._stores.items())
    uids = {o["metadata"].get("uid") for _gr, (store, _w) in stores for o in store}
    doomed = []
    for gr, (store, _w) in stores:
        for obj in store:
            meta = obj["metadata"]
            owners = meta.get("ownerReferences") or ()
            if owners and not meta.get("deletionTimestamp") and not any(o.get("uid") in uids for o in owners):
                doomed.append((gr, meta.get("namespace") or "", meta["name"]))
    for gr, namespace, name in doomed:
        info = server._info(gr)
        try:
            await server.request("DELETE", info.path(namespace or None, name))
        except ApiError:
            pass  # gone meanwhile
    return len(doomed)


async def collect(server: FakeApiServer, every: float = EVERY) -> None:
    """The garbage collector: a :func:`sweep` every ``every`` seconds, when anything changed."""
    last = ""
    while True:
        await asyncio.sleep(every)
        if server._last_rv != last:
            await sweep(server)
            last = server._last_rv


def ownership(
    server: FakeApiServer, writes: Writes, resource_of: Callable[[str], str | None], now: float,
    deleted: Mapping[tuple[str, Request], float] = {},  # noqa: B006 - read only
) -> Violation | None:  # fmt: skip
    """The ownership violation of a settled world, or None. ``resource_of``: a controller's
    primary resource (None: not a controller, its writes are not held to this); ``deleted``:
    (resource, key) -> when its object was last deleted — a child created before that was
    created for the object that went, even when the name was created again since."""
    last: dict[str, Write] = {}
    for w in writes.changed:
        if w.verb == "POST":
            last[w.target] = w
    orphans: list[tuple[Write, str]] = []
    for target, w in last.items():
        resource = resource_of(w.call.controller)
        if resource is None:
            continue
        if _stored(server, resource, w.call.key) is not None and deleted.get((resource, w.call.key), -1.0) < w.at:
            continue  # its primary is there, the one it was created for
        child = _stored(server, *_where(target))
        if child is None:
            continue
        meta = child["metadata"]
        if (meta.get("annotations") or {}).get(OUTLIVES) == "true" or meta.get("ownerReferences"):
            continue  # meant to outlive it, or owned by something there (the collector left it)
        orphans.append((w, target))
    if not orphans:
        return None
    orphans.sort(key=lambda o: o[0].at)
    w, target = orphans[0]
    detail = (
        f"{target}, created by {w.call.controller} for {w.call.key} at t={w.at:.3f}, is left after {w.call.key} was deleted: "
        f"it has no ownerReferences, so the garbage collector never deletes it ({len(orphans)} orphaned child(ren) in all; "
        f"set an ownerReference — declop.set_controller_reference(child, obj) — or annotate it {OUTLIVES}: \"true\")"
    )
    return Violation(now, "ownership", "-", detail, w.trace, w.call.controller)


def _where(target: str) -> tuple[str, Request]:
    """The resource and key of a write's target (``"configmaps ns/name"``, or ``"nodes name"``)."""
    plural, _, where = target.partition(" ")
    namespace, _, name = where.rpartition("/")
    return plural, Request(namespace, name)


def _stored(server: FakeApiServer, resource: str, key: Request) -> dict | None:
    try:
        return server.store(resource).get(key)
    except ConfigError:  # a resource the fake does not serve: nothing stored
        return None
