"""The simulated world: real managers of several replicas in one process, on virtual time, under faults.

    python -m declop.testing.simulation.world --mode sharded --seed 7
    declop sim handlers.py --replicas 3 --seeds 1000

Where :mod:`declop.testing.simulation.leases` runs only the Lease code with fake calls, a world run (:func:`run`)
starts N real :class:`~declop.manager.Manager` objects — informers, the shared cache, workqueues,
controllers, finalizers, the fences, leader election or shard Leases — on one
:class:`~declop.testing.simulation.loop.VirtualLoop`, each replica's tasks under its own
:class:`~declop.testing.simulation.loop.Actor`:

- **the apiserver** is :class:`~declop.testing.fakes.apiserver.FakeApiServer`: paged LISTs with continue
  tokens, watches (with bookmarks, the streaming list and its initial-events-end bookmark, an
  in-stream 410 once the resourceVersion is older than the bounded history), deletionTimestamp
  and finalizers, Leases with resourceVersion-checked updates. Each replica reaches it through a
  :class:`WorldTransport` — ``request(...)`` and ``stream(...)``, the two seams of
  :class:`~declop.kube.transport.Transport` — with its network faults; a manager is given the
  transport, the discovery, the Lease clocks (the loop's time, a virtual wall clock) and the
  executor of plain handlers (``Manager(transport=, discovery=, clock=, wall_clock=, executor=)``).
  No socket, no thread: uuids and every random stream come from the seed, so a run is a pure
  function of its :class:`World` and seed.
- **handlers**: ``async def`` handlers run on the loop after a virtual duration drawn from the
  seed; plain ``def`` handlers run *inline* on the loop's thread (:class:`InlineExecutor`: the
  executor job runs at once, its blocking client's requests complete without waiting —
  ``ClientContext.inline``) and their job ends a drawn virtual duration later. The built-in
  handler (no handlers file) reconciles ``widgets.example.com``: it writes its own status and a
  child ConfigMap, fails now and then, sometimes runs long, and owns a finalizer whose cleanup
  deletes the child.
- **the workload**, from the seed: creates, spec updates, deletes, and deletes followed by a
  re-create of the same name, by an administrator (straight to the apiserver). With a handlers
  file, its objects fit what the registrations watch (:mod:`declop.testing.simulation.workload`:
  namespaces, labels, fields), and objects outside every filter are owed nothing; their bodies
  and updates (spec, metadata or status) come from :mod:`declop.testing.simulation.objects` (varied and
  some invalid typed specs, or the project's own generator), and an object that fails its model
  is owed nothing either.
- **faults**, from the seed, per replica (:data:`WORLD_FAULTS`): partitions (requests hang, fail,
  or lose their answers; watches stall or break), slow requests, pause and resume, crash and
  restart with empty memory, and ``compact`` (the apiserver forgets its watch history: watches
  and continue tokens get 410).

Invariants, checked while the run goes and at its end (each violation is a
:class:`~declop.testing.simulation.leases.Violation`):

- **I2** a handler call starts only while the apiserver's record of the Lease covering its key
  (the leader Lease, or the key's range Lease) names the replica and is unexpired (its last
  write + ``leaseDurationSeconds``);

- **I1** no two live replicas run a handler call of one controller for the same namespace/name at
  once (sharded, two controllers' ranges of one key may have two owners) — across a
  delete + re-create too (a replica paused since its call began is excused: only fenced writes
  stop it, contract.md §7). The documented exception, sharded by uid: when a name is deleted and
  created again, the old object's ``DELETED`` call (``obj`` is None) may overlap the new
  object's calls (two uids, so two ranges) — and without a finalizer any call of the old object
  may; with ``World(strict=True)`` it is a violation too (that is how the overlap was shown);
- **I3** from :data:`SETTLE` lease durations after the last fault healed and the workload
  stopped, every object's last spec change has been seen by a handler call (its
  resourceVersion or a later one, of the same uid), and nothing is left being deleted — with a
  handlers file, whose predicates may drop the workload's updates (annotations), every object
  (uid) has been seen by a call at least once;
- **I4** every deletion of an object a handler saw reaches a handler: when a controller's
  finalizer held the object, its cleanup ran and returned before the object went; otherwise a
  call of that key started after the deletion (an object deleted before any handler saw it —
  before its finalizer was added — has nothing to clean up, and may go unseen). The documented
  exception (contract.md §7), sharded: a deletion without a finalizer is owed only by the replica
  that owned the object's range when it happened and still owns it at the end (same process);
  one made while nobody owned the range, or whose owner lost the range (a crash, a partition, a
  pause) is not delivered by the next owner; in leader mode, one is owed only when the leader
  at the end is a process that was watching when it happened (a restarted one lists after the
  object went) (``World(strict=True)`` checks them all);
- **I8** a controller's finalizer leaves an object only after a cleanup call of that object (its
  uid, DELETING) returned without an exception;
- **T1** (timers, :mod:`declop.handlers.timers`) no grid index of an object (its uid) fires twice,
  across replicas and incarnations (an attempt whose function raised is retried by design and
  does not count; one that ended with ``TerminalError`` does); **T2** a tick fires only while the apiserver's record of the
  Lease covering its key names the replica and is unexpired (I2 at the moment of the tick). Each
  replica incarnation gets a runner of its own (a process's memory), on the virtual wall clock.
- **I9** no two live replicas run a daemon (``@declop.daemon``) of the same namespace/name at
  once, from its first run until it ended (a replica paused since its daemon started is excused,
  as for I1), and no daemon of an object runs once the object is gone;
- **I10** (``World(filtered=True)``: a ``labels=`` controller that reads its own object with
  ``client.get(request)``, so two informers of one resource — the filtered one that wakes it and
  the unfiltered one its reads start — with ``watch_lag`` delivering each watch's events after
  delays of its own) from :data:`SETTLE` lease durations after the last fault healed, every
  object in the filter has its child holding its spec's value and no other object has a child:
  no change was left unreconciled, the changes that moved an object out of the filter too (a
  move out of it is a deletion without a finalizer to the controller: sharded, I4's exception);
- **I13** (:mod:`declop.testing.simulation.metrics`) every replica runs with a metrics registry,
  and what it says of each controller's workqueue agrees with the queue — adds and retries
  counted exactly when the queue counts them, the depth, gets and dones, wait and work times
  within the replica's uptime, the in-flight gauges — when the process ends and at the end of the
  run, where nothing is left in flight;
- **I14** leader-only ``@declop.background`` tasks (``World(background=True)``'s, or a handlers
  file's): no two live replicas run one at once (a replica paused since its task began is
  excused, as for I1), and none of its writes reaches the apiserver unless the apiserver's record
  of the Lease it runs under — the leader Lease, or sharded the background Lease of the same
  name — names its replica and is unexpired.

The built-in handler comes in shapes (:class:`World`): ``async def`` on the priority queue (the
default), a plain ``def`` (``plain``: the controller runs its calls in batches on the executor;
each job is a greenlet on the loop's thread that runs one call for its drawn duration while the
loop goes on, so a slow call stalls its batch and the keys behind it are given back, as beside a
thread), and a FIFO queue (``fifo``: the plain :class:`~declop.queue.workqueue.WorkQueue`); and
``background`` adds a leader-only background task that writes a ConfigMap every 0.2–2 s.

With a handlers file, the properties of :mod:`declop.testing.simulation.props` too: **quiescence** (no
handler write changes anything from :data:`~declop.testing.simulation.props.QUIET_AFTER` lease
durations after the workload and faults stopped, for a quiet window of one lease duration; the
run ends at the first that does) and **idempotence** (then one more reconcile of every cached
object changes nothing), and, with the garbage collector of :mod:`declop.testing.simulation.gc` running
from ownerReferences, **ownership** (once settled, no child a handler created is left without
the primary it was created for), with replicas killed right after some handler writes
(:mod:`declop.testing.simulation.crash`, the kind ``crash-between-writes`` of :data:`WORLD_KINDS`),
**crash safety** (no duplicate child, no lost cleanup), and **finalizers**
(:mod:`declop.testing.simulation.finalizers`: once settled, no object held by a handler's finalizer is
still being deleted while its last cleanup call raised; some handler deletes lose their answer
after they were applied). Every write a handler call sends is recorded with its call and the
handler's lines; each object's last rows — the workload's changes, the calls, their writes — are
kept for the report (:mod:`declop.testing.simulation.history`), and a property the user allows on purpose
(``World.allow``, :mod:`declop.testing.simulation.allow`) is kept apart as allowed instead of failing. Every seed is bounded (:func:`bounds`): steps — turns of the
:class:`WorldLoop`, handler calls, requests — and virtual time; :attr:`WorldResult.ended` says
what ended it.
"""

# size: the world — its transport, executor, replicas, workload, faults, invariants and command
# line — in one module, read top to bottom like declop.testing.simulation.leases.

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import itertools
import logging
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Sequence

from declop import collector
from declop.errors import ApiError, ConfigError, Fenced, Forbidden, NotFound, TerminalError
from declop.handlers.daemons import DaemonRunner
from declop.handlers.timers import TimerRunner, current_tick
from declop.kube import fencing
from declop.kube.fencing import WriteFence
from declop.kube.keys import Request, key_of
from declop.kube.transport import StreamIdle, StreamInterrupted
from declop.leases.leader import LEASE_TIMINGS
from declop.leases.watchdog import EXIT_BOUND, Watchdog
from declop.lifecycle import Hook
from declop.manager import Manager, Options
from declop.reconcile._filters import in_filter
from declop.reconcile.registration import Registration
from declop.reconcile.result import Phase
from declop.registry import Registry
from declop.registry.decorators import background as declop_background
from declop.serving.metrics import Metrics
from declop.testing.fakes import apiserver
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.leases import Fault, Violation, _virtual_time, report_text
from declop.testing.simulation.allow import Allow
from declop.testing.simulation.conflicts import Conflicts
from declop.testing.simulation.crash import CRASH_BETWEEN_WRITES, Crashes, crash_safety
from declop.testing.simulation.finalizers import Cleanups
from declop.testing.simulation.gc import collect, ownership
from declop.testing.simulation.history import History
from declop.testing.simulation.loop import Actor, VirtualLoop, actor
from declop.testing.simulation.metrics import problems as metrics_problems
from declop.testing.simulation.props import CALL, QUIET_AFTER, Bounds, Call, Write, Writes, target, user_frames
from declop.testing.simulation.objects import Objects, label, maker
from declop.testing.simulation.workload import Scope, scope, spec_schema, valid

__all__ = [
    "CLOCKS", "DEFAULT_KINDS", "DRIFT", "PROTOCOL_FAULTS", "WORLD_KINDS", "SETTLE", "STEPS_PER_OBJECT", "STEPS_PER_PERIODIC", "STEPS_PER_REPLICA", "WORLD_FAULTS", "InlineExecutor", "World", "WorldLoop",
    "WorldResult", "WorldTransport", "bounds", "builtin_registry", "calm", "main", "run", "run_many", "run_seeds", "shrink",
]

#: what a seed may draw
WORLD_FAULTS = ("hang", "fail", "cut", "slow", "pause", "crash", "compact")
#: faults placed by the protocol or the process's life, drawn after those (and only when named,
#: so that the default schedules of every seed stay what they were): a pause of the replica
#: between its next fenced write's check and the send; SIGTERM, whose grace may end before
#: the manager's own stop does (then SIGKILL); an administrator's delete of a held Lease; the
#: replica's next call stuck for one to three lease durations, deaf to cancellation (a plain
#: handler's thread that runs on); and both at once: SIGTERM half a second into such a call, so
#: the stop's drain ends with the call still running under its Lease; and a hang of the
#: replica's Lease requests only (its Lease lane), while its other requests — a call's writes —
#: go through
PROTOCOL_FAULTS = ("pause-at-write", "term", "delete", "stuck", "term-in-call", "hang-leases", "wall-jump", "rollout", "partition-holder", "pause-holder", "errors", "unsynced")
#: ``partition-holder`` (and 3 ``rollout``\ s in 4, once the first replica is rolled): a
#: partition of a replica that holds a Lease, placed by the protocol — it starts right after that
#: replica's next successful Lease write, so the fence it keeps open for a renew deadline and
#: the others' wait for the record to expire start together, and every margin between them is
#: the only thing that keeps the two apart; ``pause-holder``: the same, with SIGSTOP for half a
#: lease duration to two (across the renew deadline and the record's expiry: on SIGCONT what
#: became ready meanwhile runs in order, a call's write and the renewal loop's wake-up alike)
#: ``errors``: for one to three lease durations, one request of the replica in three (or, half
#: the time, every one: an apiserver shedding all load) — a Lease request, a list, a watch, a
#: call's read or write — is answered 429 (Retry-After: 1 s), 503, or, for a write, 500 after
#: the apiserver applied it (the answer lost, the change made).
#: ``WorldTransport`` stands in for the whole ``Transport``, whose own retries of 429/503 are
#: not modelled: what a caller gets here is what it gets once those ran out
ERROR_SHARE = 1 / 3
#: ``unsynced``: the replica restarts (as a new pod, 1–6 s later) with caches that never sync —
#: every list and watch of a resource it reconciles is answered 403, as after an RBAC change
#: that dropped it — until its next restart; its Lease requests go through
#: a world whose replicas' clocks disagree (named like a fault kind, drawn once per seed rather
#: than placed in time): each node's Lease clock runs at its own rate, within :data:`DRIFT` of
#: true time, from its own origin, and its wall clock at its own rate from its own offset (up to
#: :data:`WALL_SKEW` either way); ``wall-jump`` then steps a node's wall clock (an NTP step, an
#: operator setting the date) by up to an hour either way
CLOCKS = "clocks"
#: the bound on a Lease clock's rate error the world draws from (and the protocol is held to):
#: far past real quartz (NTP keeps a clock within 500 ppm), and well inside what the Lease
#: protocol tolerates — two replicas are safe while the ratio of their rates stays below
#: lease duration / renew deadline (1.5 with the defaults), here at most 1.15 / 0.85 ≈ 1.35
DRIFT = 0.15
WALL_SKEW = 600.0
#: ``rollout``: the Deployment rolls every replica, one every this many seconds (SIGTERM with
#: the chart's 10 s grace, a new pod 1–6 s after the old one ends), to Lease timings scaled by
#: the fault's length (a rollout that changes ``--lease-duration``/``--renew-deadline``/
#: ``--retry-period``); the two settings overlap until the last replica is rolled
ROLLOUT_STEP, ROLLOUT_GRACE = 20.0, 10.0
ROLLOUT_SCALES = (0.5, 0.75, 1.5, 2.0)
#: what a run draws when not told: the uniform faults, and the kinds a handlers file's
#: properties inject (simcrash: a kill between two writes of a reconcile), not drawn by
#: :func:`schedule`
DEFAULT_KINDS = WORLD_FAULTS + (CRASH_BETWEEN_WRITES,)
#: what ``--faults`` may name
WORLD_KINDS = DEFAULT_KINDS + PROTOCOL_FAULTS + (CLOCKS,)
#: the I3 bound: lease durations after the last fault healed (and the workload stopped)
SETTLE = 4
#: the step bound, in steps (a turn of the loop, a handler call or a request) per virtual second
#: of the run, per replica and per object: runs of the built-in handler and the examples take
#: some 4 times fewer (~22,000 steps for 3 replicas, 200 objects, 185 virtual seconds, sharded)
STEPS_PER_REPLICA, STEPS_PER_OBJECT = 60, 1.5
#: and per object of each timer or daemon registration (examples/kopf/14_daemons.py, two
#: daemons per object — one a thread waking every 5 s of real time —: ~180,000 steps a run)
STEPS_PER_PERIODIC = 5
RESOURCE = "widgets.example.com"
FINALIZER = "sim.example.com/cleanup"
#: the label of the filtered world's ``labels=`` controller (``World(filtered=True)``)
SELECTED = "sim.example.com/selected"
NAMESPACES = ("ns-a", "ns-b", "ns-c", "ns-d", "ns-e", "ns-f", "ns-g", "ns-h")
LEASE_NAMESPACE = "sim"
_EPOCH = 1_800_000_000.0
#: the executor running a plain handler's job inline, while it runs (its client's requests then
#: complete without waiting)
_INLINE: contextvars.ContextVar[InlineExecutor | None] = contextvars.ContextVar("declop_sim_inline", default=None)
#: the built-in leader-only background task's ConfigMap (``World(background=True)``), in ``default``
HEARTBEAT = "heartbeat"
#: the leader-only background task running in this context (its name), for I14's write check
_BACKGROUND: contextvars.ContextVar[str | None] = contextvars.ContextVar("declop_sim_background", default=None)


