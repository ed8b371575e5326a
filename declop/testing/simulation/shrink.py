"""Shrinking a failing world seed to the least of its schedule that still fails the same way.

``declop sim FILE --seed N`` runs seed N, and when it fails, :func:`shrink` looks for a smaller
schedule that fails the same property (or invariant) — deterministic delta debugging over the
seed's faults, each try a whole run of the same seed with a smaller schedule:

1. no fault at all (most property bugs of handlers need none);
2. each fault dropped in turn, kept dropped while the run still fails (greedy, one pass);
3. each remaining fault shortened, to a quarter of its length, else to half.

The workload, the handlers' durations, the uids and the conflicts are drawn from the seed on
streams of their own, so a smaller schedule keeps them (the network's latencies shift once a
fault that slowed or failed requests is gone: a try may then pass for another reason). The
result is one line that reproduces it: ``--only i,j`` (the seed's faults kept, by index; ``--only
none``: without any) when only drops were needed, or the faults spelled out with
``--fault AT:KIND:REPLICA:LENGTH`` once one was shortened.

Why not Hypothesis (docs/simulation.md, "Shrinking"): a world run is a pure function of its
seed, and a seed is the one-line repro users paste; Hypothesis would generate schedules from its
own byte stream (no seed line; its repro is a database entry or ``@reproduce_failure`` blob),
spend hundreds of examples shrinking where a run costs 0.1 – 1 s, and is a test-only dependency
while ``declop sim`` is a command. The schedules are small (at most ``World.max_faults`` faults),
so this bounded search finds the needed faults in a handful of runs.

Invariants:
- at most ``runs`` runs (:data:`RUNS`): the cost of a shrink is bounded by that many runs of the seed;
- a try counts as failing only when its first violation is of the same property as the
  original's (a smaller schedule that fails otherwise is another bug, not this one);
- the shrunk result's :meth:`~declop.testing.simulation.world.WorldResult.repro` line reproduces it;
- the runs are silent (the ``declop`` logger is muted while they run, then put back).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from declop.errors import ConfigError
from declop.testing.simulation.leases import Fault

if TYPE_CHECKING:
    from declop.registry import Registry
    from declop.testing.simulation.world import WorldResult

__all__ = ["MIN_LENGTH", "RUNS", "UNSHORTENED", "Shrunk", "parse_fault", "parse_only", "shrink"]

#: the most runs one shrink takes
RUNS = 12
#: a fault is not shortened below this many virtual seconds
MIN_LENGTH = 0.1
#: kinds whose length is no duration, never shortened: a compaction has none, a ``rollout``'s is
#: the scale of its new Lease timings
UNSHORTENED = ("compact", "rollout")


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The smallest failing run a shrink found (``result``; ``original`` itself when nothing
    could go), and how many runs it took."""

    original: WorldResult
    result: WorldResult
    runs: int
    #: False: the run budget ended the search early
    complete: bool

    @property
    def smaller(self) -> bool:
        return self.result is not self.original

    def report(self) -> tuple[str, ...]:
        """What the shrink found, its faults, and the line that reproduces it."""
        prop = self.original.violations[0].invariant
        n, m = len(self.result.faults), len(self.original.faults)
        budget = "" if self.complete else f", stopped at the bound of {RUNS} runs"
        if not self.smaller:
            head = f"shrunk ({self.runs} run(s){budget}): nothing could go — each of its {m} fault(s) is needed for {prop} to fail"
        elif n == 0:
            head = f"shrunk ({self.runs} run(s){budget}): {prop} fails without any fault"
        else:
            head = f"shrunk ({self.runs} run(s){budget}): {prop} still fails with {n} of its {m} fault(s)"
            if self.result.world.faults is not None:
                head += ", shortened"
        lines = [head + ":"]
        lines += [f"  {f}" for f in self.result.faults]
        lines.append(f"  {self.result.repro()}")
        return tuple(lines)


