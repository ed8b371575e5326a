"""``World(background=True)``: a leader-only ``@declop.background`` task that writes ConfigMap
``default/heartbeat`` every 0.2–2 s, sleeping as most such loops do — and I14: no two live
replicas run it at once, and none of its writes reaches the apiserver unless the apiserver's
record of the Lease it runs under names its replica and is unexpired.

Each seed here failed before the task's writes were fenced by its Lease and its supervisor
asked the Lease before a restart (docs/simulation.md, defect 16): a holder resumed after a
pause whose task wrote in the turn it woke, before its elector saw the loss; a write paused
between the check and its send; a task restarted after its backoff in the turn its process
resumed, while another replica ran it."""

from __future__ import annotations

import pytest

from declop.testing.simulation.world import CRASH_BETWEEN_WRITES, WORLD_KINDS, World, run

EVERY_KIND = tuple(k for k in WORLD_KINDS if k != CRASH_BETWEEN_WRITES)

SEEDS = {
    "a write in the turn a paused holder resumes": ("leader", 121),
    "a restart after its backoff in the turn its process resumes": ("leader", 234),
    "a write paused between its check and its send": ("sharded", 189),
    "a write after a pause across a partition of the holder": ("sharded", 172),
}


@pytest.mark.parametrize(("mode", "seed"), list(SEEDS.values()), ids=list(SEEDS))
def test_a_leader_only_background_task_changes_nothing_once_its_lease_is_gone(mode: str, seed: int) -> None:
    result = run(World(mode=mode, objects=40, duration=40.0, kinds=EVERY_KIND, background=True), seed)
    assert result.ok, result.report()
    assert result.background_writes > 20, "the task wrote: I14 had something to judge"