@dataclass(frozen=True)
class World:
    """What one world run simulates."""

    mode: str = "leader"  # "leader" or "sharded"
    shard_by: str = "uid"  # the built-in handler's (a handlers file's registrations say theirs)
    replicas: int = 3
    shards: int = 4
    objects: int = 200
    duration: float = 60.0
    lease_duration: float = LEASE_TIMINGS.lease_duration
    renew_deadline: float = LEASE_TIMINGS.renew_deadline
    retry_period: float = LEASE_TIMINGS.retry_period
    max_faults: int = 4
    kinds: tuple[str, ...] = DEFAULT_KINDS
    faults: tuple[Fault, ...] | None = None
    only: tuple[int, ...] | None = None
    #: a handlers file (``declop sim``); None: the built-in widgets handler
    handlers: str | None = None
    #: properties of the handlers allowed on purpose (``--allow``: ``"idempotence"``,
    #: ``"quiescence:heartbeat"``; :mod:`declop.testing.simulation.allow`)
    allow: tuple[str, ...] = ()
    #: the built-in handler uses a finalizer (cleanup on delete)
    finalizer: bool = True
    #: the apiserver serves ``shardSelector`` (sharded informers filter server-side)
    server_filter: bool = False
    #: check I1 without the documented exception for ``shard_by="uid"`` (the overlap of a
    #: name's old object's calls and its new object's, contract.md §7)
    strict: bool = False
    #: the built-in handlers include a daemon per object (checked by I9)
    daemons: bool = False
    #: the built-in handler is a ``labels=`` controller (``SELECTED=true``, no finalizer) that reads
    #: its own object with ``client.get(request)`` (odd names: ``client.list(namespace=)``): two
    #: informers of one resource, the filtered one that wakes it and the unfiltered one its reads
    #: start; the workload moves objects in and out of the filter, and I10 checks every child says
    #: what its object says
    filtered: bool = False
    #: each watch stream delivers each event after its own random delay, up to this many seconds
    #: (0: at once), so two informers of one resource see a change at different moments
    watch_lag: float = 0.0
    #: the built-in handler is a plain ``def`` (the controller hands its calls to the executor in
    #: batches, :mod:`declop.queue.batches`), not an ``async def``
    plain: bool = False
    #: the built-in handler's queue is FIFO (``priority=False``: the plain
    #: :class:`~declop.queue.workqueue.WorkQueue`), not the default priority queue
    fifo: bool = False
    #: the built-in handlers include a leader-only ``@declop.background`` task that writes a
    #: ConfigMap now and then (checked by I14)
    background: bool = False
    #: a handlers file's objects: a project's generator (``module:function``, a callable, or a
    #: list of bodies to cycle; :mod:`declop.testing.simulation.objects`), or None: drawn from the model
    objects_from: Any = None

    def repro(self, seed: int) -> str:
        default = World()
        if self.handlers is not None:
            line = f"declop sim {self.handlers} --seed {seed}"
            for f in ("mode", "replicas", "shards", "objects", "duration"):
                if getattr(self, f) != getattr(default, f):
                    line += f" --{f} {getattr(self, f):g}" if not isinstance(getattr(self, f), str) else f" --{f} {getattr(self, f)}"
            if self.objects_from is not None:
                line += f" --objects-from {label(self.objects_from)}"
        else:
            line = f"python -m declop.testing.simulation.world --seed {seed}"
            for f in ("mode", "shard_by", "replicas", "shards", "objects", "duration"):
                v = getattr(self, f)
                if v != getattr(default, f):
                    line += f" --{f.replace('_', '-')} {v if isinstance(v, str) else format(v, 'g')}"
            if not self.finalizer:
                line += " --no-finalizer"
            if self.strict:
                line += " --strict"
            if self.server_filter:
                line += " --server-filter"
            if self.daemons:
                line += " --daemons"
            if self.filtered:
                line += " --filtered"
            if self.plain:
                line += " --plain"
            if self.fifo:
                line += " --fifo"
            if self.background:
                line += " --background"
            if self.watch_lag:
                line += f" --watch-lag {self.watch_lag:g}"
        if self.kinds != default.kinds:
            line += f" --faults {','.join(self.kinds)}"
        if self.allow:
            line += f" --allow {','.join(Allow.parse(self.allow).specs())}"
        if self.faults is not None:  # a schedule of its own (a shrunk one: shorter faults)
            line += "".join(f" --fault {_num(f.at)}:{f.kind}:{f.replica}:{_num(f.length)}" for f in self.faults) or " --only none"
        if self.only is not None:
            line += f" --only {','.join(map(str, self.only)) or 'none'}"
        return line


def _num(x: float) -> str:
    """A fault's time or length as a repro line spells it: its 3 decimals, without trailing zeros."""
    return f"{x:.3f}".rstrip("0").rstrip(".") or "0"


@dataclass
class WorldResult:
    world: World
    seed: int
    faults: list[Fault]
    violations: list[Violation]
    calls: int = 0
    requests: int = 0
    #: timer ticks fired (T1, T2)
    ticks: int = 0
    #: what ended the run: "end" (its checks ran), "quiescence" (a write after the quiet bound),
    #: "steps" or "time" (its :class:`~declop.testing.simulation.props.Bounds`)
    ended: str = "end"
    #: loop turns taken, and the seed's bounds
    steps: int = 0
    bounds: Bounds | None = None
    #: the handlers' writes (a handlers file's run): changing and not
    writes: str = ""
    #: violations of properties allowed on purpose (``World.allow``): the first of each
    #: (property, handler), counted, never failing the seed
    allowed: list[Violation] = field(default_factory=list)
    #: the history of the object the first violation is about (:mod:`declop.testing.simulation.history`)
    history: tuple[str, ...] = ()
    #: writes of leader-only background tasks that reached the apiserver (I14)
    background_writes: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def repro(self) -> str:
        return self.world.repro(self.seed)

    def report(self) -> str:
        counts = f"handler calls: {self.calls}, requests: {self.requests}"
        if self.writes:
            counts += f"\n{self.writes}"
        if self.background_writes:
            counts += f", background task writes: {self.background_writes}"
        if self.bounds is not None:
            counts += f"\nended: {self.ended}, at {self.steps:,} of {self.bounds.steps:,} steps, bound t={self.bounds.seconds:.3f}"
        text = report_text(self.repro(), self.faults, counts, self.violations)
        allowed = [f"allowed on purpose (--allow {','.join(self.world.allow)}), not failing the seed:", *(f"  {v}" for v in self.allowed)]
        return "\n".join([text, *self.history, *(allowed if self.allowed else [])])


def schedule(world: World, rng: random.Random) -> list[Fault]:
    """The faults of one run, drawn from ``rng`` (sorted by time)."""
    faults = []
    kinds = tuple(k for k in world.kinds if k in WORLD_FAULTS)
    for _ in range(rng.randint(0, world.max_faults) if kinds else 0):
        kind = rng.choice(kinds)
        at = round(rng.uniform(0, world.duration), 3)
        length = round(rng.choice((rng.uniform(0.1, 3.0), rng.uniform(3.0, 2 * world.lease_duration))), 3)
        faults.append(Fault(at, kind, rng.randrange(world.replicas), 0.0 if kind == "compact" else length))
    placed = tuple(k for k in world.kinds if k in PROTOCOL_FAULTS)
    for _ in range(rng.randint(1, 2) if placed else 0):  # after the others: their draws stay as they were
        kind, at = rng.choice(placed), round(rng.uniform(0, world.duration), 3)
        if kind == "rollout":  # early: both timings then run while the workload does
            at = round(at / 4, 3)
        if kind in ("term", "term-in-call"):
            # the grace before SIGKILL, against the manager's own 5 s: the chart's (+5 s) or
            # shorter, or much longer (a Deployment of one's own, `declop run` under systemd)
            length = round(rng.choice((rng.uniform(0.1, 10.0), rng.uniform(10.0, 60.0))), 3)
        elif kind == "pause-at-write":
            length = round(rng.uniform(0.5, 2 * world.lease_duration), 3)
        elif kind == "pause-holder":
            length = round(rng.uniform(0.5 * world.lease_duration, 2 * world.lease_duration), 3)
        elif kind in ("stuck", "hang-leases", "partition-holder", "errors"):
            length = round(rng.uniform(world.lease_duration, 3 * world.lease_duration), 3)
        elif kind == "wall-jump":  # seconds, either way
            length = round(rng.choice((-1.0, 1.0)) * rng.uniform(1.0, 3600.0), 3)
        elif kind == "rollout":  # the new timings' scale
            length = rng.choice(ROLLOUT_SCALES)
        else:
            length = 0.0
        faults.append(Fault(at, kind, rng.randrange(world.replicas), length))
    return sorted(faults, key=lambda f: (f.at, f.kind, f.replica))


# --------------------------------------------------------------------------- the built-in handler


def builtin_registry(world: World) -> Registry:
    """The built-in workload's handler: writes its status and a child ConfigMap; fails 1 call in
    10; with ``world.finalizer`` its cleanup deletes the child."""
    registry = Registry()
    finalizer = FINALIZER if world.finalizer and not world.filtered else None
    labels = f"{SELECTED}=true" if world.filtered else None

    def decide(request: Request, client: Any, obj: Any, phase: Phase) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """What the call writes: its child's body (None: the child goes) and its status patch
        (None: the status says it already); raises 1 call in 10."""
        rng = random.Random(f"{request}-{(obj or {}).get('metadata', {}).get('resourceVersion')}-{asyncio.get_running_loop().time()}")
        if rng.random() < 0.1:
            raise RuntimeError("the handler failed (simulated)")
        if world.filtered:  # what controller-runtime's reconcilers do: read the object by its key
            if int(request.name[1:]) % 2:  # or from a list of the namespace, for odd names
                obj = next((o for o in client.list(namespace=request.namespace) if o["metadata"]["name"] == request.name), None)
            else:
                try:
                    obj = client.get(request)
                except NotFound:
                    obj = None
            if obj is not None and not _selected(obj):
                obj = None  # it left the filter: its child goes
        if obj is None or phase is Phase.DELETING:
            return None, None
        value = str((obj.get("spec") or {}).get("value"))
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{request.name}-child", "namespace": request.namespace}, "data": {"value": value}}
        return child, None if (obj.get("status") or {}).get("value") == value else {"status": {"value": value}}

    settings = dict(finalizer=finalizer, labels=labels, shard_by=world.shard_by, owns=["configmaps"], max_concurrent=4)
    if world.fifo:
        settings["priority"] = False
    if world.plain:  # the same, blocking: the controller runs its calls in batches on the executor

        @registry.reconciler(RESOURCE, **settings)
        def widgets(request: Request, client: Any, obj: Any, phase: Phase) -> None:
            child, patch = decide(request, client, obj, phase)
            if child is None:
                client.delete("configmaps", Request(request.namespace, f"{request.name}-child"))
                return
            client.apply(child)
            if patch is not None:
                client.patch_status(request, patch)

    else:

        @registry.reconciler(RESOURCE, **settings)
        async def widgets(request: Request, client: Any, obj: Any, phase: Phase) -> None:  # noqa: F811 - one of the two
            child, patch = decide(request, client, obj, phase)
            if child is None:
                await client.delete("configmaps", Request(request.namespace, f"{request.name}-child"))
                return
            await client.apply(child)
            if patch is not None:
                await client.patch_status(request, patch)

    if world.daemons:

        @registry.daemon(RESOURCE, shard_by=world.shard_by, stop_timeout=2.0, backoff=1.0)
        async def widget_daemon(request: Request, stop: asyncio.Event, retry: int) -> None:
            rng = random.Random(f"{request}-{retry}-{asyncio.get_running_loop().time()}")
            if rng.random() < 0.1:
                raise RuntimeError("the daemon failed (simulated)")
            try:
                await asyncio.wait_for(stop.wait(), rng.uniform(5, 60))  # or returns on its own
            except asyncio.TimeoutError:
                return

    if world.background:

        @declop_background(name="heartbeat", registry=registry)
        async def heartbeat(client: Any, stop: asyncio.Event) -> None:
            """Every 0.2–2 s, the beat's count in ConfigMap ``default/heartbeat`` (I14 holds
            its writes to the Lease it runs under). It sleeps as most such loops do, with
            ``asyncio.sleep``: one turn of the loop after its timer, it writes."""
            beat = 0
            while not stop.is_set():
                await asyncio.sleep(random.Random(f"heartbeat-{beat}-{asyncio.get_running_loop().time()}").uniform(0.2, 2.0))
                beat += 1
                body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": HEARTBEAT, "namespace": "default"}, "data": {"beat": str(beat)}}
                await client.apply(body)

    return registry


async def _run_on(seconds: float) -> None:
    """A ``stuck`` call: ``seconds`` of work that cancellation does not stop (a thread runs on);
    then it goes on to its writes, which the write fence judges."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            pass


def _selected(obj: Any) -> bool:
    """The filtered world's filter: ``SELECTED=true``."""
    return bool(((obj.get("metadata") or {}).get("labels") or {}).get(SELECTED) == "true")


# --------------------------------------------------------------------------- replicas


