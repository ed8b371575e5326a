"""``declop sim``: handler files run by several replicas in a simulated cluster, on virtual time,
under faults drawn from each seed, with the invariants checked (docs/simulation.md)."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from declop.cli.exits import setup_logging
from declop.cli.help import Command
from declop.cli.run import require_registrations
from declop.errors import ConfigError
from declop.loader import load
from declop.registry import default_registry

__all__ = ["sim"]


@click.command(
    cls=Command,
    examples=(
        "declop sim handlers.py --replicas 3 --seeds 1000     # 1000 fault schedules; prints each failing seed",
        "declop sim handlers.py --seed 17                     # one schedule: its first violation, the object's history, shrunk",
        "declop sim handlers.py --seed 17 --only 1 -v         # the shrunk schedule again, with declop's log lines",
        "declop sim handlers.py --allow idempotence --allow quiescence:heartbeat   # silence a property on purpose",
        "declop sim handlers.py --mode sharded --shards 4 --seeds 100",
    )
)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-m", "--module", "modules", multiple=True, help="Import handlers from a module (repeatable).")
@click.option("--replicas", type=int, default=3, show_default=True, help="Replicas (managers) in the simulated cluster.")
@click.option("--seeds", type=int, default=100, show_default=True, help="Schedules to run (seeds from --start).")
@click.option("--start", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--seed", type=int, default=None, help="Run this one seed: its faults, first violation and object history; shrunk if it fails.")
@click.option("--mode", type=click.Choice(["leader", "sharded"]), default="leader", show_default=True, help="Leader election, or --shards ranges.")
@click.option("--shards", type=int, default=4, show_default=True, help="Hash ranges with --mode sharded.")
@click.option("--objects", type=int, default=200, show_default=True, help="Objects of the primary resource the workload creates.")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Virtual seconds of workload and faults.")
@click.option("--objects-from", "objects_from", default=None, metavar="MODULE:FUNCTION",
              help="Your own objects: a function (random.Random, index) -> the object's body, or a list of bodies (module:name or file.py:name).")
@click.option("--faults", default=None, help="Fault kinds to draw from, comma-separated (default: hang, fail, cut, slow, pause, crash, compact and crash-between-writes, which kills a replica between two handler writes; name pause-at-write, term, term-in-call, stuck, delete, hang-leases, partition-holder, pause-holder, rollout, wall-jump, errors or unsynced to add the protocol-placed ones, and clocks for nodes whose clocks disagree).")
@click.option("--only", default=None, metavar="I,J", help="Keep only these of each seed's faults, by index (0,2), or none: a shrunk schedule.")
@click.option("--fault", "fault", multiple=True, metavar="AT:KIND:REPLICA:LENGTH",
              help="Run this fault instead of the seed's (repeatable): a shrunk schedule with shortened faults.")  # fmt: skip
@click.option("--allow", "allow", multiple=True, metavar="PROPERTY[:HANDLER]",
              help="Allow a property of the handlers on purpose (quiescence, idempotence, conflicts, ownership, crash-safety, finalizers), everywhere or for one "
                   "handler (registration name); counted and reported as allowed, never failing. Repeatable.")  # fmt: skip
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the seeds in this many processes (one per core: a seed's run is the same wherever it runs).")  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Print declop's log lines, each with its virtual time and replica.")
def sim(paths: tuple[str, ...], modules: tuple[str, ...], replicas: int, seeds: int, start: int, seed: int | None, mode: str,
        shards: int, objects: int, duration: float, faults: str | None, only: str | None, fault: tuple[str, ...],
        allow: tuple[str, ...], verbose: bool, jobs: int = 1, objects_from: str | None = None) -> None:  # fmt: skip
    """Run handler PATHS and -m modules in a simulated cluster: several replicas, on virtual
    time, under faults drawn from each seed (partitions, pauses, crashes, compaction), with a
    workload of creates, updates, deletes and re-creates of the objects the handlers watch (their
    resources, namespaces, label and field selectors); check the invariants (no two replicas
    reconcile one object at once, every watched object reconciled, every deletion delivered,
    finalizers released only after a successful cleanup) and the properties of the handlers:
    quiescence (their writes stop once the workload and faults do: no hot loop) and idempotence
    (one more reconcile of a converged world changes nothing), and crash safety (a replica killed
    between two writes of a reconcile leaves no duplicate child nor lost cleanup). Every seed is bounded in steps and
    virtual time. Prints each failing seed's repro line and the handler's line that made the
    offending write, and the schedules per second; exit 1 if any failed. --seed N runs one seed
    and prints its faults, its first violation, the history of the object it is about (the
    workload's changes, the handler calls and their writes) and, shrunk, the fewest and
    shortest faults that still fail it, with their own repro line. --allow silences a property on
    purpose. See docs/simulation.md.
    """
    from declop.dev.manifests import from_models
    from declop.testing.simulation import world as simworld
    from declop.testing.simulation.allow import Allow
    from declop.testing.simulation.shrink import parse_fault, parse_only, shrink

    if not paths and not modules:
        raise ConfigError("nothing to simulate: pass handler files (declop sim handlers.py) or -m module")
    if verbose:
        setup_logging("text", 1, False)
        for handler in logging.getLogger().handlers:
            if getattr(handler, "_declop", False):
                handler.addFilter(_virtual)
    else:
        logging.getLogger("declop").setLevel(logging.CRITICAL + 1)  # the faults make errors on purpose
    loaded = load(paths, modules)
    require_registrations({"paths": paths, "modules": modules}, default_registry)
    crds = [m.obj for m in from_models(loaded, default_registry)]
    kinds = tuple(k for k in (faults or ",".join(simworld.DEFAULT_KINDS)).split(",") if k)
    unknown = sorted(set(kinds) - set(simworld.WORLD_KINDS))
    if unknown:
        raise ConfigError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(simworld.WORLD_KINDS)}")
    allowed = Allow.parse(allow, {r.name for r in default_registry.registrations})
    if objects_from is not None:
        from declop.testing.simulation.objects import maker

        maker(objects_from)  # a name that does not resolve: one line now, not a traceback per seed
    own = tuple(parse_fault(f, simworld.WORLD_KINDS) for f in fault) or None
    simworld.check_replicas(own, replicas)
    world = simworld.World(mode=mode, replicas=replicas, shards=shards, objects=objects, duration=duration, kinds=kinds,
                           handlers=" ".join([*paths, *(f"-m {m}" for m in modules)]), only=parse_only(only),
                           faults=own, allow=allowed.specs(),
                           objects_from=objects_from)  # fmt: skip
    if seed is not None:
        result = simworld.run(world, seed, default_registry, crds)
        click.echo(result.report())
        if not result.ok:
            click.echo("\n".join(shrink(result, default_registry, crds).report()))
        sys.exit(0 if result.ok else 1)
    failed = simworld.run_seeds(world, range(start, start + seeds), default_registry, crds=crds, jobs=jobs)
    sys.exit(1 if failed else 0)


def _virtual(record: logging.LogRecord) -> bool:
    """``-v``'s lines in a simulated run: each prefixed with its virtual time and replica
    (``t=12.345 r0``), to read beside the report's history table."""
    from declop.testing.simulation.loop import actor

    try:
        now = asyncio.get_running_loop().time()
    except RuntimeError:
        return True
    who = actor()
    record.msg = f"t={now:.3f} {who.name if who is not None else '-'} {record.msg}"
    return True
