"""declop.testing.simulate: ``declop sim`` from a project's own tests — failing seeds become one
assertion that says how to reproduce them, and the caller's registry and logging are untouched."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from declop import registry as registries
from declop.errors import ConfigError
from declop.testing import Simulation, simulate

SMALL = {"objects": 30, "duration": 20.0}
ROOT = Path(__file__).resolve().parents[4]


def test_a_buggy_handler_fails_with_its_repro_line_property_and_handler_line() -> None:
    simulation = simulate("examples/buggy/idempotence.py", seeds=2, **SMALL)
    assert isinstance(simulation, Simulation) and len(simulation.failed) == 2
    with pytest.raises(AssertionError) as failed:
        simulation.check()
    message = str(failed.value)
    assert message.startswith("2 seeds, 2 failed")
    assert "FAIL declop sim examples/buggy/idempotence.py --seed 0" in message and "idempotence" in message
    assert "examples/buggy/idempotence.py" in message.split("\n", 2)[2]  # the handler's line under it


def test_a_correct_handler_passes_and_the_callers_registry_and_logging_are_untouched() -> None:
    before, handlers = registries.default_registry, list(registries.default_registry.registrations)
    logger = logging.getLogger("declop")
    level = logger.level
    simulation = simulate("examples/buggy/idempotence_fixed.py", seeds=3, **SMALL)
    simulation.check()
    assert simulation.per_minute > 0 and simulation.summary().startswith("3 seeds, 0 failed")
    assert registries.default_registry is before and list(before.registrations) == handlers
    assert logger.level == level


def test_a_simulation_is_a_function_of_its_seeds() -> None:
    a, b = (simulate("examples/buggy/namespaced.py", seeds=1, start=4, **SMALL) for _ in range(2))
    assert [(r.seed, r.calls, r.requests) for r in a.results] == [(r.seed, r.calls, r.requests) for r in b.results]



JOBS = """
import json
from declop.testing import simulate
bodies = lambda rng, index: {"data": {"n": str(index)}}  # a lambda: it does not pickle
runs = {}
for jobs in (1, 2):
    sim = simulate("examples/buggy/idempotence.py", seeds=3, objects_from=bodies, jobs=jobs, objects=30, duration=20.0)
    assert all(r.world.objects_from is bodies for r in sim.results)
    runs[jobs] = [[r.seed, r.calls, r.requests, [str(v) for v in r.violations]] for r in sim.results]
print(json.dumps(runs))
"""


def test_seeds_run_in_forked_processes_give_the_same_results_in_seed_order() -> None:
    """jobs=2: a run is a function of its seed, wherever it runs; a user's objects given as a
    lambda (which does not pickle) stays in the parent, since a result comes back without it.
    In a process of its own, as a project's test run would be: a fork copies only the calling
    thread, and this suite's other tests leave threads behind."""
    out = subprocess.run([sys.executable, "-c", JOBS], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)
    assert runs["1"] == runs["2"] and [r[0] for r in runs["2"]] == [0, 1, 2] and all(r[3] for r in runs["2"])


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((), {}, "nothing to simulate"),
        (("examples/buggy/namespaced.py",), {"faults": ["flood"]}, "unknown fault kind(s) flood"),
    ],
)
def test_bad_arguments_say_what_is_wrong(args: tuple[str, ...], kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        simulate(*args, **kwargs)  # type: ignore[arg-type]