@dataclass
class _Replica:
    index: int
    gen: int = 0
    actor: Actor | None = None
    manager: Manager | None = None
    #: the manager's metrics registry (I13) and its Lease clock's reading when it was made
    metrics: Metrics | None = None
    born: float = 0.0
    net: str = "ok"  # "ok", "hang", "fail", "cut"
    slow: float = 0.0
    #: (controller, key) -> when its running call started, when it ends (inf: not known yet), the uid it has
    calls: dict[tuple[str, Request], tuple[float, float, str | None]] = field(default_factory=dict)
    paused: list[list[float]] = field(default_factory=list)
    #: key -> when its running daemon first ran (I9)
    daemons: dict[Request, float] = field(default_factory=dict)
    #: leader-only background task name -> when it began to run on this replica (I14)
    background: dict[str, float] = field(default_factory=dict)
    #: the manager's stop (what its SIGTERM handler sets); a new one per incarnation
    stop: asyncio.Event | None = None
    #: a ``pause-at-write`` armed: the length of the pause its next fenced write takes
    pause_at_write: float = 0.0
    #: Lease name -> when this incarnation last wrote it (I5's exemption for a pause since)
    lease_written: dict[str, float] = field(default_factory=dict)
    #: Lease name -> the call of this incarnation that still ran under it, paused, when another
    #: replica took it: once resumed, the incarnation owes an exit (I5's bound after a pause)
    owed_exit: dict[str, str] = field(default_factory=dict)
    #: a ``stuck`` armed: how long its next call runs on; with ``term-in-call``, the grace of the
    #: SIGTERM that follows that call's start
    stuck: float = 0.0
    #: a ``stuck`` fault's planned end (its draw plus its length): its call runs on no later
    #: (the run's settling counts from there); 0 for ``term-in-call``'s, which has its own span
    stuck_until: float = 0.0
    term_grace: float = 0.0
    #: ``declop run``'s watchdog of this incarnation (armed at a loss)
    watchdog: Watchdog | None = None
    #: ``hang-leases``: until when this replica's Lease requests hang (the node's, across restarts)
    leases_hang_until: float = 0.0
    #: the node's clocks (``clocks``; kept across restarts): the Lease clock reads
    #: ``origin + rate * t``, the wall clock ``epoch + wall_offset + wall_rate * t + wall_jump``
    #: (t: true, virtual time); the replica's timers run at ``rate`` too (:class:`WorldLoop`)
    rate: float = 1.0
    origin: float = 0.0
    wall_rate: float = 1.0
    wall_offset: float = 0.0
    wall_jump: float = 0.0
    #: ``rollout``: the scale of the Lease timings its next incarnation starts with
    scale: float = 1.0
    #: ``unsynced``: this incarnation's lists and watches are refused (403), and whether the
    #: next one's will be
    never_sync: bool = False
    unsynced_next: bool = False
    #: ``errors``: until when a share of this replica's requests is answered with an error
    errors_until: float = 0.0
    errors_share: float = 0.0
    #: ``partition-holder`` armed: the length of the partition its next Lease write starts, until
    #: when that write may come (a write after it starts none), and how: "all" its requests,
    #: its "leases" lane only (its calls' writes go through), or a "pause" (SIGSTOP)
    partition_next: tuple[float, float, str] = (0.0, 0.0, "")

    @property
    def name(self) -> str:
        return f"r{self.index}#{self.gen}"

    @property
    def alive(self) -> bool:
        return self.actor is not None and not self.actor.dead

    def was_paused(self, since: float) -> bool:
        return any(until > since for _, until in self.paused)


