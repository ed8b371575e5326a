"""declop.testing.simulation.shrink: a failing seed shrunk to no fault, fewer or shorter ones, in a
bounded number of runs, and a line that reproduces what it found."""

from __future__ import annotations

import dataclasses

import pytest

from declop import registry as registries
from declop.errors import ConfigError
from declop.loader import load
from declop.registry import Registry
from declop.testing import simulate
from declop.testing.simulation import world as simworld
from declop.testing.simulation.leases import Fault, Violation
from declop.testing.simulation.shrink import RUNS, parse_fault, parse_only, shrink
from declop.testing.simulation.world import World, WorldResult

SCHEDULE = [Fault(3.0, "pause", 0, 4.0), Fault(5.0, "crash", 1, 8.0), Fault(9.0, "hang", 2, 2.0), Fault(12.0, "compact", 0, 0.0)]


def fake(needs: float, other: str | None = None) -> tuple[list[World], object]:
    """A run that fails quiescence when its faults hold a crash of ``needs`` virtual s or longer
    (``other``: fails with that invariant instead when the pause is gone) — and records its worlds."""
    worlds: list[World] = []

    def run(world: World, seed: int, registry: object = None, crds: object = ()) -> WorldResult:
        worlds.append(world)
        faults = list(world.faults) if world.faults is not None else list(SCHEDULE)
        if world.only is not None:
            faults = [faults[i] for i in world.only]
        violations = []
        if any(f.kind == "crash" and f.length >= needs for f in faults):
            violations.append(Violation(50.0, "quiescence", "-", "late writes"))
        if other is not None and not any(f.kind == "pause" for f in faults):
            violations.insert(0, Violation(40.0, other, "-", "something else"))
        return WorldResult(world, seed, faults, violations)

    return worlds, run


def test_the_faults_it_does_not_need_go_and_the_one_it_needs_is_shortened(monkeypatch: pytest.MonkeyPatch) -> None:
    worlds, run = fake(needs=2.0)
    monkeypatch.setattr(simworld, "run", run)
    world = World(handlers="h.py")
    shrunk = shrink(run(world, 7))
    assert shrunk.smaller and shrunk.complete and shrunk.runs == len(worlds) - 1 <= RUNS
    assert shrunk.result.faults == [Fault(5.0, "crash", 1, 2.0)]  # a quarter of 8 s still fails
    assert shrunk.result.repro() == "declop sim h.py --seed 7 --fault 5:crash:1:2"
    lines = shrunk.report()
    assert lines[0].startswith("shrunk (") and "quiescence still fails with 1 of its 4 fault(s), shortened:" in lines[0]
    assert lines[1:] == ("  t=5.000 crash r1 for 2.000 s", "  declop sim h.py --seed 7 --fault 5:crash:1:2")


def test_only_drops_keep_the_seeds_own_schedule_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    _worlds, run = fake(needs=8.0)  # no shorter crash fails
    monkeypatch.setattr(simworld, "run", run)
    shrunk = shrink(run(World(handlers="h.py"), 7))
    assert shrunk.result.faults == [SCHEDULE[1]] and shrunk.result.repro() == "declop sim h.py --seed 7 --only 1"


def test_a_smaller_schedule_that_fails_another_way_is_not_this_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    _worlds, run = fake(needs=8.0, other="I3")
    monkeypatch.setattr(simworld, "run", run)
    shrunk = shrink(run(World(handlers="h.py"), 7))
    assert shrunk.result.violations[0].invariant == "quiescence"
    assert any(f.kind == "pause" for f in shrunk.result.faults)  # without it, the run fails I3 first


def test_the_search_stops_at_its_bound_of_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    worlds, run = fake(needs=2.0)
    monkeypatch.setattr(simworld, "run", run)
    shrunk = shrink(run(World(handlers="h.py"), 7), runs=2)
    assert not shrunk.complete and shrunk.runs == 2 == len(worlds) - 1
    assert "stopped at the bound of" in shrunk.report()[0]


def own_registry(path: str) -> Registry:
    """``path``'s handlers in a registry of their own (the default registry left as it was)."""
    saved, registries.default_registry = registries.default_registry, Registry()
    try:
        load((path,), (), fresh=True)
        return registries.default_registry
    finally:
        registries.default_registry = saved


def test_a_bug_that_needs_no_fault_shrinks_in_one_run_to_a_line_that_reproduces_it() -> None:
    failed = simulate("examples/buggy/idempotence.py", seeds=1, objects=30, duration=20.0).failed[0]
    assert failed.faults  # seed 0 draws some
    registry = own_registry("examples/buggy/idempotence.py")
    shrunk = shrink(failed, registry)
    assert shrunk.runs == 1 and shrunk.result.faults == [] and shrunk.result.violations[0].invariant == "idempotence"
    assert shrunk.result.repro() == "declop sim examples/buggy/idempotence.py --seed 0 --objects 30 --duration 20 --only none"
    again = simworld.run(dataclasses.replace(failed.world, only=()), 0, registry)
    assert [str(v) for v in again.violations] == [str(v) for v in shrunk.result.violations]  # a pure function of the line


def test_the_options_spell_a_schedule() -> None:
    assert parse_only(None) is None and parse_only("none") == () and parse_only("0,2") == (0, 2)
    assert parse_fault("12.5:crash:1:0.5", simworld.WORLD_FAULTS) == Fault(12.5, "crash", 1, 0.5)
    with pytest.raises(ConfigError, match="want AT:KIND:REPLICA:LENGTH"):
        parse_fault("12.5:crash", simworld.WORLD_FAULTS)
    with pytest.raises(ConfigError, match="unknown fault kind 'flood'"):
        parse_fault("1:flood:0:1", simworld.WORLD_FAULTS)
    with pytest.raises(ConfigError, match="indices of the seed's faults"):
        parse_only("first")
