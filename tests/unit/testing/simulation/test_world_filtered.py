"""Two informers of one resource in the simulated world (declop.testing.simulation.world, issue 42): a
``labels=`` controller woken by its filtered informer reads its own object with
``client.get(request)`` or ``client.list()``, which read the unfiltered cache once the object
left the filter; each watch stream delivers its events after delays of its own (``watch_lag``).
I10: at the end, every object in the filter has its child holding its value, and no other
object has one."""

from __future__ import annotations

import dataclasses

import pytest

from declop.cache.informer import InformerPool
from declop.testing.simulation.world import World, run

# 60 objects over the default 60 s: a leader is elected at about t=30, so half the workload
# reaches a running controller
FILTERED = World(filtered=True, watch_lag=0.05, objects=60)


@pytest.mark.parametrize("mode", ["leader", "sharded"])
def test_the_filtered_world_converges(mode: str) -> None:
    for seed in (0, 1):
        result = run(dataclasses.replace(FILTERED, mode=mode), seed=seed)
        assert result.ok, result.report()


@pytest.mark.parametrize("seed, key, read", [(31, "ns-a/w024", "get"), (2, "ns-d/w027", "list")])
def test_a_seed_loses_a_label_leave_when_the_unfiltered_cache_does_not_wake_the_controller(
    monkeypatch: pytest.MonkeyPatch, seed: int, key: str, read: str
) -> None:
    """Found with this world, no fault at all: ``key`` leaves the filter; the filtered watch's
    DELETED wakes the handler first, whose ``client.get(request)`` (an even name) or
    ``client.list(namespace=)`` (an odd one) reads the unfiltered cache — its watch has not
    delivered the change yet, so the object is there still selected and the handler keeps its
    child. Without the controller's subscription to the unfiltered informers of its resource
    (e903cdd) nothing wakes it when that cache catches up: the child stays for ever. Without
    ``watch_lag`` (one delivery moment for every stream) the world cannot show it."""
    assert run(FILTERED, seed=seed).ok
    monkeypatch.setattr(InformerPool, "follow_unfiltered", lambda self, resource, follow: None)
    without = run(FILTERED, seed=seed)
    assert not without.faults and [v.invariant for v in without.violations][:1] == ["I10"], without.report()
    assert key in without.violations[0].detail and "out of the filter" in without.violations[0].detail
    assert run(World(filtered=True, objects=60), seed=seed).ok, "no lag: the two caches never disagree"


def test_seed_2_sharded_by_uid_delivers_the_deletion_the_unfiltered_cache_saw_last() -> None:
    """Sharded by uid, no fault: objects leave the filter or are deleted in it; the call of the
    filtered DELETED reads the lagging unfiltered cache (still selected) and keeps the child.
    Before 1a45be5 the shard book forgot the key's uid once a call found the object gone — even
    a failed one, even while the unfiltered cache's wake was waiting — and that wake did not note
    it: the wake found no range and was dropped at the fence, I10 (ns-b/w001 first; checked by
    reverting declop/reconcile/ to db78bac; test_controller.py pins each of the three ways)."""
    result = run(dataclasses.replace(FILTERED, mode="sharded"), seed=2)
    assert not result.faults and result.ok, result.report()