class WorldTransport:
    """One replica's way to the simulated apiserver (``request`` and ``stream``, like
    :class:`~declop.kube.transport.Transport`), with its network faults."""

    host = "https://apiserver.sim"
    observer: Callable[[str, int], None] | None = None

    def __init__(self, world: _World, replica: _Replica) -> None:
        self.world, self.replica = world, replica
        self.actor = replica.actor

    async def close(self) -> None:
        """Closing the connections waits while the network hangs or cuts (a TLS close that gets no
        answer); the manager bounds it."""
        while self.replica.net in ("hang", "cut") and not self._gone():
            await asyncio.sleep(0.5)

    def _gone(self) -> bool:
        return self.replica.actor is not self.actor or not self.replica.alive

    async def request(
        self, method: str, path: str, *, params: Any = None, body: Any = None, content_type: str | None = None,
        accept: str | None = None, timeout: float = 30.0, lane: str = "handler",
    ) -> Any:  # fmt: skip
        w, r = self.world, self.replica
        w.requests += 1
        w.loop.turns += 1  # type: ignore[attr-defined]  # a step of the step bound
        call = CALL.get()
        # a handler's write: who sent it, from which line of user code (the stack is here)
        origin = (call, user_frames()) if call is not None and method != "GET" and w.user and "/events" not in path else None
        # the write fence of the call sending it, checked as the real Transport does: before the
        # send (here) and once more when the request has its connection (FencedConnector: in
        # _wire, after the first half of the latency, right before the apiserver applies it)
        fence = fencing.current() if method != "GET" else None
        if fence is not None:
            w.check_fence(fence, method, path)
        if _INLINE.get() is not None:  # a plain handler's request: no latency, no waiting
            if r.net != "ok" or self._gone():
                raise ApiError(0, "Unreachable", f"{method} {path}: connection refused")
            refused, applied = w.error_answer(r, method, path)
            if refused is not None and not applied:
                raise refused
            result = await w.serve(method, path, params, body, content_type, origin, (r, fence, call), _BACKGROUND.get())
            if refused is not None:
                raise refused
            return result
        answer: asyncio.Future[Any] = w.loop.create_future()
        if not (lane == "leader" and w.now() < r.leases_hang_until):  # hang-leases: no answer, nothing applied
            w.spawn(self._wire(answer, method, path, params, body, content_type, origin, fence, call, _BACKGROUND.get()))
        try:
            return await asyncio.wait_for(answer, timeout)
        except asyncio.TimeoutError:
            raise ApiError(0, "Timeout", f"{method} {path} timed out after {timeout} s") from None

    async def _wire(self, answer: asyncio.Future[Any], method: str, path: str, params: Any, body: Any, content_type: str | None,
                    origin: tuple[Call, tuple[str, ...]] | None = None, fence: WriteFence | None = None,
                    call: Call | None = None, background: str | None = None) -> None:  # fmt: skip
        w, r = self.world, self.replica
        latency = w.rng.uniform(0.0005, 0.005) + (w.rng.uniform(0, r.slow) if r.slow else 0.0)
        if self._gone() or r.net == "hang":
            return
        if r.net == "fail":
            await asyncio.sleep(latency / 4)
            if not answer.done():
                answer.set_exception(ApiError(0, "Unreachable", f"{method} {path}: connection refused"))
            return
        await asyncio.sleep(latency / 2)
        if self._gone() or r.net == "hang":
            return
        if (fence is not None or call is not None or background is not None) and method != "GET" and r.pause_at_write:
            await w.pause_here(r)  # stopped after the Transport's check, waiting for its connection
            if self._gone():
                return
        error: BaseException | None = None
        try:
            if fence is not None:
                w.check_fence(fence, method, path)  # the pool's check, with the connection in hand
            refused, applied = w.error_answer(r, method, path)
            if refused is None and r.never_sync and method == "GET" and w.a_list(path):
                refused = Forbidden(f"{path}: forbidden (unsynced: this replica's lists are refused)")
            if refused is not None and not applied:
                raise refused
            result = await w.serve(method, path, params, body, content_type, origin, (r, fence, call), background)
            if refused is not None:
                raise refused
        except (ApiError, Fenced) as exc:
            error = exc
        await asyncio.sleep(latency / 2)
        if r.net in ("hang", "cut") or answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    async def stream(
        self,
        path: str,
        params: Any,
        *,
        read_timeout: float = 90.0,
        total_timeout: float | None = None,
        accept: str | None = None,
        bulk: Callable[[], bool] | None = None,  # reads are not modelled: lines come one by one
    ) -> AsyncIterator[bytes]:
        w, r = self.world, self.replica
        w.requests += 1
        await asyncio.sleep(w.rng.uniform(0.0005, 0.005))
        if r.net == "fail" or self._gone():
            raise ApiError(0, "Unreachable", f"watch {path}: connection refused")
        refused, _ = w.error_answer(r, "GET", path)
        if refused is not None:
            raise refused
        if r.never_sync and w.a_list(path):
            raise Forbidden(f"watch {path}: forbidden (unsynced: this replica's watches are refused)")
        # a partition stalls the stream; TCP delivers once it heals, unless the read timeout
        # ends the wait first (no answer yet: Unreachable; an answer had begun: idle)
        if not await self._healed(read_timeout):
            raise ApiError(0, "Unreachable", f"watch {path}: no response within {read_timeout} s")
        lines = w.server.watch(path, params)
        if w.world.watch_lag:
            lines = self._delayed(lines)
        try:
            async for line in lines:
                if r.net == "fail":
                    raise StreamInterrupted(0, "Interrupted", f"watch {path}: connection lost")
                if not await self._healed(read_timeout):
                    raise StreamIdle(0, "Idle", f"watch {path}: no data for {read_timeout} s")
                yield line
        finally:
            await lines.aclose()

    async def _delayed(self, lines: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """``lines``, each delivered ``watch_lag`` × a draw of this stream's own after the server
        sent it, in order (a line never overtakes the one before): the server's side is read
        at once, so delays do not add up over a burst (a streaming list's initial events)."""
        w = self.world
        lags = random.Random(f"lag-{w.seed}-{w.streams}")
        w.streams += 1
        sent: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()

        async def read() -> None:
            try:
                async for line in lines:
                    sent.put_nowait((w.now() + lags.uniform(0, w.world.watch_lag), line))
            except Exception as exc:  # noqa: BLE001 - handed to the reader, as the stream would raise it
                sent.put_nowait((w.now(), exc))
            finally:
                sent.put_nowait((w.now(), None))

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                due, line = await sent.get()
                if due > w.now():
                    await asyncio.sleep(due - w.now())
                if line is None:
                    return
                if isinstance(line, Exception):
                    raise line
                yield line
        finally:
            reader.cancel()
            await asyncio.wait([reader])  # its read of ``lines`` ends before ``lines`` is closed
            await lines.aclose()

    async def _healed(self, limit: float) -> bool:
        """Wait while this replica's network hangs or loses answers, at most ``limit`` seconds."""
        r = self.replica
        until = self.world.now() + limit
        while r.net in ("hang", "cut"):
            if self.world.now() >= until:
                return False
            await asyncio.sleep(min(0.5, until - self.world.now()))
        return True


class InlineExecutor(concurrent.futures.Executor):
    """Runs a plain handler's executor job at once on the loop's thread (no thread: a run stays
    deterministic); the job's future is running from the start (a worker cancelled meanwhile
    abandons it, as a thread's) and completes after the virtual durations its handler calls
    drew (:attr:`owed`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, steps: bool = False) -> None:
        self.loop = loop
        self.owed = 0.0
        #: each job a greenlet on the loop's thread that a call :meth:`park`\ s for its duration
        #: (the loop runs on meanwhile, as beside a thread): a batch's later calls start later,
        #: so its stall watch sees a slow call and gives the keys behind it back
        self.steps = steps
        #: the jobs that have not returned (parked: running a call, or their process killed):
        #: held here so that no garbage collection ends one in the middle of a run
        self.jobs: set[Any] = set()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # taken by a "thread" at once: it cannot be cancelled
        if self.steps:
            return self._stepped(future, fn, args, kwargs)
        self.owed = 0.0
        token = _INLINE.set(self)
        try:
            result: Any = fn(*args, **kwargs)
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting worker, as a thread would
            error = exc
        finally:
            _INLINE.reset(token)

        def done() -> None:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self.loop.call_later(self.owed, done)
        return future

    def _stepped(self, future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any) -> concurrent.futures.Future[Any]:
        from greenlet import greenlet  # the test extra: only World(plain=True) steps

        def job() -> None:
            token = _INLINE.set(self)
            try:
                result: Any = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting worker, as a thread would
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                _INLINE.reset(token)
                self.jobs.discard(g)

        g = greenlet(job)
        g.gr_context = contextvars.copy_context()  # the submitting worker's (its replica's actor)
        self.jobs.add(g)
        g.switch()  # runs until its first call parks, or to its end
        return future

    def park(self, seconds: float) -> None:
        """In a stepped job: the call runs for ``seconds`` of its node's time; the loop goes on and
        resumes the job then (held while its replica is paused, never once it is killed)."""
        from greenlet import getcurrent

        g = getcurrent()
        self.loop.call_later(seconds, g.switch)
        g.parent.switch()

    def close(self) -> None:
        """End the jobs that never returned (their process was killed), at a chosen moment rather
        than whenever the collector finds them."""
        for g in list(self.jobs):
            g.throw()
        self.jobs.clear()


class WorldLoop(VirtualLoop):
    """The world's loop: what a plain handler's job hands back to the loop
    (``call_soon_threadsafe`` while :class:`InlineExecutor` runs it — the waiter of
    :func:`declop.reconcile._run.hand_off`) arrives when the job's drawn duration has passed, as
    from a thread that ran that long. Without this a plain handler took no virtual time: one that
    wakes itself (a hot loop) ran for ever at one virtual instant."""

    #: steps so far (turns of the loop; the world adds its handler calls and requests); at
    #: ``max_turns``, or once the clock passed ``max_time``, :attr:`exhausted` is called (once),
    #: at the next turn (no timer of its own: one more timer in the heap would move the purges
    #: of cancelled timers, and with them the order of timers due at one instant)
    turns = 0
    max_turns = 0
    max_time = float("inf")
    exhausted: Callable[[], None] | None = None
    #: actor name -> the rate of its node's clock (``clocks``): a delay it sleeps is measured on
    #: its own clock, so it takes ``delay / rate`` of true time (deadlines set with ``call_at``
    #: from the loop's time stay true-time: asyncio's timeouts; nothing of the Lease code's)
    rates: dict[str, float] = {}

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.TimerHandle:  # type: ignore[override]
        if self.rates and delay:
            who = context.run(actor) if context is not None else actor()
            if who is not None:
                delay = delay / self.rates.get(who.name, 1.0)
        return super().call_later(delay, callback, *args, context=context)

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None) -> asyncio.Handle:  # type: ignore[override]
        inline = _INLINE.get()
        if inline is not None and inline.owed > 0:
            return self.call_later(inline.owed, callback, *args, context=context)
        return super().call_soon_threadsafe(callback, *args, context=context)

    def _run_once(self) -> None:
        self.turns += 1
        if (self.turns >= self.max_turns or self._virtual_now > self.max_time) and self.exhausted is not None:
            self.exhausted()
            self.exhausted = None
        super()._run_once()


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a plain handler's client request to completion at once (``ClientContext.inline``)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise ApiError(0, "Timeout", "the request would have to wait (a plain handler's request in the simulator)")


# --------------------------------------------------------------------------- the world


class _World:
    def __init__(self, world: World, seed: int, loop: VirtualLoop, registry: Registry, crds: Sequence[Any] = ()) -> None:
        self.world, self.seed, self.loop = world, seed, loop
        self.rng = random.Random(f"net-{seed}")
        self.durations = random.Random(f"durations-{seed}")
        self.server = FakeApiServer()
        self.server.shard_selectors = world.server_filter
        for crd in crds:
            self.server.seed(crd)
        self.violations: list[Violation] = []
        self.replicas = [_Replica(i) for i in range(world.replicas)]
        if CLOCKS in world.kinds:  # from a stream of its own: every other draw stays as it was
            clocks = random.Random(f"clocks-{seed}")
            for r in self.replicas:
                r.rate, r.origin = 1.0 + clocks.uniform(-DRIFT, DRIFT), clocks.uniform(0.0, 1e6)
                r.wall_rate, r.wall_offset = 1.0 + clocks.uniform(-DRIFT, DRIFT), clocks.uniform(-WALL_SKEW, WALL_SKEW)
            loop.rates = {f"r{r.index}": r.rate for r in self.replicas}
        self.by_actor: dict[Actor, _Replica] = {}
        self.requests = 0
        self.calls = 0
        self.streams = 0  # watch streams opened (each draws its delays from its own stream)
        self._neutral = contextvars.Context()
        #: (uid, timer, grid index) -> the replica that fired it (T1)
        self.ticks: dict[tuple[str, str, int], str] = {}
        #: (replica index, incarnation, timer) -> that process's runner of the timer
        self.timers: dict[tuple[int, int, str], TimerRunner] = {}
        self.registry = self._instrument(registry)
        #: a handlers file runs (``declop sim``): its predicates may drop the workload's updates
        self.user = world.handlers is not None
        regs = self.registry.registrations
        self.primary = regs[0].resource
        self.finalizers = {r.finalizer for r in regs if r.finalizer}
        #: finalizer -> the filter of its labels=/fields= registration: an object that leaves it
        #: with the finalizer on has it released after a DELETED call (I8's exception)
        self.filters = {r.finalizer: in_filter(r.labels, r.fields) for r in regs if r.finalizer and (r.labels or r.fields)}
        #: key -> when a filter's registration last saw it leave (the workload), and when a
        #: DELETED call of it last returned
        self.left_filter: dict[Request, float] = {}
        self.deleted_returned: dict[Request, float] = {}
        #: the documented exception to I1 applies (sharded by uid): a name's old object's
        #: DELETED call (``obj`` None) may overlap its new object's calls; without a finalizer
        #: any call of the old object may (with one, its cleanup keeps the name taken)
        by_uid = [r for r in regs if r.shard_by == "uid"] if world.mode == "sharded" and not world.strict else []
        self.by_uid = bool(by_uid)
        self.by_uid_bare = any(not r.finalizer for r in by_uid)
        self.excused = 0  # I1 overlaps excused by it
        #: key -> (uid, resourceVersion) of the last spec change the workload made
        self.want: dict[Request, tuple[str, int]] = {}
        #: (key, uid) -> the highest resourceVersion a handler call was given
        self.seen: dict[tuple[Request, str], int] = {}
        #: uids whose cleanup (a DELETING call) returned without an exception
        self.cleaned: set[str] = set()
        #: deletions: key, uid, when, the number of calls started before it, whether a
        #: controller's finalizer held the object, and who owned its range then
        self.deletions: list[tuple[Request, str, float, int, bool, tuple[_Replica, int, int] | None]] = []
        #: key -> the sequence numbers (``calls`` when it started) of its calls
        self.started: dict[Request, list[int]] = {}
        self.last_change = 0.0
        #: Lease name -> (holder, when the apiserver applied its last write, its duration): the
        #: apiserver's record (a deleted Lease keeps its last one, as in declop.testing.simulation.leases)
        self.leases: dict[str, tuple[str, float, float]] = {}
        #: writes sent under a call's fence that reached the apiserver, and writes it refused
        self.fenced_writes = self.fenced = 0
        #: writes of leader-only background tasks that reached the apiserver (I14)
        self.background_writes = 0
        #: unguarded deletions made while no replica owned the object's range (sharded): not
        #: delivered, by the contract (§7: use a finalizer when a deletion must be acted on)
        self.unowned_deletions = 0
        #: the filtered world: key -> who owned its range when its object last left the filter
        #: (or was deleted in it), as for ``deletions``, and the replica incarnations alive then
        self.left: dict[Request, tuple[tuple[_Replica, int, int] | None, frozenset[tuple[int, int]]]] = {}
        #: the filtered world: names created more than once (two uids: sharded by uid, two ranges)
        self.created: set[Request] = set()
        self.recreated: set[Request] = set()
        #: leader mode: (key, uid) of a deletion -> the incarnations watching then (:meth:`_kept`)
        self.knew: dict[tuple[Request, str], frozenset[tuple[int, int]]] = {}
        #: the workload's namespaces and which objects the handlers watch (their registrations)
        self.scope = scope(regs, self.primary, NAMESPACES) if self.user else Scope(NAMESPACES, ())
        #: a handlers file's objects: varied specs its CRD accepts (some broken), or a project's own
        schema = spec_schema(crds, self.primary) if self.user else None
        self.objects = Objects(schema, lambda obj: valid(regs, self.primary, obj), random.Random(f"objects-{seed}"),
                               maker(world.objects_from), label(world.objects_from) if world.objects_from is not None else "")  # fmt: skip
        #: the handlers' writes (simprops: quiescence, idempotence)
        self.writes = Writes()
        #: the handlers' writes refused with 409, 429 or 5xx while the workload runs (simconflicts)
        self.conflicts = Conflicts(seed)
        #: replicas killed between two writes of a reconcile while the workload runs (simcrash)
        self.crashes = Crashes(seed, world.duration) if self.user and CRASH_BETWEEN_WRITES in world.kinds else None
        #: the cleanup calls' outcomes, and handler deletes whose answer is lost (simfinalizers)
        self.cleanups = Cleanups(seed)
        #: a changing handler write from then on fails quiescence (set once the run knows when
        #: the workload and the faults stop; inf while the idempotence check runs)
        self.quiet_from = float("inf")
        #: when the workload and the faults stopped (the quiescence report's reference)
        self.calm_at = 0.0
        #: (controller, key) queued again by the idempotence check, not yet reconciled
        self.pending: set[tuple[str, Request]] = set()
        self.checking = False
        #: what ended the run: "end", or what :meth:`halt` was told ("quiescence", "steps", "time")
        self.ended = "end"
        #: the task running the world (:func:`_main`), cancelled by :meth:`halt`
        self.main: asyncio.Task[None] | None = None
        #: what the user allows on purpose, and the first allowed violation of each (property, handler)
        self.allow = Allow.parse(world.allow)
        self.allowed: list[Violation] = []
        #: handlers whose late writes are allowed (``quiescence:HANDLER``): no longer watched
        self.quiet_excused: set[str] = set()
        #: each object's last rows: the workload's changes, handler calls, their writes (reports)
        self.history = History()
        #: timers and daemons: periodic by design, their writes are not held to quiescence
        #: every replica incarnation's executor of plain handlers' jobs (:meth:`executor`)
        self.executors: list[InlineExecutor] = []
        self.periodic = {r.name for r in registry.registrations if isinstance(getattr(r.fn, "__self__", None), (TimerRunner, DaemonRunner))}

    # -- plumbing -------------------------------------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro, context=self._neutral)

    def now(self) -> float:
        return self.loop.time()

    def wall(self) -> float:
        return _EPOCH + self.loop.time()

    def lease_clock(self, r: _Replica) -> Callable[[], float]:
        """The Lease clock of ``r``'s node (the loop's own time when clocks agree)."""
        if r.rate == 1.0 and r.origin == 0.0:
            return self.loop.time
        loop = self.loop
        return lambda: r.origin + r.rate * loop.time()

    def wall_clock(self, r: _Replica) -> Callable[[], float]:
        """The wall clock of ``r``'s node (the world's when nodes' clocks agree and never jump)."""
        if CLOCKS not in self.world.kinds and "wall-jump" not in self.world.kinds:
            return self.wall
        loop = self.loop
        return lambda: _EPOCH + r.wall_offset + r.wall_rate * loop.time() + r.wall_jump

    def violate(self, invariant: str, who: _Replica | str, detail: str) -> None:
        name = who if isinstance(who, str) else who.name
        self.violations.append(Violation(self.now(), invariant, name, detail))

    def info(self) -> Any:
        return self.server.discovery.resolve_cached(self.primary)

    def fail(self, violation: Violation) -> bool:
        """A property's violation: the run's (True), or, when the user allows it (``--allow``),
        kept as allowed — the first of its property and handler — and not failing (False)."""
        if self.allow and self.allow.covers(violation.invariant, violation.handler):
            if not any((a.invariant, a.handler) == (violation.invariant, violation.handler) for a in self.allowed):
                self.allowed.append(violation)
            return False
        self.violations.append(violation)
        return True

    def who(self) -> str:
        """The running replica's name (``r0#1``), for the history; "-" outside one."""
        a = actor()
        r = self.by_actor.get(a) if a is not None else None
        return r.name if r is not None else "-"

    # -- the apiserver, as every replica reaches it --------------------------------------------------
    def check_fence(self, fence: WriteFence, method: str, path: str) -> None:
        """The transport's fence check of a write (counted when it refuses)."""
        try:
            fence.check(method, path)
        except Fenced:
            self.fenced += 1
            raise

    def _check_fenced_write(self, r: _Replica, fence: WriteFence | None, call: Call | None, method: str, path: str) -> None:
        """I9 for writes: a write of a reconcile call reaches the apiserver only while the
        apiserver's record of the Lease covering the call — the one its fence was checked
        against, or, with no fence set, the one the call's key falls under — names its replica
        and is unexpired. (A Lease an administrator deleted keeps its last record until it is
        written again.)"""
        m = r.manager
        if m is None:
            return
        if fence is not None:
            name = fence.lease.rpartition("/")[2]
        else:
            assert call is not None
            lease = self._lease_of(r, call.key, None, call.controller)
            if lease is None:
                return  # no Lease covers it (a key whose range is not known): nothing to hold it to
            name = lease[0]
        self.fenced_writes += 1
        rec = self.leases.get(name)
        if rec is None or rec[0] not in _identities(m) or self.now() >= rec[1] + rec[2]:
            what = "no record" if rec is None else f"holder {rec[0][-8:]!r}, written at {rec[1]:.3f} for {rec[2]:g} s"
            key = fence.key if fence is not None else call.key if call is not None else "-"
            unfenced = "" if fence is not None else ", sent without a fence"
            self.violate("I9", r, f"{method} {path} of a call of {key} accepted under Lease {name} ({what}{unfenced})")

    def _check_background_write(self, r: _Replica, task: str, method: str, path: str) -> None:
        """I14 for writes: a write of a leader-only background task reaches the apiserver only
        while the apiserver's record of the Lease it runs under — the leader Lease, or in sharded
        mode the background Lease of the same name — names its replica and is unexpired."""
        m = r.manager
        if m is None:
            return
        name = m.options.leader_election_id
        mine = _identities(m)
        if m.background_elector is not None:
            mine.add(m.background_elector.identity)
        self.background_writes += 1
        rec = self.leases.get(name)
        if rec is None or rec[0] not in mine or self.now() >= rec[1] + rec[2]:
            what = "no record" if rec is None else f"holder {rec[0][-8:]!r}, written at {rec[1]:.3f} for {rec[2]:g} s"
            self.violate("I14", r, f"{method} {path} of background task {task!r} accepted under Lease {name} ({what})")

    def background_event(self, event: str, task: str) -> None:
        """I14: a leader-only background task began to run, or ended, on the running replica
        (an earlier incarnation's task, one that would not stop, is that process's: not this one's)."""
        who = actor()
        r = self.by_actor.get(who) if who is not None else None
        if r is None or not r.alive or r.actor is not who:
            return
        if event == "end":
            r.background.pop(task, None)
            return
        self._began(r, "background", task, "I14", f"background task {task!r}")

    def _began(self, r: _Replica, book: str, key: Any, invariant: str, what: str) -> None:
        """``what`` — work that runs on one live replica at a time (a daemon of an object, a
        leader-only background task) — began on ``r``: ``invariant`` fails for each other live
        replica that runs it and was not paused since it began there; then ``r`` runs it. ``book``
        names the replicas' record of it (``daemons``, ``background``)."""
        for other in self.replicas:
            if other is r or not other.alive:
                continue
            since = getattr(other, book).get(key)
            if since is None or other.was_paused(since):
                continue
            self.violate(invariant, r, f"{what} started while {other.name} runs it (since t={since:.3f})")
        getattr(r, book)[key] = self.now()

    def _check_handover(self, writer: _Replica, name: str, old: str, new: str) -> None:
        """I5 and I6 at the moment the record of Lease ``name`` stops naming ``old``: no live
        replica that held it as ``old`` still runs a call under it — I6 when it released the
        Lease itself (``new`` empty), I5 when another took it. Exempt, as in the Lease families:
        a replica paused since its own last write of that Lease (it could not act on the loss;
        the write fence stops what the call writes) — but a call of it that had not returned
        then leaves the replica owing an exit once it runs again (:meth:`_resumed`), whether the
        call or the Lease's renewal round goes first after the SIGCONT."""
        for r in self.replicas:
            m = r.manager
            if not r.alive or m is None or old not in _identities(m):
                continue
            if r.was_paused(r.lease_written.get(name, 0.0)):
                for (controller, key), (started, _ends, uid) in r.calls.items():
                    if new and self._lease_of(r, key, uid, controller) == (name, old):
                        r.owed_exit.setdefault(name, f"{key} (since t={started:.3f})")
                continue
            for (controller, key), (started, ends, uid) in r.calls.items():
                if ends <= self.now() or self._lease_of(r, key, uid, controller) != (name, old):
                    continue
                if not new and r is writer:
                    self.violate("I6", r, f"released Lease {name} while its call of {key} runs (since t={started:.3f})")
                elif new:
                    self.violate("I5", r, f"Lease {name} went to {new[-8:]!r} while {r.name}'s call of {key} runs under it (since t={started:.3f})")

    async def serve(self, method: str, path: str, params: Any, body: Any, content_type: str | None,
                    origin: tuple[Call, tuple[str, ...]] | None = None,
                    sender: tuple[_Replica, WriteFence | None, Call | None] | None = None,
                    background: str | None = None) -> Any:  # fmt: skip
        """One request, served; a write that takes a controller's finalizer off an object is
        checked against I8; a handler's write (``origin``: its call and user frames) is recorded,
        changed or not (the apiserver keeps the resourceVersion of a write that changes nothing);
        a write of a reconcile call (``sender``: its replica, the call's fence and the call) against
        I9, and one of a leader-only background task (``background``: its name) against I14."""
        if sender is not None and method != "GET" and background is not None:
            self._check_background_write(sender[0], background, method, path)
        elif sender is not None and method != "GET" and (sender[1] is not None or sender[2] is not None):
            self._check_fenced_write(sender[0], sender[1], sender[2], method, path)
        if origin is not None and self.now() < self.calm_at:
            self.refuse(method, path, *origin)
        before = None
        if method in ("PUT", "PATCH", "DELETE") and self.finalizers:
            before = self._stored(path)
        rv = self.server._last_rv
        result = await self.server.request(method, path, params=params, body=body, content_type=content_type)
        if origin is not None:
            self.wrote(method, path, result, self.server._last_rv != rv, *origin)
        if "/leases" in path and method in ("PUT", "POST") and isinstance(result, dict):
            spec = result.get("spec") or {}
            name, holder = result["metadata"]["name"], spec.get("holderIdentity") or ""
            before_rec = self.leases.get(name)
            self.leases[name] = (holder, self.now(), float(spec.get("leaseDurationSeconds") or 0))
            if sender is not None:
                sender[0].lease_written[name] = self.now()
                length, until, how = sender[0].partition_next
                if length and holder and self.now() <= until:
                    sender[0].partition_next = (0.0, 0.0, "")
                    if how == "leases":
                        sender[0].leases_hang_until = max(sender[0].leases_hang_until, self.now() + length)
                    elif how == "pause":
                        self.spawn(self._pause(sender[0], self.now(), length))
                    else:
                        self.spawn(self._partition(sender[0], length))
                if before_rec is not None and before_rec[0] and before_rec[0] != holder:
                    self._check_handover(sender[0], name, before_rec[0], holder)
        if before is not None:
            meta = before["metadata"]
            uid = meta.get("uid")
            after = self._stored(path)
            left = set(meta.get("finalizers") or ()) - set(((after or {}).get("metadata") or {}).get("finalizers") or ())
            if after is not None and (after.get("metadata") or {}).get("uid") != uid:
                left = set()
            if left & self.finalizers and uid not in self.cleaned and not self._left_released(path, before, left):
                self.violate("I8", "-", f"finalizer {sorted(left & self.finalizers)} left {meta.get('namespace')}/{meta.get('name')} (uid {uid[:8]}) before any cleanup of it returned")
        if origin is not None and self.now() < self.calm_at:  # finalizers: a delete applied, its answer lost
            lost = self.cleanups.lose(method, path)
            if lost is not None:
                raise lost
        return result

    def _left_released(self, path: str, before: Any, left: set[str]) -> bool:
        """I8's exception: every finalizer of ``left`` belongs to a ``labels=``/``fields=``
        registration whose filter ``before`` is outside, and a ``DELETED`` call of the object
        returned after it last left a filter (contract.md §4)."""
        if not all(f in self.filters and not self.filters[f](before) for f in left & self.finalizers):
            return False
        meta = before["metadata"]
        key = Request(meta.get("namespace") or "", meta["name"])
        at = self.left_filter.get(key)
        return at is not None and self.deleted_returned.get(key, -1.0) >= at

    def refuse(self, method: str, path: str, call: Call, trace: tuple[str, ...]) -> None:
        """Conflicts: raise the 409, 429 or 5xx this handler write is answered with, if drawn."""
        try:
            info, namespace, name, _sub = self.server._route(method, path)
            what = target(method, info.plural, namespace, name, None)
        except ApiError:
            what = path
        error = self.conflicts.answer(self.now(), method, what, call, trace)
        if error is not None:
            self.history.note(call.key, self.now(), self.who(), call.controller, f"  {method} {what}: answered {error.status} {error.reason}, not applied")
            raise error

    def a_list(self, path: str) -> bool:
        """``path`` lists (or watches) a collection other than Leases."""
        if "/leases" in path:
            return False
        try:
            _info, _namespace, name, _sub = self.server._route("GET", path)
        except ApiError:
            return False
        return name is None

    def error_answer(self, r: _Replica, method: str, path: str) -> tuple[ApiError | None, bool]:
        """``errors``: the error this request of ``r`` is answered with, if one is drawn, and
        whether the apiserver applies the request first (a write's 500 after commit)."""
        if self.now() >= r.errors_until or self.rng.random() >= r.errors_share:
            return None, False
        status = self.rng.choice((429, 503, 500))
        if status == 429:
            error = ApiError(429, "TooManyRequests", f"{method} {path}: the server has received too many requests and has asked us to try again later")
            error.retry_after = 1.0
            return error, False
        if status == 503:
            return ApiError(503, "ServiceUnavailable", f"{method} {path}: the server is currently unable to handle the request"), False
        return ApiError(500, "InternalError", f"{method} {path}: an error on the server has prevented the request from succeeding"), method != "GET"

    def gave_up(self, error: BaseException) -> None:
        """Conflicts: the running handler call ended with TerminalError (never retried)."""
        violation = self.conflicts.ended(self.now(), CALL.get(), error)
        if violation is not None and not self.fail(violation):
            self.conflicts.violation = None  # allowed: a later handler's give-up is still reported

    def _stored(self, path: str) -> Any:
        try:
            info, namespace, name, _sub = self.server._route("GET", path)
        except ApiError:
            return None
        if name is None or info.group_resource != self.info().group_resource:
            return None
        return self.server.store(info).get(Request(namespace, name))

    # -- handler calls ----------------------------------------------------------------------------
    def _instrument(self, registry: Registry) -> Registry:
        """A copy of ``registry`` whose handlers report their calls (and take a virtual duration)."""
        out = Registry()
        for reg in registry._registrations.values():
            runner = getattr(reg.fn, "__self__", None)
            if isinstance(runner, DaemonRunner):
                runner.observer = self.daemon_event
        out._registrations = {name: self._wrap(reg) for name, reg in registry._registrations.items()}
        out._indexes = list(registry._indexes)
        out._transforms = dict(registry._transforms)
        out._hooks = [self._wrap_hook(h) if h.kind == "background" and not h.every_replica else h for h in registry._hooks]
        return out

    def _wrap_hook(self, hook: Hook) -> Hook:
        """A leader-only background task that reports when it runs and marks its writes (I14)."""
        fn, name = hook.fn, hook.name

        async def task(**kw: Any) -> Any:
            self.background_event("start", name)
            token = _BACKGROUND.set(name)
            try:
                return await fn(**(kw if hook.wants is None else {k: v for k, v in kw.items() if k in hook.wants}))
            finally:
                _BACKGROUND.reset(token)
                self.background_event("end", name)

        return dataclasses.replace(hook, fn=task, wants=None)

    def _wrap(self, reg: Registration) -> Registration:
        fn, wants = reg.fn, reg.wants
        timer = getattr(fn, "__self__", None)
        if isinstance(timer, TimerRunner):
            fn = functools.partial(self._timer_call, reg.name, timer)
        # a timer's or a daemon's writes are periodic by design (and a daemon's task, started in
        # the call, would inherit it): no call recorded for them (quiescence, idempotence)
        records = not isinstance(timer, (TimerRunner, DaemonRunner))

        def pick(kw: dict[str, Any]) -> dict[str, Any]:
            return kw if wants is None else {k: v for k, v in kw.items() if k in wants}

        def duration() -> float:
            d = self.durations
            if d.random() < 0.02:
                return d.uniform(0.5, 5.0)  # a long call
            return d.uniform(0.001, 0.02) if d.random() < 0.8 else d.uniform(0.02, 0.2)

        if reg.is_async:
            async def handler(**kw: Any) -> Any:
                r, key, started = self.call_started(kw, None, reg.name)
                token = CALL.set(self.call_of(reg.name, kw["request"], started) if records else None)
                out: Any = None
                try:
                    await asyncio.sleep(duration())
                    hold = self.stuck_call() if records else 0.0
                    if hold:  # ``stuck``: this call runs on, deaf to cancellation, then goes on
                        await _run_on(hold)
                    out = await fn(**pick(kw))
                    self.call_returned(kw)
                    return out
                except BaseException as exc:
                    out = self.call_raised(reg.name, kw, exc)
                    raise
                finally:
                    self.conflicts.forget(CALL.get())
                    CALL.reset(token)
                    self.call_ended(r, key, started)
                    self.outcome(r, reg.name, kw["request"], out)

            wrapped: Callable[..., Any] = handler
        else:
            def plain(**kw: Any) -> Any:
                inline = _INLINE.get()
                d = duration()
                if inline is not None and inline.steps:  # the call runs d, then writes: the loop goes on
                    r, key, started = self.call_started(kw, d, reg.name)
                    inline.park(d)
                    self.loop.call_soon(self.call_ended, r, key, started)
                else:
                    if inline is not None:
                        inline.owed += d
                    r, key, started = self.call_started(kw, d, reg.name)
                    self.loop.call_later(inline.owed if inline else d, self.call_ended, r, key, started)
                token = CALL.set(self.call_of(reg.name, kw["request"], started) if records else None)
                out: Any = None
                try:
                    out = fn(**pick(kw))
                except BaseException as exc:
                    out = self.call_raised(reg.name, kw, exc)
                    raise
                finally:
                    self.conflicts.forget(CALL.get())
                    CALL.reset(token)
                    self.outcome(r, reg.name, kw["request"], out)
                self.call_returned(kw)
                return out

            wrapped = plain
        functools.update_wrapper(wrapped, fn)
        return dataclasses.replace(reg, fn=wrapped, wants=None)

    # -- timers (T1, T2) -------------------------------------------------------------------------
    def _timer_call(self, name: str, timer: TimerRunner, /, **kw: Any) -> Any:
        """A call of timer ``name``: this replica incarnation's own runner (a process's memory)."""
        who = actor()
        r = self.by_actor.get(who) if who is not None else None
        slot = (r.index, r.gen, name) if r is not None else (-1, 0, name)
        runner = self.timers.get(slot)
        if runner is None:
            user, wants = timer.fn, timer.wants

            def pick(k: dict[str, Any]) -> dict[str, Any]:
                return k if wants is None else {n: v for n, v in k.items() if n in wants}

            if asyncio.iscoroutinefunction(user):
                async def fire(**k: Any) -> Any:
                    slot = self.tick_fired(r, name, k)
                    try:
                        return await user(**pick(k))
                    except Exception as exc:
                        self.tick_failed(slot, exc)
                        raise

                recorded: Callable[..., Any] = fire
            else:
                def fire_plain(**k: Any) -> Any:
                    slot = self.tick_fired(r, name, k)
                    try:
                        return user(**pick(k))
                    except Exception as exc:
                        self.tick_failed(slot, exc)
                        raise

                recorded = fire_plain
            runner = self.timers[slot] = TimerRunner(recorded, timer.schedule, name=name, model=timer.model, clock=self.wall_clock(r) if r is not None else self.wall)
        return runner.handler(**kw)

    def tick_failed(self, slot: tuple[str, str, int], exc: Exception) -> None:
        """A tick whose function raised (not TerminalError) is retried, by design (docs/timers.md):
        that attempt does not count as the grid index fired, for T1."""
        if not isinstance(exc, TerminalError):
            self.ticks.pop(slot, None)

    def tick_fired(self, r: _Replica | None, name: str, kw: dict[str, Any]) -> tuple[str, str, int]:
        """T1 and T2 at the moment a tick's function is called; the tick's T1 slot."""
        key: Request = kw["request"]
        obj = kw.get("obj")
        meta = obj.get("metadata") if isinstance(obj, dict) else getattr(obj, "metadata", None)
        uid = (meta.get("uid") if isinstance(meta, dict) else getattr(meta, "uid", None)) or ""
        tick = current_tick()
        who = r.name if r is not None else "?"
        slot = (uid, name, -1 if tick is None else tick)
        first = self.ticks.get(slot)
        if first is not None:
            self.violate("T1", r or who, f"tick {tick} of {key} (uid {uid[:8]}) fired again; first on {first}")
        else:
            self.ticks[slot] = who
        if r is not None:
            self._check_lease(r, key, uid, name, "T2")
        return slot

    def call_started(self, kw: dict[str, Any], lasts: float | None = None, controller: str = "") -> tuple[_Replica | None, Any, float]:
        who = actor()
        r = self.by_actor.get(who) if who is not None else None
        key: Request = kw["request"]
        obj = _plain(kw.get("obj"))
        now = self.now()
        self.calls += 1
        self.loop.turns += 1  # type: ignore[attr-defined]  # a step of the step bound
        self.started.setdefault(key, []).append(self.calls)
        uid = None
        phase = kw.get("phase")
        what = f"call ({phase.name.lower() if isinstance(phase, Phase) else 'gone'}"
        if obj is not None:
            meta = obj.get("metadata") or {}
            uid = meta.get("uid") or ""
            k = (key, uid)
            self.seen[k] = max(self.seen.get(k, 0), int(meta.get("resourceVersion") or 0))
            what += f", rv {meta.get('resourceVersion')}"
        if self.checking and (controller, key) in self.pending:
            what += ", the idempotence check's one more"
        self.history.note(key, now, r.name if r is not None else "-", controller, what + ")")
        slot = (controller, key)  # two controllers of one key may run on two replicas (sharded)
        if r is None:
            return None, slot, now
        for other in self.replicas:
            if other is r or not other.alive:
                continue
            running = other.calls.get(slot)
            if running is None or running[1] <= now or other.was_paused(running[0]):
                continue
            if self.by_uid and (uid is None or running[2] is None or (self.by_uid_bare and uid != running[2])):
                self.excused += 1  # two objects of one name in two ranges (contract.md §7)
                continue
            self.violate("I1", r, f"a call of {key} started while {other.name} runs one (since t={running[0]:.3f})")
        self._check_lease(r, key, uid, controller)
        r.calls[slot] = (now, now + lasts if lasts is not None else float("inf"), uid)
        return r, slot, now

    def _lease_of(self, r: _Replica, key: Request, uid: str | None, controller: str) -> tuple[str, str] | None:
        """The Lease covering a call of ``key`` on ``r``, and ``r``'s identity in it (None: no Lease)."""
        m = r.manager
        if m is None:
            return None
        if m.elector is not None:
            return m.elector.name, m.elector.identity
        c = next((c for c in m.controllers if c.name == controller), None)
        s = c.shards if c is not None else None
        if c is None or s is None:
            return None
        book = c.gate.book  # the uid of a deleted object's key, from its last event
        value = key.namespace if s.shard_by == "namespace" else (uid or (book.uid_of(key, None) if book else None))
        if not value:
            return None
        e = s.electors[s.index(value)]
        return e.name, e.identity

    def _check_lease(self, r: _Replica, key: Request, uid: str | None, controller: str, invariant: str = "I2") -> None:
        """I2 (or ``invariant``): the apiserver's record of the Lease covering ``key`` names ``r`` and is unexpired."""
        lease = self._lease_of(r, key, uid, controller)
        if lease is None:
            return
        name, identity = lease
        rec = self.leases.get(name)
        if rec is None or rec[0] != identity or self.now() >= rec[1] + rec[2]:
            what = "no record" if rec is None else f"holder {rec[0][-8:]!r}, written at {rec[1]:.3f} for {rec[2]:g} s"
            doing = "a tick" if invariant == "T2" else "a call"
            self.violate(invariant, r, f"{doing} of {key} started under Lease {name} ({what})")

    def daemon_event(self, event: str, key: Request) -> None:
        """I9: a daemon of ``key`` began a run, or ended, on the replica of the running task (an
        earlier incarnation's daemon, one that would not stop, is that process's: not this one's)."""
        who = actor()
        r = self.by_actor.get(who) if who is not None else None
        if r is None or not r.alive or r.actor is not who:
            return
        if event == "end":
            r.daemons.pop(key, None)
            return
        if key in r.daemons:
            return  # restarted in place after a crash: the same daemon
        self._began(r, "daemons", key, "I9", f"a daemon of {key}")

    def call_of(self, controller: str, key: Request, started: float) -> Call:
        """The running call, as its writes are recorded (one queued by the idempotence check: extra)."""
        return Call(controller, key, started, self.checking and (controller, key) in self.pending)

    def wrote(self, method: str, path: str, result: Any, changed: bool, call: Call, trace: tuple[str, ...]) -> None:
        """A handler's write was applied; one that changed something after the quiet bound ends
        the run (quiescence)."""
        try:
            info, namespace, name, _sub = self.server._route(method, path)
            what = target(method, info.plural, namespace, name, result)
        except ApiError:
            what = path
        write = Write(self.now(), call, method, what, changed, trace)
        self.writes.note(write)
        self.history.note(call.key, self.now(), self.who(), call.controller, f"  {method} {what}: {'changed' if changed else 'no change'}")
        if self.crashes is not None and self.now() < self.calm_at and self.crashes.due(self.now(), write):
            self.crash_between_writes(write)
        if changed and self.now() >= self.quiet_from and call.controller not in self.quiet_excused:
            why = f"a write changed something {self.now() - self.calm_at:.3f} virtual s after the workload and the faults stopped at t={self.calm_at:.3f} (the bound: {self.quiet_from - self.calm_at:g} s)"
            violation = self.writes.quiescence(self.now(), self.calm_at, why, self.quiet_excused)
            if self.fail(violation):
                self.halt("quiescence")
            elif self.allow.covers("quiescence"):
                self.quiet_from = float("inf")  # allowed everywhere: the writes may go on
            else:
                self.quiet_excused.add(violation.handler)  # allowed for this handler: the others' still count

    def crash_between_writes(self, write: Write) -> None:
        """Crash safety: kill the replica running ``write``'s call now, start it again later."""
        call = write.call
        r = next((r for r in self.replicas if r.alive and r.calls.get((call.controller, call.key), (None,))[0] == call.started), None)
        if r is None:
            return
        reg = self.registry._registrations[call.controller]
        obj = self.server.store(reg.resource).get(call.key) if reg.finalizer else None
        meta = (obj or {}).get("metadata") or {}
        cleanup = meta.get("uid") if meta.get("deletionTimestamp") and reg.finalizer in (meta.get("finalizers") or ()) else None
        delay, a = self.crashes.crash(self.now(), write, r.name, cleanup), r.actor  # type: ignore[union-attr]
        self.kill(r)

        async def restart() -> None:
            await asyncio.sleep(delay)
            if r.actor is a:
                self.start(r)

        self.spawn(restart())

    def halt(self, why: str) -> None:
        """End the run now: :func:`_main` is cancelled where it waits, and ends the replicas."""
        self.quiet_from = float("inf")
        if self.ended == "end" and self.main is not None and not self.main.done():
            self.ended = why
            self.main.cancel()

    def exhausted(self) -> None:
        """The loop took its bound of steps (something never stops: a quiescence failure), or
        passed its bound of virtual time (the run ends, "time")."""
        loop = self.loop
        assert isinstance(loop, WorldLoop)
        now = self.now()
        if loop.turns < loop.max_turns:
            self.halt("time")
            return
        when = "after" if now >= self.calm_at else "before"
        why = f"the step bound ({loop.max_turns:,} steps: turns of the loop, handler calls, requests) was hit at t={now:.3f}, {when} the workload and the faults stopped (t={self.calm_at:.3f})"
        self.fail(self.writes.quiescence(now, self.calm_at if now >= self.calm_at else max(0.0, now - 10.0), why, self.quiet_excused))
        self.halt("steps")

    async def check_idempotence(self, deadline: float) -> None:
        """Idempotence: the world is quiet; queue one more reconcile of every object each live
        replica's controllers cache (a resync), wait until each ran once (or ``deadline``:
        the run ended by "time"), and report the first of their writes that changed something."""
        self.quiet_from = float("inf")
        self.checking = True
        for r in self.replicas:
            m = r.manager
            if m is None or not r.alive:
                continue
            for c in m.controllers:
                if c.name in self.periodic:
                    continue
                for informer in c.primary.informers:
                    for key in informer.store.keys():
                        if self.user and not valid(self.registry.registrations, self.primary, informer.store.get(key) or {}):
                            continue  # fails its model: its reconcile never calls the handler
                        self.pending.add((c.name, key))
                        c.queue.add(key)
        queued = self.now()
        while self.pending and self.now() < deadline:
            await asyncio.sleep(0.5)
        names = {name for name in self.registry._registrations if name not in self.periodic}
        for allowed in (False, True):  # the held handlers, then those allowed (--allow idempotence:H)
            group = {name for name in names if self.allow.covers("idempotence", name) == allowed}
            violation = self.writes.idempotence(self.now(), group) if group else None
            if violation is None:
                violation = self.unchecked(queued, {(c, k) for c, k in self.pending if c in group})
            if violation is not None:
                self.fail(violation)
        if self.pending:
            self.ended = "time"

    def unchecked(self, queued: float, pending: set[tuple[str, Request]]) -> Violation | None:
        """Idempotence, when some of the check's reconciles never ran by its deadline: which, and
        why — a call of that key still running (a handler call that never returns), or none
        started (the key is held back). Not knowing is a failure: the check cannot vouch for them."""
        if not pending:
            return None
        running = {slot: (r, since) for r in self.replicas if r.alive for slot, (since, _end, _uid) in r.calls.items()}
        shown = []
        for slot in sorted(pending, key=lambda s: (s[0], str(s[1])))[:3]:
            controller, key = slot
            r, since = running.get(slot, (None, 0.0))
            how = f"a call started at t={since:.3f} on {r.name} still runs" if r is not None else "no call started"
            shown.append(f"{key} by {controller} ({how})")
        controller = min(pending, key=lambda s: (s[0], str(s[1])))[0]
        detail = (
            f"one more reconcile of {len(pending)} object(s), queued at t={queued:.3f} once the world converged, did not run "
            f"within {self.now() - queued:.3f} virtual s: {'; '.join(shown)}{' …' if len(pending) > 3 else ''} — so their "
            f"idempotence is unknown. A handler call that never returns holds its key (and a worker) for ever: bound every "
            f"wait with a timeout, and return (or raise) from every call"
        )
        return Violation(self.now(), "idempotence", "-", detail, (), controller)

    def outcome(self, r: _Replica | None, controller: str, key: Request, out: Any) -> None:
        """The history's row of a call's end: what it returned, or raised."""
        if isinstance(out, asyncio.CancelledError):
            what = "  cancelled (its replica stopped, or the run ended)"
        elif isinstance(out, BaseException):
            text = str(out)
            what = f"  raised {type(out).__name__}" + (f": {text[:100]}{'…' if len(text) > 100 else ''}" if text else "")
        else:
            what = "  returned" + (f" {out!r:.60}" if out is not None else "")
        self.history.note(key, self.now(), r.name if r is not None else "-", controller, what)

    def call_returned(self, kw: dict[str, Any]) -> None:
        obj = _plain(kw.get("obj"))
        if obj is None and kw.get("phase") is Phase.DELETED and self.filters:
            self.deleted_returned[kw["request"]] = self.now()
        if obj is not None and kw.get("phase") is Phase.DELETING:
            self.cleaned.add((obj.get("metadata") or {}).get("uid") or "")
            self.cleanups.returned(self.now(), "", kw["request"], (obj.get("metadata") or {}).get("uid") or "")

    def call_raised(self, controller: str, kw: dict[str, Any], exc: BaseException) -> BaseException:
        """A handler call raised ``exc`` (returned, for the history's row): a give-up is noted for
        the conflicts property, a cleanup's (DELETING) failure for the finalizers property; a
        cancellation (its replica stopped) is neither."""
        if isinstance(exc, TerminalError):
            self.gave_up(exc)
        obj = _plain(kw.get("obj"))
        if isinstance(exc, Exception) and obj is not None and kw.get("phase") is Phase.DELETING:
            self.cleanups.ended(self.now(), controller, kw["request"], (obj.get("metadata") or {}).get("uid") or "", exc)
        return exc

    def call_ended(self, r: _Replica | None, key: Any, started: float) -> None:
        if self.pending:
            self.pending.discard(key)
        if r is not None and r.calls.get(key, (None,))[0] == started:
            del r.calls[key]

    # -- replicas -------------------------------------------------------------------------------
    def start(self, r: _Replica) -> None:
        r.gen += 1
        r.actor = Actor(self.loop, f"r{r.index}")
        self.by_actor[r.actor] = r
        r.calls, r.paused, r.daemons, r.background = {}, [], {}, {}
        r.stop, r.pause_at_write, r.lease_written, r.stuck, r.term_grace = None, 0.0, {}, 0.0, 0.0
        r.owed_exit, r.stuck_until = {}, 0.0
        r.never_sync, r.unsynced_next = r.unsynced_next, False
        self.last_change = self.now()
        r.actor.spawn(self._run(r))

    async def _run(self, r: _Replica) -> None:
        w = self.world
        options = Options(
            leader_elect=w.mode == "leader", shards=w.shards if w.mode == "sharded" else 0,
            leader_election_id="sim", leader_election_namespace=LEASE_NAMESPACE,
            lease_duration=w.lease_duration * r.scale, renew_deadline=w.renew_deadline * r.scale, retry_period=w.retry_period * r.scale,
            switch_interval=None, check_permissions=False, grace_period=5.0,
        )  # fmt: skip
        clock = self.lease_clock(r)
        metrics = Metrics()  # a scraped pod's: the queues' metrics callbacks run too (I13)
        m = Manager(
            None, self.registry, options, transport=WorldTransport(self, r), discovery=self.server.discovery,
            executor=self.executor(), clock=clock, wall_clock=self.wall_clock(r), metrics=metrics,
        )  # fmt: skip
        r.manager, r.metrics, r.born = m, metrics, clock()
        await m.setup()
        m.context.inline = _drive
        a = r.actor

        def fire() -> None:  # the watchdog's os._exit: this incarnation is gone
            if r.actor is a and r.alive:
                self.exit(r)

        # declop run's watchdog, on virtual time: its timer belongs to the replica (stopped with it)
        r.watchdog = Watchdog(EXIT_BOUND, fire=fire, timer=lambda seconds, fn: asyncio.get_running_loop().call_later(seconds, fn))
        m.on_lost = lambda: self.lost(r)
        r.stop = asyncio.Event()
        try:
            await m.run(r.stop)  # returns after a lost Lease (exit 1) or a stop (SIGTERM)
        except Exception as exc:  # noqa: BLE001 - I12: `declop run` would exit with a traceback
            self.violate("I12", r, f"the manager's run raised {type(exc).__name__}: {exc}")
        self.exit(r)

    def exit(self, r: _Replica) -> None:
        """The process exited: gone now, restarted by the kubelet a few seconds later."""
        a = r.actor

        async def restart() -> None:
            await asyncio.sleep(1.0 + self.rng.uniform(0, 5))
            if r.actor is a:
                self.start(r)

        self.kill(r)
        self.spawn(restart())

    def kill(self, r: _Replica) -> None:
        assert r.actor is not None
        self.check_metrics(r)
        r.actor.kill()
        r.calls, r.daemons, r.background = {}, {}, {}
        self.last_change = self.now()

    def executor(self) -> InlineExecutor:
        """A new process's executor of plain handlers' jobs (stepped for ``World(plain=True)``)."""
        executor = InlineExecutor(self.loop, steps=self.world.plain and self.world.handlers is None)
        self.executors.append(executor)
        return executor

    def check_metrics(self, r: _Replica, at_rest: bool = False) -> None:
        """I13 (:mod:`declop.testing.simulation.metrics`): the metrics of ``r``'s manager agree
        with its queues — when its process ends, and at the end of the run."""
        if r.manager is None or r.metrics is None:
            return
        uptime = self.lease_clock(r)() - r.born
        for problem in metrics_problems(r.manager, r.metrics, uptime, at_rest=at_rest, periodic=self.periodic):
            self.violate("I13", r, problem)

    # -- faults -------------------------------------------------------------------------------
    async def inject(self, f: Fault) -> None:
        await asyncio.sleep(f.at)
        r = self.replicas[f.replica]
        self.last_change = max(self.last_change, f.at + f.length)
        if f.kind == "compact":
            self.server.compact()
            return
        if f.kind == "delete":
            await self._delete_a_lease()
            return
        if f.kind == "term":
            await self._term(r, f.length)
            return
        if f.kind in ("pause-at-write", "stuck"):
            if r.alive:
                setattr(r, f.kind.replace("-", "_"), f.length)
                if f.kind == "stuck":
                    r.stuck_until = f.at + f.length
            return
        if f.kind == "hang-leases":
            r.leases_hang_until = max(r.leases_hang_until, self.now() + f.length)
            return
        if f.kind == "wall-jump":
            r.wall_jump += f.length
            return
        if f.kind == "rollout":
            await self._rollout(f.length)
            return
        if f.kind in ("partition-holder", "pause-holder"):
            self._partition_a_holder(r, f.length, "pause" if f.kind == "pause-holder" else "")
            return
        if f.kind == "errors":
            r.errors_until = max(r.errors_until, self.now() + f.length)
            r.errors_share = self.rng.choice((ERROR_SHARE, 1.0))  # a flaky apiserver, or one shedding all load
            return
        if f.kind == "term-in-call":
            # placed by the protocol: at the leader, whose calls run under the Lease (a rollout
            # reaches it sooner or later); sharded, every replica with a range has some
            leader = next((x for x in self.replicas if x.alive and x.manager is not None and x.manager.elector is not None
                           and x.manager.elector.is_leader), None)  # fmt: skip
            r = leader or r
            if r.alive:
                w = self.world
                r.stuck, r.term_grace = round(self.rng.uniform(w.lease_duration, 3 * w.lease_duration), 3), f.length
                r.stuck_until = 0.0
            return
        if f.kind in ("crash", "unsynced"):  # unsynced: a new pod 1-6 s later, its lists refused
            if r.alive:
                delay = f.length if f.kind == "crash" else 1.0 + self.rng.uniform(0, 5)
                a = r.actor
                self.kill(r)
                await asyncio.sleep(delay)
                if r.actor is a:
                    r.unsynced_next = f.kind == "unsynced"
                    self.start(r)
            return
        if f.kind == "pause":
            await self._pause(r, f.at, f.length)
            return
        if f.kind == "slow":
            r.slow = f.length / 4
        else:
            r.net = f.kind
        await asyncio.sleep(f.length)
        r.net, r.slow = "ok", 0.0

    async def _pause(self, r: _Replica, at: float, length: float) -> None:
        """SIGSTOP of ``r`` from ``at`` (now) for ``length`` seconds, then SIGCONT."""
        a = r.actor
        if a is None or a.dead:
            return
        a.pause()
        span = [at, float("inf")]
        r.paused.append(span)
        await asyncio.sleep(length)
        span[1] = self.now()
        a.resume()
        self._resumed(r, a)

    def _resumed(self, r: _Replica, a: Any) -> None:
        """``r`` (incarnation ``a``) runs again after a pause. If a Lease went to another replica
        while a call under it was paused (:attr:`_Replica.owed_exit`), that was a loss under a
        running call: the replica must be gone within one renewal round (its timers are overdue,
        a renewal still out is bounded by ``renew_deadline / 2``) plus the exit bound, on its
        clock — I5, without the pause's exemption. A replica already stopping (SIGTERM came
        first) is not held to it: it takes no Lease and starts no call, and its stop is bounded
        by the pod's grace (I11 by the exit bound once it declares a loss)."""
        if r.actor is not a or not r.owed_exit or r.manager is None or r.manager.stopping:
            return
        at, o = self.now(), r.manager.options  # this incarnation's timings (a rollout changes the next's)
        bound = o.retry_period + o.renew_deadline / 2 + EXIT_BOUND
        name, what = next(iter(r.owed_exit.items()))

        async def gone() -> None:
            await asyncio.sleep(bound / r.rate + 0.001)
            if r.actor is a and r.alive and not r.was_paused(at):
                self.violate("I5", r, f"still running {bound:.3g} s (of its clock) after it resumed at t={at:.3f}: Lease {name} went to another replica under its call of {what}")

        self.spawn(gone())

    async def _term(self, r: _Replica, grace: float) -> None:
        """SIGTERM: the manager's stop is set (what its signal handler does) and the pod has
        ``grace`` seconds; a manager still running then is killed (SIGKILL), and either way the
        replica comes back as a new pod a few seconds later (:meth:`exit`)."""
        a = r.actor
        if not r.alive or r.stop is None:
            return
        r.stop.set()
        await asyncio.sleep(grace)
        if r.actor is a and r.alive:
            self.exit(r)

    async def _rollout(self, scale: float) -> None:
        """A Deployment rollout that changes the Lease timings (scaled by ``scale``): every
        :data:`ROLLOUT_STEP` seconds the next replica is sent SIGTERM, with the chart's grace, and
        comes back as a new pod with the new timings; until the last one is rolled, replicas of
        both settings share the Leases."""
        partition = self.rng.random() < 0.75
        for i, r in enumerate(self.replicas):
            r.scale = scale  # what its next pod starts with, whether it is up now or not
            self.last_change = max(self.last_change, self.now() + ROLLOUT_STEP)
            self.spawn(self._term(r, ROLLOUT_GRACE))
            await asyncio.sleep(ROLLOUT_STEP)
            if i == 0 and partition:  # both timings run now: a holder of either is cut off
                lease = self.world.lease_duration * self.rng.choice((1.0, scale))
                self._partition_a_holder(self.replicas[self.rng.randrange(len(self.replicas))], round(self.rng.uniform(lease, 3 * lease), 3))

    def _partition_a_holder(self, r: _Replica, length: float, how: str = "") -> None:
        """Arm a partition of ``length`` seconds that starts right after the next successful
        Lease write of a replica holding a Lease: the leader, or a replica holding ranges (``r``
        when it holds one, or none does). ``how``: "pause" (SIGSTOP); else half the time only
        its Lease lane is cut off, and all its requests otherwise."""
        holders = [x for x in self.replicas if x.alive and x.manager is not None and _identities(x.manager) & self._holders()]
        target = r if r in holders or not holders else holders[self.rng.randrange(len(holders))]
        until = self.now() + self.world.lease_duration * target.scale
        target.partition_next = (length, until, how or ("leases" if self.rng.random() < 0.5 else "all"))
        self.last_change = max(self.last_change, until + length)

    def _holders(self) -> set[str]:
        """The identities the apiserver's Lease records name now."""
        return {holder for holder, _at, _d in self.leases.values() if holder}

    async def _delete_a_lease(self) -> None:
        """An administrator deletes one held Lease (the holder learns it at its next renewal).
        Its last record stays for I2 and I9 until the Lease is written again."""
        held = sorted(name for name, (holder, _, _) in self.leases.items() if holder)
        if not held:
            return
        name = held[self.rng.randrange(len(held))]
        try:
            await self.server.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}")
        except ApiError:
            pass

    def stuck_call(self) -> float:
        """``stuck``: how long the calling replica's call runs on (0: it is not the armed one)."""
        a = actor()
        r = self.by_actor.get(a) if a is not None else None
        if r is None or not r.stuck:
            return 0.0
        hold, r.stuck = r.stuck, 0.0
        if r.stuck_until:  # a call that comes late runs on only to the fault's planned end
            hold, r.stuck_until = max(0.0, min(hold, r.stuck_until - self.now())), 0.0
            if not hold:
                return 0.0
        self.last_change = max(self.last_change, self.now() + hold)
        if r.term_grace:
            grace, r.term_grace = r.term_grace, 0.0

            partition = self.rng.random() < 0.8  # and, most of the time, a partition from the SIGTERM on

            async def term() -> None:
                await asyncio.sleep(0.5)
                if partition:
                    self.spawn(self._partition(r, grace + 10.0))
                await self._term(r, grace)

            self.spawn(term())
        return hold

    async def _partition(self, r: _Replica, length: float) -> None:
        r.net = "hang"
        self.last_change = max(self.last_change, self.now() + length)
        await asyncio.sleep(length)
        r.net = "ok"

    def lost(self, r: _Replica) -> None:
        """The manager declared a Lease lost (``Manager.on_lost``): its watchdog is armed, on
        virtual time, and I11 checks that the incarnation is gone within the exit bound."""
        a, at = r.actor, self.now()
        if r.watchdog is not None:
            r.watchdog.arm()

        async def gone() -> None:
            await asyncio.sleep(EXIT_BOUND / r.rate + 0.001)  # the bound holds on the node's clock
            if r.actor is a and r.alive and not r.was_paused(at):
                self.violate("I11", r, f"still running {EXIT_BOUND:g} s (of its clock) after it lost a Lease at t={at:.3f}")

        self.spawn(gone())

    async def pause_here(self, r: _Replica) -> None:
        """``pause-at-write``: the replica is stopped (SIGSTOP) while its fenced write, checked by
        the Transport, waits for a connection; on SIGCONT, ``length`` later, the write goes on
        first — to the pool's check (FencedConnector's), then the apiserver — and the rest of the
        replica after it, in the order things became ready."""
        length, r.pause_at_write = r.pause_at_write, 0.0
        a = r.actor
        if a is None or a.dead:
            return
        span = [self.now(), float("inf")]
        r.paused.append(span)
        self.last_change = max(self.last_change, self.now() + length)
        a.pause()
        await asyncio.sleep(length)
        span[1] = self.now()
        if not a.dead:
            a.resume()
            self._resumed(r, a)

    # -- the workload -------------------------------------------------------------------------
    def _new(self, key: Request, value: int) -> dict[str, Any]:
        info = self.info()
        obj: dict[str, Any] = {"apiVersion": info.api_version, "kind": info.kind, "metadata": {"name": key.name, "namespace": key.namespace}}
        obj["spec"] = {} if self.user else {"value": value}
        if self.user:
            obj = self.scope.fill(self.objects.new(obj, int(key.name[1:])), int(key.name[1:]))
        if self.world.filtered:
            obj["metadata"]["labels"] = {SELECTED: "true" if value % 3 else "false"}
        return obj

    def _change(self, value: int, key: Request, stored: Any) -> tuple[str | None, dict[str, Any]]:
        """The workload's update (a subresource, a merge patch): the built-in spec's value; a
        handlers file's object's spec, metadata or status (:meth:`Objects.update`)."""
        if self.user:
            return self.objects.update(stored, int(key.name[1:]), value, self.scope)
        if self.world.filtered and value % 2:  # in or out of the filter, by a label
            return None, {"metadata": {"labels": {SELECTED: "true" if value % 4 == 1 else "false"}}}
        return None, {"spec": {"value": value}}

    async def _admin(self, method: str, key: Request, body: Any = None, sub: str | None = None) -> Any:
        info = self.info()
        path = info.path(namespace=key.namespace, name=None if method == "POST" else key.name) + (f"/{sub}" if sub else "")
        before = self.server.store(info).get(key) if self.world.filtered or self.filters else None
        result = await self.server.request(method, path, body=body, content_type="application/merge-patch+json" if method == "PATCH" else None)
        if before is not None and any(f(before) and not f(result) for f in self.filters.values()):
            self.left_filter[key] = self.now()
        meta = result["metadata"]
        held = method == "DELETE" and meta.get("deletionTimestamp")
        done = {"POST": "created", "DELETE": "deletion asked, finalizers hold it" if held else "deleted"}.get(method) or f"updated ({', '.join(_fields(body))})"
        self.history.note(key, self.now(), "admin", "", f"{done}, uid {meta['uid'][:8]}, rv {meta['resourceVersion']}")
        if method == "DELETE":
            guarded = bool(meta.get("deletionTimestamp") and set(meta.get("finalizers") or ()) & self.finalizers)
            owner = self._owner(key, meta["uid"])
            if owner is not None and owner[1] < 0:  # leader mode: the processes that will see it go
                self.knew[(key, meta["uid"])] = self._watching()
            if (self.world.filtered and not _selected(result)) or (self.user and not self.scope.watched(result)):
                pass  # outside the filter: no controller of it is told (one that left it had its DELETED call)
            elif guarded or self.world.strict or owner is not None:
                self.deletions.append((key, meta["uid"], self.now(), self.calls, guarded, owner))
            else:
                self.unowned_deletions += 1  # no owner to deliver it: the documented exception
            if not guarded:
                self.want.pop(key, None)
        else:
            self.want[key] = (meta["uid"], int(meta["resourceVersion"]))
        if self.world.filtered and method == "POST":
            (self.recreated if key in self.created else self.created).add(key)
        if self.world.filtered and before is not None and _selected(before) and (method == "DELETE" or not _selected(result)):
            self.left[key] = (self._owner(key, meta["uid"]), frozenset((r.index, r.gen) for r in self.replicas if r.alive))
        elif self.world.filtered and method != "DELETE" and _selected(result):
            self.left.pop(key, None)
        return result

    def _owner(self, key: Request, uid: str) -> tuple[_Replica, int, int] | None:
        """The live, running replica whose fence for ``key``'s range is open now (sharded), with
        its generation and the range; ``(replica 0, -1, -1)`` in leader mode, where standbys queue
        every event and a next leader that was watching then delivers it (:meth:`_kept`)."""
        if self.world.mode != "sharded":
            return self.replicas[0], -1, -1
        for r in self.replicas:
            m = r.manager
            if m is None or not r.alive or (r.actor is not None and r.actor.paused) or not m.controllers:
                continue
            s = m.controllers[0].shards
            if s is None:
                continue
            i = s.index(key.namespace if s.shard_by == "namespace" else uid)
            if s.may_start(i):
                return r, r.gen, i
        return None

    def _watching(self) -> frozenset[tuple[int, int]]:
        """The replica incarnations (index, generation) alive now with synced primary caches:
        each sees a deletion now, or at its next relist, and queues it (leader mode)."""
        return frozenset(
            (r.index, r.gen) for r in self.replicas
            if r.alive and r.manager is not None and r.manager.controllers
            and all(i.synced.is_set() for c in r.manager.controllers for i in c.primary.informers)
        )  # fmt: skip

    def _kept(self, owner: tuple[_Replica, int, int] | None, key: Request, uid: str) -> bool:
        """Whether the owner at a deletion still owns that range now, in the same process; in
        leader mode, whether the leader now is a process that was watching at the deletion (one
        started later lists after the object went, and never learns of it: the documented
        exception, contract.md §7 — a deletion that must be acted on needs a finalizer)."""
        if owner is None:
            return False
        r, gen, i = owner
        if gen < 0:
            knew = self.knew.get((key, uid), frozenset())
            return any(
                (x.index, x.gen) in knew for x in self.replicas
                if x.alive and x.manager is not None and x.manager.elector is not None and x.manager.elector.valid()
            )  # fmt: skip
        m = r.manager
        s = m.controllers[0].shards if m is not None and m.controllers else None
        return r.alive and r.gen == gen and s is not None and s.electors[i].valid()

    async def workload(self) -> None:
        w = self.world
        rng = random.Random(f"work-{self.seed}")
        spaces = self.scope.namespaces
        keys = [Request(spaces[i % len(spaces)], f"w{i:03d}") for i in range(w.objects)]
        self.objects.status = "status" in self.info().subresources
        value = 0
        for key in keys[: w.objects // 2]:
            value += 1
            await self._admin("POST", key, self._new(key, value))
        rate = max(w.objects / w.duration, 1.0)
        while True:
            await asyncio.sleep(rng.expovariate(rate))
            if self.now() >= w.duration:
                return
            key = rng.choice(keys)
            value += 1
            stored = self.server.store(self.info()).get(key)
            op = rng.random()
            try:
                if stored is None:
                    await self._admin("POST", key, self._new(key, value))
                elif stored["metadata"].get("deletionTimestamp"):
                    continue
                elif op < 0.6:
                    sub, patch = self._change(value, key, stored)
                    await self._admin("PATCH", key, patch, sub)
                else:
                    await self._admin("DELETE", key)
                    if op > 0.85:  # and at once again, same name (a new uid)
                        await self._admin("POST", key, self._new(key, value))
            except ApiError:
                pass  # still being deleted (finalizer): AlreadyExists

    # -- the end: I3 and I4 -------------------------------------------------------------------------
    def check_end(self, settled_at: float) -> None:
        store = self.server.store(self.info())
        if self.world.filtered:
            self.check_children(settled_at)
        for key, (uid, rv) in sorted(self.want.items()):
            stored = store.get(key)
            if self.world.filtered and (stored is None or not _selected(stored)):
                continue  # outside the filter: I10 checks it
            got = self.seen.get((key, uid), 0)
            if self.user:
                rv = 1  # a handlers file's predicates may drop updates: its object must be seen once
                stored = store.get(key)
                if stored is not None and not self.scope.watched(stored):
                    continue  # outside every registration's namespaces and selectors: nobody's
                if stored is not None and not valid(self.registry.registrations, self.primary, stored):
                    continue  # fails its typed model: skipped until it changes, by design
            if got < rv:
                self.violate("I3", "-", f"{key} (uid {uid[:8]}) changed at resourceVersion {rv}, not reconciled since (last seen {got or 'never'}) {self.now() - settled_at:.3f} s after the faults healed")
        for obj in store:
            if self.user and obj["metadata"].get("deletionTimestamp") and not valid(self.registry.registrations, self.primary, obj):
                continue  # fails its model: our finalizer waits until it validates ("Deletion waits"), by design
            if obj["metadata"].get("deletionTimestamp") and not (self.user and self.cleanups.failing(obj["metadata"].get("uid"))):
                self.violate("I4", "-", f"{obj['metadata']['namespace']}/{obj['metadata']['name']} is still being deleted {self.now() - settled_at:.3f} s after the faults healed")
        for r in self.replicas:  # I9: no daemon of an object that is gone; I13 at rest
            if r.alive:
                self.check_metrics(r, at_rest=not r.calls)  # at rest unless a call still runs (a hung handler's)
                for key in sorted(r.daemons):
                    if store.get(key) is None:
                        self.violate("I9", r, f"a daemon of {key} still runs {self.now() - settled_at:.3f} s after the faults healed, its object gone")
        seen_uids = {uid for _key, uid in self.seen}
        for key, uid, at, before, guarded, owner in self.deletions:
            now_there = store.get(key)
            if now_there is not None and now_there["metadata"].get("uid") == uid:
                continue  # still there (reported above)
            if guarded:
                if uid not in self.cleaned:
                    self.violate("I4", "-", f"{key} (uid {uid[:8]}) deleted at t={at:.3f} went without its cleanup")
            elif not self.world.strict and not self._kept(owner, key, uid):
                self.unowned_deletions += 1  # its range's owner lost it meanwhile: the exception
            elif self.user and now_there is not None and not valid(self.registry.registrations, self.primary, now_there):
                continue  # its name holds an object that fails its model: the key's calls are skipped
            elif uid in seen_uids and not any(n > before for n in self.started.get(key, ())):
                # a handler saw the object, so it must see it go (one it never saw may go unseen:
                # there is nothing of it to clean up)
                self.violate("I4", "-", f"the deletion of {key} (uid {uid[:8]}) at t={at:.3f} never reached a handler")

    def check_children(self, settled_at: float) -> None:
        """I10 (the filtered world): every object in the filter has its child ConfigMap, holding
        its spec's value, and no other object has one — what the handler did when it last read the
        object is what the object says now, so no change was left unreconciled, the changes that
        moved it out of the filter too. Leaving the filter is a deletion to the controller, without
        a finalizer: sharded, one made while no replica owned the object's range, or whose owner
        lost it since, is excused as I4 excuses a deletion (in leader mode, one the leader at the
        end never saw: a process started after it, :meth:`_unowned_leave`); so is, sharded by
        uid, a name created again (the old object's calls and the new one's run on two replicas,
        which I1 excuses: they share the child). ``World(strict=True)`` checks both."""
        store = self.server.store(self.info())
        children = self.server.store("configmaps")
        for key in sorted({*(key_of(o) for o in store), *(Request(key_of(c).namespace, key_of(c).name.removesuffix("-child")) for c in children)}):
            obj, child = store.get(key), children.get(Request(key.namespace, f"{key.name}-child"))
            want = str(obj["spec"].get("value")) if obj is not None and _selected(obj) else None
            got = (child.get("data") or {}).get("value") if child is not None else None
            if got != want and not self.world.strict and key in self.left and self._unowned_leave(key):
                self.unowned_deletions += 1  # it left while no replica owned its range: §7's exception
            elif got != want and self.by_uid and key in self.recreated:
                self.excused += 1  # the old object's calls and the new one's on two replicas: §7 (I1's exception)
            elif got != want:
                what = "no object" if obj is None else f"resourceVersion {obj['metadata']['resourceVersion']}, {'in' if want else 'out of'} the filter"
                self.violate("I10", "-", f"{key} ({what}) has {'no child' if got is None else f'a child with {got!r}'}, want {'none' if want is None else repr(want)}, {self.now() - settled_at:.3f} s after the faults healed")

    def _unowned_leave(self, key: Request) -> bool:
        """``key``'s last move out of the filter reached no replica that owns its range now: sharded,
        its range's owner then lost it since (or there was none); in leader mode, the leader now is
        a process started after it (it listed the filter without the object; standbys that queued
        the event never led)."""
        owner, alive = self.left[key]
        if self.world.mode == "sharded":
            return not self._kept(owner)
        leaders = [r for r in self.replicas if r.alive and r.manager is not None and r.manager.elector is not None and r.manager.elector.valid()]
        return not any((r.index, r.gen) in alive for r in leaders)


def _verbose(record: logging.LogRecord) -> bool:
    """``-v``'s lines: the virtual instant (``-`` outside the run), the replica that logged it
    (its actor: ``r1``, or ``-`` for the world's own), and the line's pairs."""
    _virtual_time(record)
    who = actor()
    record.who = who.name if who is not None else "-"
    return True


def _identities(m: Manager) -> set[str]:
    """The holder identities a manager writes into Leases: its leader elector's, and its range electors'."""
    mine = {m.elector.identity} if m.elector is not None else set()
    mine.update(e.identity for c in m.controllers if c.shards is not None for e in c.shards.electors)
    return mine


def _fields(body: dict[str, Any]) -> list[str]:
    """The fields a merge patch sets: ``["metadata.annotations"]``, ``["spec"]``."""
    return [f"{k}.{sub}" for k, v in body.items() if k == "metadata" and isinstance(v, dict) for sub in v] + [k for k in body if k != "metadata"]


def _plain(obj: Any) -> Any:
    """A typed view's dict (or the dict itself)."""
    if obj is None or isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump(by_alias=True) if dump is not None else None


#: a process thaws declop's frozen heap after every this many world runs (:func:`run`)
THAW_EVERY = 20
_runs = itertools.count(1)
#: whether this process holds the collector's count of running managers (:func:`run`)
_held = False


def run(world: World, seed: int, registry: Registry | None = None, crds: Sequence[Any] = ()) -> WorldResult:
    """Simulate one schedule (a pure function of ``world`` and ``seed``).

    Every :data:`THAW_EVERY` runs of a process end with :func:`declop.collector.thaw`: each
    replica's syncs freeze what is alive, its managers among it, so a run's whole graph outlives
    it frozen (some 1.4 MB a seed: 7 GB a process in a 10,000-seed sweep). One full pass per
    :data:`THAW_EVERY` runs frees it; the collector's timing changes no schedule. The process
    counts as one more running manager (:func:`declop.collector.started`) from its first run on,
    so the replicas' ends do not thaw at every seed's end (a full pass a seed: ~25 % slower)."""
    global _held
    if not _held:
        collector.started()
        _held = True
    rng = random.Random(seed)
    faults = list(world.faults) if world.faults is not None else schedule(world, rng)
    if world.only is not None:
        faults = [faults[i] for i in world.only if i < len(faults)]
    loop = WorldLoop()
    ids = random.Random(f"uids-{seed}")
    saved_random, saved_uuid4 = random.getstate(), uuid.uuid4
    random.seed(f"jitter-{seed}")
    uuid.uuid4 = lambda: uuid.UUID(int=ids.getrandbits(128), version=4)
    w = _World(world, seed, loop, registry if registry is not None else builtin_registry(world), crds)
    limits = bounds(world, faults, len(w.periodic))
    loop.max_turns, loop.max_time, loop.exhausted = limits.steps, limits.seconds, w.exhausted
    saved_now = apiserver._now  # timestamps (a timer's grid anchor) on the virtual wall clock too
    apiserver._now = lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(w.wall()))
    try:
        w.main = loop.create_task(_main(w, faults))
        loop.run_until_complete(w.main)
    finally:
        apiserver._now = saved_now
        uuid.uuid4 = saved_uuid4
        random.setstate(saved_random)
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:  # their clean-up (a manager's shutdown) is bounded: 60 virtual seconds at most
            loop.run_until_complete(asyncio.wait(tasks, timeout=60))
        loop.close()
        for executor in w.executors:
            executor.close()
        if next(_runs) % THAW_EVERY == 0:
            collector.thaw()
    ended = w.ended
    writes = w.writes.counts() + (f"\n{w.conflicts.counts()}" if w.conflicts.refused else "") if w.user else ""
    writes += f"\n{w.crashes.counts()}" if w.crashes is not None and w.crashes.points else ""
    writes += f"\n{w.cleanups.counts()}" if w.user and (w.cleanups.lost or w.cleanups.failed) else ""
    history = w.history.report(w.violations[0]) if w.violations else ()
    return WorldResult(world, seed, faults, w.violations, w.calls, w.requests, len(w.ticks), ended, loop.turns, limits, writes,
                       allowed=w.allowed, history=history, background_writes=w.background_writes)  # fmt: skip