def shrink(failed: WorldResult, registry: Registry | None = None, crds: Sequence[Any] = (), runs: int = RUNS) -> Shrunk:
    """The smallest schedule of ``failed``'s seed found, in at most ``runs`` runs, that fails
    with the same property first (see the module docstring)."""
    from declop.testing.simulation import world as simworld

    if failed.ok:
        return Shrunk(failed, failed, 0, True)
    prop = failed.violations[0].invariant
    spent = 0
    logger = logging.getLogger("declop")
    level = logger.level

    def fails(world: simworld.World) -> WorldResult | None:
        nonlocal spent
        spent += 1
        result = simworld.run(world, failed.seed, registry, crds)
        return result if not result.ok and result.violations[0].invariant == prop else None

    best = failed
    logger.setLevel(logging.CRITICAL + 1)
    try:
        world = failed.world
        if failed.faults:  # 1. none at all
            tried = fails(dataclasses.replace(world, faults=None if world.faults is None else (), only=() if world.faults is None else None))
            if tried is not None:
                return Shrunk(failed, tried, spent, True)
        kept = list(range(len(failed.faults)))  # indices into failed.faults
        base = dataclasses.replace(world, faults=tuple(failed.faults), only=None)  # the same schedule, spelled out
        for index in list(kept) if len(kept) > 1 else []:  # 2. drop each in turn
            if spent >= runs:
                return Shrunk(failed, best, spent, False)
            trial = [i for i in kept if i != index]
            tried = fails(_subset(world, base, failed, trial))
            if tried is not None:
                kept, best = trial, tried
        faults = [failed.faults[i] for i in kept]
        for i, f in enumerate(list(faults)):  # 3. shorten each
            for share in (0.25, 0.5):
                length = round(max(MIN_LENGTH, f.length * share), 3)
                if f.kind in UNSHORTENED or length >= f.length:
                    break
                if spent >= runs:
                    return Shrunk(failed, best, spent, False)
                shorter = [*faults[:i], dataclasses.replace(f, length=length), *faults[i + 1 :]]
                tried = fails(dataclasses.replace(base, faults=tuple(shorter)))
                if tried is not None:
                    faults, best = shorter, tried
                    break
        return Shrunk(failed, best, spent, True)
    finally:
        logger.setLevel(level)


def _subset(world: Any, base: Any, failed: WorldResult, kept: list[int]) -> Any:
    """The world that runs only ``failed``'s faults ``kept``: by ``--only`` indices into the seed's
    own schedule when it was drawn from the seed, else spelled out."""
    if world.faults is None:
        drawn = list(world.only) if world.only is not None else list(range(len(failed.faults)))
        return dataclasses.replace(world, only=tuple(drawn[i] for i in kept))
    return dataclasses.replace(base, faults=tuple(failed.faults[i] for i in kept))


def parse_only(text: str | None) -> tuple[int, ...] | None:
    """``--only``: ``"0,2"`` → ``(0, 2)``; ``"none"`` (or ``""``) → ``()``; None → None (all).

    Raises:
        ConfigError: not a comma-separated list of fault indices.
    """
    if text is None:
        return None
    if text.strip() in ("", "none"):
        return ()
    try:
        return tuple(int(i) for i in text.split(",") if i.strip())
    except ValueError:
        raise ConfigError(f"--only {text}: want the indices of the seed's faults to keep, comma-separated (0,2), or none") from None


def parse_fault(text: str, kinds: Sequence[str]) -> Fault:
    """``--fault AT:KIND:REPLICA:LENGTH`` (``12.3:crash:1:0.5``) → a :class:`Fault`.

    Raises:
        ConfigError: not four fields, a number that is not one, or a kind not in ``kinds``.
    """
    parts = text.split(":")
    try:
        at, kind, replica, length = parts
        fault = Fault(float(at), kind, int(replica), float(length))
    except ValueError:
        raise ConfigError(f"--fault {text}: want AT:KIND:REPLICA:LENGTH, e.g. 12.5:crash:1:0.5 (virtual seconds, a replica index)") from None
    if fault.kind not in kinds:
        raise ConfigError(f"--fault {text}: unknown fault kind {fault.kind!r}; choose from {', '.join(kinds)}")
    return fault
