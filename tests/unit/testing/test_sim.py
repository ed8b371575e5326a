"""The Lease simulator: deterministic runs, invariants that catch a broken fence, seed sweeps of
both scenarios, the schedules that proved issue 22's defects 1 and 7, and the command line."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Iterator

import pytest

from declop.leases.leader import LeaderElector
from declop.testing import sim
from declop.testing.sim import FAULT_KINDS, Fault, Scenario, main, run, shrink

#: the fault mix of the sweeps: every kind, an administrator's delete included (the window a
#: replica restarted after the delete had — creating the Lease at once — is closed: defect 7)
SWEPT = FAULT_KINDS


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    """The Lease code logs every failed renewal; thousands of lines slow a sweep down."""
    logger = logging.getLogger("declop")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    yield
    logger.setLevel(level)


def test_a_run_is_a_function_of_its_seed() -> None:
    a, b = run(Scenario(kind="sharded"), 7), run(Scenario(kind="sharded"), 7)
    assert a.faults == b.faults and a.faults
    assert (a.calls, a.requests, a.violations) == (b.calls, b.requests, b.violations)
    assert a.calls > 50 and a.requests > 100
    assert run(Scenario(kind="sharded"), 8).faults != a.faults


def test_a_broken_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's own test: replicas that believe they lead without a Lease start calls
    under no record (I2) on keys others run (I1)."""

    async def at_once(self: LeaderElector) -> None:
        pass

    async def for_ever(self: LeaderElector) -> None:
        await asyncio.sleep(1e9)

    monkeypatch.setattr(LeaderElector, "acquire", at_once)
    monkeypatch.setattr(LeaderElector, "hold", for_ever)
    monkeypatch.setattr(LeaderElector, "valid", lambda self: True)
    result = run(Scenario(kind="leader", faults=()), 1)
    invariants = {v.invariant for v in result.violations}
    assert {"I1", "I2"} <= invariants
    first = result.violations[0]
    assert first.replica.startswith("r") and first.at < 1.0
    assert "FAIL python -m declop.testing.sim --scenario leader --seed 1" in result.report()


@pytest.mark.parametrize(("kind", "seeds"), [("leader", 200), ("sharded", 40)])
def test_random_schedules_keep_every_invariant(kind: str, seeds: int) -> None:
    scenario = Scenario(kind=kind, kinds=SWEPT)
    failed = [r.report() for r in (run(scenario, seed) for seed in range(seeds)) if not r.ok]
    assert not failed, "\n\n".join(failed)


def test_defect_7_a_deleted_lease_is_not_recreated_while_the_holders_fence_is_open() -> None:
    """An administrator deletes the leader Lease between two renewals; before the fix a standby
    created it again at once and the old leader went on starting calls (I2, I5): seeds 0, 2
    and 3 of these ten failed."""
    for seed in range(10):
        result = run(Scenario(kind="leader", faults=(Fault(11.0 + seed * 0.1, "delete"),)), seed)
        assert result.ok, result.report()


def test_defect_7_sharded_a_deleted_range_lease() -> None:
    """Seed 54 of the sharded sweep: a range Lease deleted at t=33.364 was taken by another
    replica at 34.012 while its holder still started calls under it (I2, I5)."""
    result = run(Scenario(kind="sharded", faults=(Fault(33.364, "delete"),)), 54)
    assert result.ok, result.report()


@pytest.mark.parametrize("seed", [140, 270])
def test_defect_7_a_replica_that_never_saw_the_lease_waits_too(seed: int) -> None:
    """The part of defect 7 left open before: a replica restarted after a loss never saw the
    Lease an administrator deleted moments before, and created it at once while the old holder
    still ran calls under it (I5; seed 140: ``t=40.182 I5 r0#1: still alive with 2 call(s) under
    sim, acquired by r1#1``; seed 270: ``t=41.482 I5 r1#0``). Now every candidate that finds the
    Lease missing creates it only a lease duration later."""
    result = run(Scenario(kind="leader"), seed)
    assert any(f.kind == "delete" for f in result.faults)
    assert result.ok, result.report()


@pytest.mark.parametrize("kind", ["leader", "sharded"])
def test_a_fresh_cluster_keeps_every_invariant_and_is_owned_in_the_end(kind: str) -> None:
    """The first start of an operator (no Lease exists): the first owner waits a lease duration,
    and every invariant holds, I7 (every Lease owned in the end) included."""
    scenario = Scenario(kind=kind, fresh=True)
    failed = [r.report() for r in (run(scenario, seed) for seed in range(10 if kind == "leader" else 3)) if not r.ok]
    assert not failed, "\n\n".join(failed)
    assert Scenario(kind=kind, fresh=True).repro(1).endswith("--seed 1 --fresh")


def test_defect_1_a_range_lost_under_a_running_call_stops_the_round_at_once() -> None:
    """A stuck call, then a partition (requests hang): the range is lost at its renew deadline
    with the call running. Before the fix the round went on (a LIST waiting 5 s) before the
    process began to exit, and another replica took the range first (I5): 5 of these 20 failed."""
    for seed in range(20):
        t = 10 + seed * 0.37
        faults = (Fault(t, "stuck", 0, 60.0), Fault(t + 1.0, "hang", 0, 40.0))
        result = run(Scenario(kind="sharded", faults=faults), seed)
        assert result.ok, result.report()


def test_a_failing_schedule_shrinks_to_the_faults_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an exit that takes 30 s after a loss (the manager promises 2), a stuck call and a
    partition of its replica are enough to fail I5; shrinking drops the three other faults."""
    monkeypatch.setattr(sim, "EXIT_BOUND", 30.0)
    scenario = Scenario(kind="leader", kinds=("hang", "slow", "pause", "stuck", "fail"))
    failed = run(scenario, 26)
    assert len(failed.faults) == 5 and failed.violations[0].invariant == "I5"
    shrunk = shrink(failed)
    assert [f.kind for f in shrunk.faults] == ["stuck", "hang"] and shrunk.scenario.only == (2, 3)
    assert shrunk.violations[0].invariant == "I5"
    assert shrunk.repro().endswith("--seed 26 --faults hang,slow,pause,stuck,fail --only 2,3")
    assert not run(dataclasses.replace(scenario, only=(2,)), 26).violations  # each is needed
    assert not run(dataclasses.replace(scenario, only=(3,)), 26).violations


def test_a_hand_built_schedule_is_named_in_the_repro_line() -> None:
    scenario = dataclasses.replace(Scenario(kind="sharded"), faults=(Fault(3.0, "pause", 1, 2.0),), replicas=2)
    assert scenario.repro(5) == (
        "python -m declop.testing.sim --scenario sharded --seed 5 --replicas 2"
        "  # with a hand-built schedule: t=3.000 pause r1 for 2.000 s"
    )


def test_the_command_line_prints_the_schedule_and_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "leader", "--seed", "38"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok python -m declop.testing.sim --scenario leader --seed 38\nfaults:\n")
    assert "delete: an administrator deletes a held Lease" in out
    assert main(["--scenario", "leader", "--seeds", "3", "--faults", "hang,pause"]) == 0
    assert "3 seeds, 0 failed" in capsys.readouterr().out
    assert main(["--scenario", "leader", "--seed", "38", "--only", "0"]) == 0
    assert "\nfaults:\n  t=6.147 delete: an administrator deletes a held Lease\ncalls:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--faults", "meteor"])