def check_replicas(faults: Sequence[Fault] | None, replicas: int) -> None:
    """Raise :class:`~declop.errors.ConfigError` for a fault of its own (``--fault``) that names
    a replica the run does not have (it would be dropped, and the run pass without it)."""
    for f in faults or ():
        if not 0 <= f.replica < replicas:
            raise ConfigError(
                f"--fault {_num(f.at)}:{f.kind}:{f.replica}:{_num(f.length)}: replica {f.replica} does not exist; "
                f"the run has replicas 0 to {replicas - 1} (--replicas {replicas})"
            )


def calm(world: World, faults: Sequence[Fault]) -> float:
    """When the workload and the faults of a run stop."""
    return max([world.duration] + [f.at + _span(world, f, faults) for f in faults])


def _span(world: World, f: Fault, faults: Sequence[Fault] = ()) -> float:
    """How long fault ``f`` lasts (a ``rollout``: until the last replica's new pod is up)."""
    if f.kind == "rollout":  # and the partition it may place once the first replica is rolled
        return max(world.replicas * ROLLOUT_STEP, ROLLOUT_STEP + 4 * world.lease_duration * max(1.0, f.length))
    if f.kind == "wall-jump":
        return 0.0  # its length is the step
    if f.kind in ("partition-holder", "pause-holder"):  # it starts at the holder's next Lease write
        return lease_span(world, faults) + f.length
    return f.length


