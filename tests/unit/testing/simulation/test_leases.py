"""The Lease simulator: deterministic runs, invariants that catch a broken fence, seed sweeps of
both scenarios, the schedules that proved issue 22's defects 1 and 7 and what fenced writes
change (I9), and the command line."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Iterator

import pytest

from declop.kube.fencing import WriteFence
from declop.leases.leader import LeaderElector
from declop.testing.simulation import leases as sim
from declop.testing.simulation.leases import FAULT_KINDS, Fault, Scenario, main, run, shrink, sweep

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
    assert "FAIL python -m declop.testing.simulation.leases --scenario leader --seed 1" in result.report()


#: issue 22's scenario families and the seeds ``make test`` sweeps of each, in chunks of 100
#: (about a minute each on one loaded core); ``make sim`` runs 10,000 per family
FAMILIES = {"leader": 300, "sharded-uid": 300, "sharded-namespace": 300, "rolling": 300, "shared-id": 200}


@pytest.mark.parametrize(
    ("kind", "start"), [(kind, start) for kind, seeds in FAMILIES.items() for start in range(0, seeds, 100)]
)
def test_random_schedules_keep_every_invariant(kind: str, start: int) -> None:
    kinds = SWEPT if kind == "leader" else SWEPT + ("unsynced",)
    failed = sweep(Scenario(kind=kind, kinds=kinds), range(start, start + 100))
    assert not failed, "\n".join(failed)


def test_sharded_is_the_old_name_of_sharded_uid() -> None:
    a, b = run(Scenario(kind="sharded"), 3), run(Scenario(kind="sharded-uid"), 3)
    assert (a.faults, a.calls, a.requests) == (b.faults, b.calls, b.requests)


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


def test_defect_7_a_re_creation_deleted_again_between_two_reads_of_a_waiter() -> None:
    """Defect 7's last window (seed 749, shrunk to its three faults): r1 re-creates the Lease an
    administrator deleted at t=22.7, and it is deleted again at t=40.5 before r0 reads once
    more; r0 never saw it exist and created it while r1 ran a call under it (``t=40.742 I5 r1#0:
    still alive with 1 call(s) under sim, acquired by r0#0``). Now a creator leads only once its
    record stood for the renew deadline."""
    result = run(Scenario(kind="leader", only=(0, 1, 2)), 749)
    assert [f.kind for f in result.faults] == ["pause", "delete", "delete"]
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


@pytest.mark.parametrize(
    ("scenario", "seed"),
    [
        # found by search once the Leases start existing and free (the default since defect 7):
        # a replica paused in the middle of a call resumes after another took its Lease; its
        # write at the call's end is accepted under the other's Lease when unfenced (leader seed
        # 6: key-0108 at t=63.897 under r2's; sharded seed 1: key-0169 at t=30.440, range 3)
        (Scenario(kind="leader", kinds=("pause",)), 6),
        (Scenario(kind="sharded", kinds=("pause",)), 1),
    ],
    ids=["leader", "sharded"],
)
def test_fenced_writes_a_call_resumed_after_its_lease_was_taken_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, scenario: Scenario, seed: int
) -> None:
    """The call itself cannot be stopped (I1 exempts a paused replica), but its write goes through
    the transport's write fence, which finds the Lease not valid on the replica's own clock: I9
    holds. The same schedule without the check (every write accepted) violates I9."""
    fenced = run(scenario, seed)
    assert fenced.ok and fenced.fenced >= 1, fenced.report()
    monkeypatch.setattr(WriteFence, "check", lambda self, method, path: None)
    unfenced = run(scenario, seed)
    assert {v.invariant for v in unfenced.violations} == {"I9"}, unfenced.report()
    assert unfenced.fenced == 0 and unfenced.writes == fenced.writes + fenced.fenced


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
        "python -m declop.testing.simulation.leases --scenario sharded --seed 5 --replicas 2"
        "  # with a hand-built schedule: t=3.000 pause r1 for 2.000 s"
    )


def test_the_command_line_prints_the_schedule_and_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "leader", "--seed", "38"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok python -m declop.testing.simulation.leases --scenario leader --seed 38\nfaults:\n")
    assert "delete: an administrator deletes a held Lease" in out
    assert main(["--scenario", "leader", "--seeds", "3", "--faults", "hang,pause"]) == 0
    assert "3 seeds, 0 failed" in capsys.readouterr().out
    assert main(["--scenario", "leader", "--seed", "38", "--only", "0"]) == 0
    assert "\nfaults:\n  t=6.147 delete: an administrator deletes a held Lease\ncalls:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--faults", "meteor"])


# -- issue 22, defects 4, 6 and 9: member counting, the sync gate, renewals on their own ------


def test_defect_4_a_second_operator_under_the_same_election_id() -> None:
    """shared-id seed 28, no fault at all: the widgets replicas counted the gadgets operator's
    two replicas as members (share ceil(4 / 5) = 1) and range 3 of 4 (and 2 of 3 of gadgets)
    stayed unowned for ever (I7); 30 of the first 30 seeds failed so."""
    result = run(Scenario(kind="shared-id"), 28)
    assert not result.faults and result.ok, result.report()


def test_defect_4_a_rolling_shards_change_stopped_part_way() -> None:
    """rolling seed 0, slow requests only: r0 and r1 restarted with --shards 6, r2 still has 4.
    The old replica counted the new ones (share ceil(4 / 3) = 2), the new ones wait for it:
    ranges 1 and 3 of 4 were owned by nobody, for ever (I7)."""
    result = run(Scenario(kind="rolling", kinds=("slow",)), 0)
    assert [f.replica for f in result.faults if f.kind == "roll"] == [0, 1]
    assert result.ok, result.report()


@pytest.mark.parametrize("kind", ["sharded-uid", "sharded-namespace"])
def test_defect_6_a_replica_whose_caches_never_sync_takes_no_range(kind: str) -> None:
    """Seed 24: r1 is restarted at t=10 with caches that never sync; it joined, took its share
    and never reconciled it (I7: ranges with no live, synced owner)."""
    result = run(Scenario(kind=kind), 24)
    assert result.faults[0].kind == "unsynced"
    assert result.ok, result.report()


def test_defect_9_slow_requests_do_not_lose_ranges() -> None:
    """r0's requests all answer, in up to 4.75 s (their timeout is 5 s). Before, its round made
    them one after the other (member, ranges, LIST) and r0 lost its ranges in 9 of these 10
    runs; renewing on their own, every retry period, it loses none."""
    lost: list[str] = []

    class Losses(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "Shard lease lost" and record.kv["identity"] == "r0#0":  # type: ignore[attr-defined]
                lost.append(record.kv["reason"])  # type: ignore[attr-defined]

    logger, handler = logging.getLogger("declop.shardlease"), Losses()
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR)
    try:
        for seed in range(10):
            result = run(Scenario(kind="sharded-uid", faults=(Fault(5.0, "slow", 0, 19.0),)), seed)
            assert result.ok and not lost, f"seed {seed}: {lost}\n{result.report()}"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def test_i5_exempts_a_replica_paused_since_its_own_last_write_even_after_another_holder() -> None:
    """Found by the 10,000-seed `sharded-uid` sweep (seed 8517): r2 is paused for 19 s with a
    stuck call under range 3; r0 takes the expired range, drains and releases it; r1 takes it
    while r2, resumed, is on its way out. I5 exempted only a pause after the *newest* record
    (r0's release), not after r2's own last renewal, as docs/simulation.md states it."""
    result = run(Scenario(kind="sharded-uid"), 8517)
    assert [f.kind for f in result.faults] == ["fail", "crash", "stuck", "pause"]
    assert result.ok, result.report()


def test_i7_does_not_ask_an_owner_of_a_controller_whose_replicas_never_sync() -> None:
    """The same sweep, seed 1496: all three replicas restart with caches that never sync, so
    nobody may own a range (defect 6); I7 asked for an owner anyway."""
    result = run(Scenario(kind="sharded-uid"), 1496)
    assert {f.replica for f in result.faults if f.kind == "unsynced"} == {0, 1, 2}
    assert result.ok, result.report()


def test_i7_gives_a_key_the_extra_renew_deadline_when_the_split_that_takes_it_had_no_lease() -> None:
    """`rolling` seed 1034: the rollout to 6 ranges stops after r0 and r1; r1's requests are
    slow until 67.105 s (the last change). The 6-range Leases never existed; r0 creates 0-2 at
    58.1 s; r1's LISTs sent during the fault time out until 71.65 s (a gap past the renew
    deadline: its wait starts over), so it creates 3-5 at 87.66 s and they open at 98.67 s —
    31.6 s after the last change, inside the 40 s a missing Lease is given. r2 (4 ranges) holds
    none and rightly gives way to the split that holds some. I7 named the key by the 4-range
    Lease (which existed, held by nobody) and gave it only 30 s: it failed at 98.000 s."""
    result = run(Scenario(kind="rolling"), 1034)
    assert {"roll", "slow", "delete"} <= {f.kind for f in result.faults}
    assert result.ok, result.report()


def test_i7_counts_a_stuck_call_as_a_fault_until_it_ends() -> None:
    """`sharded-namespace` seed 1525, found by the first 10,000-seed sweep with the 429/503/500
    answers of ``fail``: the stuck fault is drawn at 30.6 s, but r0 — paused from 52.9 to 81.1 s
    — makes its next call only at 87.2 s, under range 3, which it starts draining at 91.1 s (a
    fourth member joined). The drain rightly waits for the 40 s call (no one may take a range
    under a running call); I7 counted the fault from its draw and failed at 130 s."""
    result = run(Scenario(kind="sharded-namespace"), 1525)
    assert {"stuck", "pause", "fail"} <= {f.kind for f in result.faults}
    assert result.ok, result.report()


@pytest.mark.parametrize("only", [None, (2, 3, 4, 5)])
def test_a_stop_that_leaves_a_range_to_expire_exits_before_it_can_be_taken(only: tuple[int, ...] | None) -> None:
    """`shared-id` seed 402 (and its shrunk schedule): r2 is cut off from 33.9 s (its last
    renewal 32.67 s), a call of range 0 gets stuck, SIGTERM at 39.1 s with a 2.1 s grace. The
    range was left to expire at 41.25 s, but release_all() then waited 5 s to release range 3
    and 5 s to delete the member Lease: r2 lived to 51.25 s, and r0 took range 0 at 50.01 s
    under the running call (I5). Now leaving a range to expire under a running call is a loss
    (the manager's watchdog: gone 2 s later)."""
    result = run(Scenario(kind="shared-id", only=only), 402)
    assert {"hang", "stuck", "term"} <= {f.kind for f in result.faults}
    assert result.ok, result.report()


def test_a_crash_restart_never_starts_a_second_incarnation_over_a_rollout() -> None:
    """`rolling` seed 1034 again, for the harness: r0 crashes at 2.15 s, the rollout restarts it
    at 29.2 s (r0#1), then the crash's own restart at 32.08 s started r0#2 over r0#1, which ran
    on, cut off, to the end. A start over a live incarnation is now reported (``harness``) and
    the crash's restart skips a replica that is running again."""
    result = run(Scenario(kind="rolling"), 1034)
    assert {"crash", "roll"} <= {f.kind for f in result.faults}
    assert not [v for v in result.violations if v.invariant == "harness"], result.report()


@pytest.mark.parametrize("seed", [2631, 3345, 6662, 9309, 8725])
def test_two_splits_never_wait_for_each_other_for_ever(seed: int) -> None:
    """Defect 11 (`rolling`, the 10,000-seed sweep): a rollout to `--shards 6` stops part way; the
    old split's replica is paused past its renew deadline and the new split's is slowed past its
    own, so each loses its ranges to expiry without releasing them. Each split then saw a record of
    the other naming a live replica and took nothing, for ever: every range unowned (I7). A
    record of the other split that has not changed for a lease duration (a renew deadline more
    for the larger split) now holds nothing. Seed 8725 is the bound: with two lease durations
    for the larger split, a replica that had just joined it waited past I7's bound."""
    result = run(Scenario(kind="rolling"), seed)
    assert "roll" in {f.kind for f in result.faults}
    assert result.ok, result.report()


def test_an_exception_out_of_the_lease_code_is_reported_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug that first broke the fix of defect 11 (a name clash: a set used as a dict) ended
    each replica's Lease task in silence; the run only showed I7 40 s later."""
    from declop.leases import members

    def broken(*_: Any) -> Any:
        raise AttributeError("'set' object has no attribute 'get'")

    monkeypatch.setattr(members.Members, "other_split", broken)
    result = run(Scenario(kind="rolling"), 2631)
    assert result.violations[0].invariant == "bug" and "AttributeError" in result.violations[0].detail
