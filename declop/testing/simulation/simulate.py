"""Simulate: ``declop sim`` from a project's own test suite.

::

    from declop.testing import simulate

    def test_the_handlers_survive_the_simulator():
        simulate("handlers.py", seeds=20).check()

:func:`simulate` loads handler files (or modules) into a registry of their own — the default
registry the process had is put back afterwards, so other tests' handlers are untouched — runs
``seeds`` schedules of the simulated cluster (:mod:`declop.testing.simulation.world`: several replicas on
virtual time, faults drawn from each seed, declop's invariants and the handlers' properties
checked), and returns a :class:`Simulation`. :meth:`Simulation.check` raises an
``AssertionError`` whose message is, per failing seed, the line that reproduces it on the
command line (``declop sim handlers.py --seed N``), its first violation and the handler's lines
that made the offending write, and for the first failing seed the history of the object it is
about. ``allow=("idempotence", "quiescence:heartbeat")`` silences properties on purpose, as
``declop sim --allow`` does: the summary counts them as allowed.

Invariants:
- a simulation is a pure function of its files and arguments: the same seeds give the same results;
- the default registry, the ``declop`` logger's level and the loaded handler modules are as they
  were before the call (the files are executed afresh on every call).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from declop.testing.simulation.world import WorldResult

__all__ = ["Simulation", "simulate"]

#: failing seeds an assertion message shows in full (the rest are counted)
SHOWN = 3


@dataclass(frozen=True, slots=True)
class Simulation:
    """The results of :func:`simulate`, one per seed, and how long they took (real seconds)."""

    results: tuple[WorldResult, ...]
    seconds: float

    @property
    def failed(self) -> tuple[WorldResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def per_minute(self) -> float:
        """Schedules per minute of real time."""
        return 60.0 * len(self.results) / max(self.seconds, 1e-9)

    def summary(self) -> str:
        from declop.testing.simulation.allow import allowed_summary

        allowed = allowed_summary([r.allowed for r in self.results])
        return f"{len(self.results)} seeds, {len(self.failed)} failed, {self.seconds:.1f} s: {self.per_minute:.0f} schedules/min" + (f"; {allowed}" if allowed else "")

    def report(self) -> str:
        """The summary, then each of the first :data:`SHOWN` failing seeds: its repro line, first
        violation and the handler's lines; under the first, its object's history."""
        lines = [self.summary()]
        for n, result in enumerate(self.failed[:SHOWN]):
            first = result.violations[0]
            lines.append(f"FAIL {result.repro()}  # {first}")
            lines.extend(f"    {line}" for line in first.trace)
            lines.extend(f"    {line}" for line in (result.history if n == 0 else ()))
        if len(self.failed) > SHOWN:
            lines.append(f"... and {len(self.failed) - SHOWN} more failing seed(s)")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise ``AssertionError`` with :meth:`report` when any seed failed."""
        if self.failed:
            raise AssertionError(self.report())


def simulate(
    *paths: str,
    modules: Sequence[str] = (),
    seeds: int = 20,
    start: int = 0,
    mode: str = "leader",
    replicas: int = 3,
    shards: int = 4,
    objects: int = 200,
    duration: float = 60.0,
    faults: Sequence[str] | None = None,
    allow: Sequence[str] = (),
    objects_from: Any = None,
    jobs: int = 1,
) -> Simulation:
    """Run the handlers of ``paths`` (files, as ``declop sim`` takes them) and ``modules`` through
    seeds ``start`` … ``start + seeds - 1`` of the simulated cluster; see the module docstring.
    ``objects_from``: the project's own objects (``declop sim --objects-from``): a function
    ``(random.Random, index) -> body``, a list of bodies to cycle, or ``"module:function"``.
    ``jobs``: processes to run the seeds in (``declop sim --jobs``; forked, so the handlers are
    those already loaded), one per core at most.

    Raises:
        ConfigError: nothing to simulate, a file that does not load, no registration, an
            unknown fault kind, an ``allow`` item that is not a property (or names no handler), or
            ``objects_from`` that does not resolve or gives no object body.
    """
    from declop import registry as registries
    from declop.dev.manifests import from_models
    from declop.errors import ConfigError
    from declop.loader import load
    from declop.registry import Registry
    from declop.testing.simulation import world as simworld
    from declop.testing.simulation.allow import Allow

    if not paths and not modules:
        raise ConfigError("nothing to simulate: pass handler files, simulate('handlers.py'), or modules=[...]")
    kinds = tuple(faults) if faults is not None else simworld.DEFAULT_KINDS
    unknown = sorted(set(kinds) - set(simworld.WORLD_KINDS))
    if unknown:
        raise ConfigError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(simworld.WORLD_KINDS)}")
    own, saved = Registry(), registries.default_registry
    logger = logging.getLogger("declop")
    level = logger.level
    registries.default_registry = own  # the files' decorators register here, not in the caller's
    try:
        loaded = load(paths, modules, fresh=True)  # even when the caller's tests did `import handlers`
        if not own.registrations:
            raise ConfigError(f"{', '.join([*paths, *modules])} registered no reconciler; decorate a function with @declop.reconciler")
        crds = [m.obj for m in from_models(loaded, own)]
        allowed = Allow.parse(allow, {r.name for r in own.registrations}).specs()
        world = simworld.World(mode=mode, replicas=replicas, shards=shards, objects=objects, duration=duration, kinds=kinds,
                               handlers=" ".join([*paths, *(f"-m {m}" for m in modules)]), allow=allowed,
                               objects_from=objects_from)  # fmt: skip
        logger.setLevel(logging.CRITICAL + 1)  # the faults make errors on purpose
        began = time.perf_counter()
        results = tuple(simworld.run_many(world, range(start, start + seeds), own, crds, jobs))
        return Simulation(results, time.perf_counter() - began)
    finally:
        registries.default_registry = saved
        logger.setLevel(level)