def lease_span(world: World, faults: Sequence[Fault]) -> float:
    """The longest lease duration of the run's replicas (a ``rollout`` may scale it)."""
    return world.lease_duration * max([1.0] + [f.length for f in faults if f.kind == "rollout"])


def bounds(world: World, faults: Sequence[Fault], periodic: int = 0) -> Bounds:
    """The seed's bounds: its virtual end (the settling, the quiet window, the idempotence
    check's longest wait) and steps per virtual second: :data:`STEPS_PER_REPLICA` per replica,
    :data:`STEPS_PER_OBJECT` per object, and :data:`STEPS_PER_PERIODIC` per object and
    ``periodic`` registration (timers, daemons: a task per object that wakes on its own)."""
    lease = lease_span(world, faults)
    seconds = calm(world, faults) + (SETTLE + 1) * lease + _check_bound(world, lease) + 1.0
    rate = STEPS_PER_REPLICA * world.replicas + (STEPS_PER_OBJECT + STEPS_PER_PERIODIC * periodic) * world.objects
    return Bounds(int(rate * seconds), seconds)


def _check_bound(world: World, lease: float) -> float:
    """The longest the idempotence check waits for its reconciles (virtual seconds), with
    ``lease`` the longest lease duration."""
    return 2 * lease + 0.1 * world.objects


