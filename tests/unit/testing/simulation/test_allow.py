"""declop.testing.simulation.allow: a property silenced on purpose, everywhere or for one handler, is
counted and reported as allowed — never failing, never dropped; declop's invariants cannot be."""

from __future__ import annotations

from pathlib import Path

import pytest

from declop.errors import ConfigError
from declop.testing import simulate
from declop.testing.simulation.allow import Allow, allowed_summary
from declop.testing.simulation.leases import Violation

SMALL = {"objects": 30, "duration": 20.0}


def test_items_name_a_property_everywhere_or_for_one_handler() -> None:
    allow = Allow.parse(["quiescence:beat,idempotence", "ownership"], known={"beat", "make"})
    assert allow.covers("idempotence", "make") and allow.covers("ownership")
    assert allow.covers("quiescence", "beat") and not allow.covers("quiescence", "make")
    assert not allow.covers("conflicts", "make")
    assert allow.of("quiescence") == {"beat"}
    assert allow.specs() == ("idempotence", "ownership", "quiescence:beat")
    assert not Allow.parse([]) and Allow.parse(["", " "]) == Allow()


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("I3", "I3 is an invariant of declop, not a property of your handlers"),
        ("idempotency", "unknown property 'idempotency'; choose from quiescence, idempotence"),
        ("quiescence:nobody", "no handler is registered as 'nobody'; the registrations are beat"),
    ],
)
def test_a_bad_item_is_one_line_that_says_what_to_choose(item: str, says: str) -> None:
    with pytest.raises(ConfigError) as bad:
        Allow.parse([item], known={"beat"})
    assert says in str(bad.value) and str(bad.value).startswith(f"--allow {item}: ")


def test_the_summary_counts_the_seeds_that_had_each_allowed_violation() -> None:
    v = Violation(1.0, "idempotence", "-", "…", (), "make")
    assert allowed_summary([[v], [], [v]]) == "allowed on purpose: idempotence:make in 2 seed(s)"
    assert allowed_summary([[], []]) == ""


def test_an_allowed_property_passes_the_seeds_and_is_counted_not_dropped() -> None:
    simulation = simulate("examples/buggy/idempotence.py", seeds=2, allow=["idempotence"], **SMALL)
    simulation.check()
    assert simulation.summary().endswith("; allowed on purpose: idempotence:make_child in 2 seed(s)")
    result = simulation.results[0]
    assert [v.invariant for v in result.allowed] == ["idempotence"] and "one more reconcile of" in result.allowed[0].detail
    report = result.report()
    assert report.startswith("ok declop sim examples/buggy/idempotence.py --seed 0 --objects 30 --duration 20 --allow idempotence")
    assert "allowed on purpose (--allow idempotence), not failing the seed:" in report


TWO = '''
import declop


@declop.reconciler("configmaps")
def make_child(request, client, obj, **_):
    if obj is not None:
        child = {"metadata": {"generateName": f"{request.name}-", "namespace": request.namespace}}
        declop.set_controller_reference(child, obj)
        client.create("secrets", child)


@declop.reconciler("configmaps")
def tidy(request, client, obj, **_):
    return None
'''


def test_allowed_for_one_handler_the_others_are_still_held_to_it(tmp_path: Path) -> None:
    handlers = tmp_path / "two.py"
    handlers.write_text(TWO)
    other = simulate(str(handlers), seeds=1, allow=["idempotence:tidy"], **SMALL)
    assert len(other.failed) == 1 and other.failed[0].violations[0].handler == "make_child"
    mine = simulate(str(handlers), seeds=1, allow=["idempotence:make_child"], **SMALL)
    mine.check()
    assert [(v.invariant, v.handler) for v in mine.results[0].allowed] == [("idempotence", "make_child")]


def test_an_allowed_hot_loop_runs_on_and_the_next_property_is_still_checked() -> None:
    """quiescence allowed: the late writes no longer end the run, so the idempotence check runs
    (and fails: the handler bumps a counter on every call) unless it is allowed too."""
    quiet = simulate("examples/buggy/hot_loop.py", seeds=1, allow=["quiescence"], **SMALL)
    (failed,) = quiet.failed
    assert failed.violations[0].invariant == "idempotence" and [v.invariant for v in failed.allowed] == ["quiescence"]
    both = simulate("examples/buggy/hot_loop.py", seeds=1, allow=["quiescence", "idempotence"], **SMALL)
    both.check()
    assert {v.invariant for v in both.results[0].allowed} == {"quiescence", "idempotence"}


@pytest.mark.parametrize(
    ("path", "prop", "handler", "seed", "size"),
    [
        ("examples/buggy/crash.py", "crash-safety", "make_child", 1, SMALL),  # a duplicate child after a kill
        ("examples/buggy/cleanup.py", "finalizers", "lease", 0, {}),  # an object stuck on a failing cleanup
    ],
)
def test_crash_safety_and_finalizers_can_be_allowed_for_their_handler(path: str, prop: str, handler: str, seed: int, size: dict[str, float]) -> None:
    """The properties added after --allow route through it too, naming their handler: the seed
    that fails without the allowance passes with it, and keeps the violation as allowed."""
    (failed,) = simulate(path, start=seed, seeds=1, **size).failed  # type: ignore[arg-type]
    assert (failed.violations[0].invariant, failed.violations[0].handler) == (prop, handler)
    allowed = simulate(path, start=seed, seeds=1, allow=[f"{prop}:{handler}"], **size)  # type: ignore[arg-type]
    allowed.check()
    assert (prop, handler) in [(v.invariant, v.handler) for v in allowed.results[0].allowed]