async def _main(w: _World, faults: list[Fault]) -> None:
    try:
        await _body(w, faults)
    except asyncio.CancelledError:
        if w.ended == "end":
            raise
        # halted (quiescence, a bound): the run ends here
    for r in w.replicas:
        if r.actor is not None:
            r.actor.kill()
    await asyncio.sleep(0)


async def _body(w: _World, faults: list[Fault]) -> None:
    s = w.world
    for r in w.replicas:
        w.start(r)
    for f in faults:
        w.spawn(w.inject(f))
    w.calm_at = end_of_faults = calm(s, faults)
    lease = lease_span(s, faults)
    if w.user:  # the handlers' writes must stop by the time every object is reconciled (I3)
        w.quiet_from = end_of_faults + QUIET_AFTER * lease
        w.spawn(collect(w.server))  # the garbage collector, from ownerReferences (simgc)
    await w.workload()
    await asyncio.sleep(max(0.0, end_of_faults - w.now()))
    await asyncio.sleep(SETTLE * lease)
    regs = w.registry._registrations
    deleted = {(w.primary, key): at for key, _uid, at, *_ in w.deletions}
    if w.crashes is not None:  # before I3/I4: a cleanup a crash interrupted is named as such
        for allowed in (False, True):  # the held handlers', then the allowed ones' (--allow crash-safety:H)
            group = {name for name in regs if w.allow.covers("crash-safety", name) == allowed}
            crashed = crash_safety(w.server, w.writes, w.crashes, lambda name: regs[name].resource if name in group else None, w.now(), deleted) if group else None
            if crashed is not None:
                w.fail(crashed)
    before_end = len(w.violations)
    w.check_end(end_of_faults)
    if not w.user:
        return
    for allowed in (False, True):  # the held handlers' children, then the allowed ones' (--allow ownership:H)
        group = {name for name in regs if w.allow.covers("ownership", name) == allowed}
        orphan = ownership(w.server, w.writes, lambda name: regs[name].resource if name in group else None, w.now(), deleted) if group else None
        if orphan is not None:
            w.fail(orphan)
    for allowed in (False, True):  # the held handlers' finalizers, then the allowed ones' (--allow finalizers:H)
        held = {r.finalizer for r in regs.values() if r.finalizer and w.allow.covers("finalizers", r.name) == allowed}
        stuck = w.cleanups.stuck(w.primary, w.server.store(w.info()), held, {uid: at for _k, uid, at, *_ in w.deletions}, w.now(), end_of_faults) if held else None
        if stuck is not None and w.fail(stuck):
            w.violations.insert(before_end, w.violations.pop())  # before the end's I3s: the cause, not its symptom
    await asyncio.sleep(lease)  # the quiet window: a changing write here ends the run
    await w.check_idempotence(w.now() + _check_bound(s, lease))


def shrink(failed: WorldResult, registry: Registry | None = None, crds: Sequence[Any] = ()) -> WorldResult:
    """The smallest schedule of ``failed``'s seed that still fails its first violation's way, in
    a bounded number of runs (:func:`declop.testing.simulation.shrink.shrink`: no fault, fewer, shorter)."""
    from declop.testing.simulation.shrink import shrink as shrinking

    return shrinking(failed, registry, crds).result


#: what a forked worker of :func:`run_seeds` runs its seeds with (set before the fork)
_JOB: tuple[World, Registry | None, Sequence[Any]] | None = None


def _run_job(seed: int) -> WorldResult:
    assert _JOB is not None
    world, registry, crds = _JOB
    # sent back without its world (the parent has it; a user's objects_from may not pickle)
    return dataclasses.replace(run(world, seed, registry, crds), world=None)  # type: ignore[arg-type]


def run_many(world: World, seeds: Sequence[int], registry: Registry | None = None, crds: Sequence[Any] = (), jobs: int = 1) -> Iterator[WorldResult]:
    """Each seed's result, in the order of ``seeds``: here, or in ``jobs`` forked processes (a
    world run is a pure function of its seed, so where it runs changes nothing)."""
    global _JOB
    if jobs <= 1 or len(seeds) < 2:
        yield from (run(world, seed, registry, crds) for seed in seeds)
        return
    import multiprocessing

    _JOB = (world, registry, crds)
    try:
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for result in pool.map(_run_job, seeds, chunksize=max(1, min(8, len(seeds) // (4 * jobs)))):
                yield dataclasses.replace(result, world=world)
    finally:
        _JOB = None


def run_seeds(
    world: World, seeds: Sequence[int], registry: Registry | None = None, out: Any = None, crds: Sequence[Any] = (), jobs: int = 1,
) -> int:  # fmt: skip
    """Run ``seeds`` (in ``jobs`` processes); print each failure's repro line (and the handler's
    line of its write; the first one's object history too), the schedules per second and what
    was allowed on purpose (``World.allow``), then the first failure's shrunk schedule (its runs,
    at most :data:`declop.testing.simulation.shrink.RUNS`, are not in the rate); return how many failed.
    The output is the same whatever ``jobs`` is, but for the rate."""
    from declop.testing.simulation.allow import allowed_summary
    from declop.testing.simulation.shrink import shrink as shrinking

    out = out or sys.stdout
    began, failed, allowed, first = time.perf_counter(), 0, [], None
    for result in run_many(world, seeds, registry, crds, jobs):
        allowed.append(result.allowed)
        if not result.ok:
            failed += 1
            first = first or result
            print(f"FAIL {result.repro()}  # {result.violations[0]}", file=out, flush=True)
            for line in result.violations[0].trace:  # the handler's line that made the write
                print(f"    {line}", file=out, flush=True)
            for line in result.history if failed == 1 else ():  # the first failure's object: its last rows
                print(f"    {line}", file=out, flush=True)
    took = max(time.perf_counter() - began, 1e-9)
    summary = allowed_summary(allowed)
    print(f"{len(seeds)} seeds, {failed} failed, {took:.1f} s: {len(seeds) / took:.2f} schedules/s" + (f"; {summary}" if summary else ""), file=out)
    if first is not None:  # one shrink per sweep: each costs up to RUNS runs of its seed
        for line in shrinking(first, registry, crds).report():
            print(line, file=out, flush=True)
        print("(each FAIL line run alone prints its seed's whole report and its own shrunk schedule)", file=out)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m declop.testing.simulation.world", description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("leader", "sharded"), default=World.mode)
    p.add_argument("--shard-by", choices=("uid", "namespace"), default=World.shard_by)
    p.add_argument("--seed", type=int, help="run this one seed and print its schedule")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("-j", "--jobs", type=int, default=1, help="run the seeds in this many processes")
    p.add_argument("--replicas", type=int, default=World.replicas)
    p.add_argument("--shards", type=int, default=World.shards)
    p.add_argument("--objects", type=int, default=World.objects)
    p.add_argument("--duration", type=float, default=World.duration)
    p.add_argument("--no-finalizer", action="store_true", help="the built-in handler without a finalizer")
    p.add_argument("--strict", action="store_true", help="I1 without the exception for shard_by='uid' without a finalizer")
    p.add_argument("--server-filter", action="store_true", help="the apiserver serves shardSelector (server-side filtering)")
    p.add_argument("--daemons", action="store_true", help="add a daemon per object to the built-in handler (checks I9)")
    p.add_argument("--filtered", action="store_true", help="the built-in handler is a labels= controller reading its own object (checks I10)")
    p.add_argument("--plain", action="store_true", help="the built-in handler is a plain def (its calls run in batches)")
    p.add_argument("--fifo", action="store_true", help="the built-in handler's queue is FIFO (priority=False)")
    p.add_argument("--background", action="store_true", help="add a leader-only background task to the built-in handler (checks I14)")
    p.add_argument("--watch-lag", type=float, default=0.0, help="each watch stream delays each event by up to this many seconds")
    p.add_argument("--only", default=None, help="the seed's faults to keep, by index (0,2), or none")
    p.add_argument("--fault", action="append", default=None, help="a fault of its own, AT:KIND:REPLICA:LENGTH (repeatable; replaces the seed's)")
    p.add_argument("--faults", default=",".join(DEFAULT_KINDS))
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.getLogger("declop").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL + 1)
    if args.verbose:  # declop's lines, each with its virtual instant and replica
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_verbose)
        handler.setFormatter(logging.Formatter("t=%(vt)s %(who)s %(message)s %(kv)s"))
        logging.getLogger("declop").addHandler(handler)
    kinds = tuple(k for k in args.faults.split(",") if k)
    unknown = sorted(set(kinds) - set(WORLD_KINDS))
    if unknown:
        p.error(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(WORLD_KINDS)}")
    from declop.testing.simulation.shrink import parse_fault, parse_only, shrink as shrinking

    only = parse_only(args.only)
    faults = tuple(parse_fault(f, WORLD_KINDS) for f in args.fault) if args.fault else None
    try:
        check_replicas(faults, args.replicas)
    except ConfigError as exc:
        p.error(str(exc))
    world = World(mode=args.mode, shard_by=args.shard_by, replicas=args.replicas, shards=args.shards, objects=args.objects,
                  duration=args.duration, kinds=kinds, only=only, faults=faults, finalizer=not args.no_finalizer, strict=args.strict,
                  server_filter=args.server_filter, daemons=args.daemons, filtered=args.filtered, watch_lag=args.watch_lag,
                  plain=args.plain, fifo=args.fifo, background=args.background)  # fmt: skip
    if args.seed is not None:
        result = run(world, args.seed)
        print(result.report())
        if not result.ok:
            print("\n".join(shrinking(result).report()))
        return 0 if result.ok else 1
    return 1 if run_seeds(world, range(args.start, args.start + args.seeds), jobs=max(1, args.jobs)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
