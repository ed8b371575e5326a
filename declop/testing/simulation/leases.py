"""Deterministic simulation of several replicas' Lease code, on virtual time, under faults.

    python -m declop.testing.simulation.leases --scenario sharded --seed 123456
    python -m declop.testing.simulation.leases --scenario leader --seeds 1000

One run (:func:`run`) builds a cluster on one :class:`~declop.testing.simulation.loop.VirtualLoop`:

- **the apiserver** is :class:`~declop.testing.fakes.apiserver.FakeApiServer` (Leases with
  resourceVersion-checked updates: 409 on a stale PUT, 409 on a second create, 404 on a missing
  Lease); each replica reaches it through a :class:`SimTransport` — the one seam the Lease code
  has (``transport.request(method, path, body=..., timeout=..., lane=...)``), so no socket is
  involved. The network leg of a request runs in a task of the cluster, not of the replica: a
  request sent before a pause still arrives, its answer waits for the resume.
- **the replicas** run declop's real :class:`~declop.leases.leader.LeaderElector` (scenario
  ``leader``: acquire, hold, exit on loss, as the manager does) or
  :class:`~declop.leases.shards.ShardLeases` (the sharded families — ``sharded-uid`` (or
  ``sharded``), ``sharded-namespace``, ``rolling`` (a rollout of another ``--shards``) and
  ``shared-id`` (a second operator under the same election id), :data:`SCENARIOS` —:
  ``run()``, exit once it returns, as the manager's ``_shard`` does; its caches sync a moment
  after the start, told through ``ShardSet.synced``), with every clock they read virtual: the Lease
  clock is the loop's time, ``renewTime`` comes from a virtual wall clock, jitter from a seeded
  ``random``. Each replica has two workers that start simulated calls on random keys through
  the same fence the controller uses (``elector.valid()``; ``ShardSet.may_start`` at the take and
  again just before the call, ``begin``/``end`` around it). A call lasts a random virtual
  duration, a few of them tens of seconds (a stuck handler); it cannot be cancelled — it ends
  when it ends or when its process is gone. At its end it writes its key through the write
  fence the transport applies (:class:`~declop.kube.fencing.WriteFence` over the covering
  Lease's ``valid()``): refused (``Fenced``, counted) or accepted at that instant — the sim has
  no delay between the check and the apiserver.
- **exits**: a replica that lost its leader Lease, or whose ``ShardLeases.run()`` returned
  (a range lost under a running call), stops starting calls and arms the real
  :class:`~declop.leases.watchdog.Watchdog` on virtual time, as ``declop run`` does: it is gone
  :data:`EXIT_BOUND` seconds later — the bound the manager guarantees after a loss — and
  restarts with empty memory after a delay.
- **faults** (:class:`Fault`) are drawn from the seed, per replica: partitions (requests hang;
  requests fail at once — refused, 429, 503, or a write done and answered with a 500; requests
  arrive but their answers are lost), slow requests, pause and
  resume (SIGSTOP/SIGCONT: the replica's tasks stop advancing, its clock does not), crash and
  restart with empty memory, a stuck call, an administrator deleting a Lease, (sharded) a
  restart with caches that never sync, and a graceful
  stop (``term``: SIGTERM with a grace period, as the manager's shutdown — no new call, the
  running ones get the grace period, then the workers are cancelled while a call may still run
  in its thread, then the real ``LeaderElector.release()`` / ``ShardLeases.release_all()``
  with the calls still running counted, and the process exits).

Invariants, checked while the run goes (each violation is a :class:`Violation`, with the virtual
time and the replica):

- **I1** no two replicas run a call of the same key at once (except a replica paused during its
  call: nothing stops the call itself; fenced writes stop what it writes — I9);
- **I2** a call starts only while the apiserver's record of the Lease covering its key names the
  replica and is unexpired (its last write + ``leaseDurationSeconds``; a Lease deleted by an
  administrator keeps its last record until it is created again);
- **I5** when a replica acquires a Lease, no other replica that had a call in flight under it is
  still alive — unless that one was paused after its own last write of the Lease (as in I1:
  nothing stops its call; fenced writes stop what it writes);
- **I6** no replica releases (or deletes) a Lease while one of its calls under it still runs;
- **I7** from two lease durations after the last fault (and the last exit or restart) until the
  end, the leader Lease — sharded: every key of every controller, under its replica's
  ``--shards`` — has a live, synced owner whose fence is open; a Lease that did not exist at the
  last change (a new split's, or one an administrator deleted) gets one renew deadline more:
  it is created a lease duration after it was first found missing, and its creator's fence
  opens a renew deadline later — in a stopped rollout, a key any of whose Leases
  (one per split) did not exist gets it; a controller none of whose live replicas has synced
  caches (every one restarted ``unsynced``) can have no owner, and is not checked;
- **I9** a write is accepted only from the replica the apiserver's record of the covering Lease
  names, unexpired — a paused replica included: no exception.

A run is a pure function of its :class:`Scenario` and seed: a failing one is reproduced by the
one line :meth:`Result.repro` prints, and :func:`shrink` drops the faults it does not need
(``--only`` names the ones kept).
"""

# size: the whole simulator — transport, replicas, faults, invariants and the command line — in
# one module, so a session can read it top to bottom; split when the apiserver grows watches.

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import functools
import logging
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from declop.errors import ApiError, Fenced
from declop.kube.fencing import WriteFence
from declop.leases.leader import LEASE_TIMINGS, LeaderElector
from declop.leases.shards import ShardLeases, ShardSet, lease_name
from declop.leases.watchdog import EXIT_BOUND, MARGIN, Watchdog
from declop.testing.fakes.apiserver import FakeApiServer
from declop.testing.simulation.loop import Actor, VirtualLoop

__all__ = ["EXIT_BOUND", "FAULT_KINDS", "SCENARIOS", "SHARD_FAULT_KINDS", "Fault", "Result", "Scenario", "SimTransport", "Violation", "main", "report_text", "run", "schedule", "shrink", "sweep"]

#: what a seed may draw (``delete`` is an administrator's, the others hit one replica). ``term``
#: is drawn apart from the others (at most one per schedule, after them), so that adding it left
#: every other seed's schedule as it was
FAULT_KINDS = ("hang", "fail", "cut", "slow", "pause", "crash", "stuck", "delete", "term")
#: what a seed of a sharded family draws besides: ``unsynced`` restarts a replica whose caches
#: never sync (a 403 on a watched resource) for the rest of that incarnation
SHARD_FAULT_KINDS = FAULT_KINDS + ("unsynced",)
#: the scenario families (``sharded`` is ``sharded-uid``, its old name); docs/simulation.md
SCENARIOS = ("leader", "sharded", "sharded-uid", "sharded-namespace", "rolling", "shared-id")
#: the second operator of ``shared-id``: another controller, another number of ranges
OTHER_CONTROLLER, OTHER_SHARDS, OTHER_REPLICAS = "gadgets", 3, 2
NAMESPACE = "sim"
LEASE_ID = "sim"
CONTROLLER = "widgets"
_EPOCH = 1_800_000_000.0  # the virtual wall clock at virtual time 0
_NAMESPACES = ("default", "payments", "search", "checkout", "auth", "billing", "mail", "web", "data", "ops")


@dataclass(frozen=True)
class Scenario:
    """What one run simulates; everything but ``faults`` has defaults matching a small cluster."""

    kind: str = "leader"  # one of SCENARIOS
    replicas: int = 3
    shards: int = 4
    keys: int = 200
    duration: float = 60.0  # virtual seconds of faults and workload; then the run settles
    lease_duration: float = LEASE_TIMINGS.lease_duration
    renew_deadline: float = LEASE_TIMINGS.renew_deadline
    retry_period: float = LEASE_TIMINGS.retry_period
    max_faults: int = 6
    #: the fault kinds a seed draws from (:data:`FAULT_KINDS`; empty: the family's default,
    #: :data:`SHARD_FAULT_KINDS` for the sharded families)
    kinds: tuple[str, ...] = ()
    #: ``rolling``: the ``--shards`` the replicas are restarted with, one by one
    to_shards: int = 6
    #: fixed faults instead of the seed's (a hand-built schedule); the seed still drives the rest
    faults: tuple[Fault, ...] | None = None
    #: keep only these faults (indices) of the seed's schedule — what :func:`shrink` finds
    only: tuple[int, ...] | None = None
    #: a cluster where the Leases never existed (the first start of an operator: a missing
    #: Lease is created a lease duration after it was found missing); by default the Leases
    #: exist, free, as an earlier run's graceful stop left them
    fresh: bool = False

    def __post_init__(self) -> None:
        if not self.kinds:
            object.__setattr__(self, "kinds", FAULT_KINDS if self.kind == "leader" else SHARD_FAULT_KINDS)

    @property
    def sharded(self) -> bool:
        return self.kind != "leader"

    def repro(self, seed: int) -> str:
        line = f"python -m declop.testing.simulation.leases --scenario {self.kind} --seed {seed}"
        default = Scenario(kind=self.kind)
        for f in ("replicas", "shards", "keys", "duration"):
            if getattr(self, f) != getattr(default, f):
                line += f" --{f} {getattr(self, f):g}"
        if self.kinds != default.kinds:
            line += f" --faults {','.join(self.kinds)}"
        if self.fresh:
            line += " --fresh"
        if self.only is not None:
            line += f" --only {','.join(map(str, self.only))}"
        if self.faults is not None:
            line += "  # with a hand-built schedule: " + "; ".join(str(f) for f in self.faults)
        return line


@dataclass(frozen=True)
class Fault:
    """One fault: from ``at`` for ``length`` virtual seconds, on ``replica`` (an index)."""

    at: float
    kind: str
    replica: int = 0
    length: float = 0.0

    def __str__(self) -> str:
        if self.kind == "delete":
            return f"t={self.at:.3f} delete: an administrator deletes a held Lease"
        if self.kind == "roll":
            return f"t={self.at:.3f} roll r{self.replica}: restarted with --shards {self.length:g}"
        if self.kind == "unsynced":
            return f"t={self.at:.3f} unsynced r{self.replica}: restarted with caches that never sync"
        if self.kind == "wall-jump":
            return f"t={self.at:.3f} wall-jump r{self.replica}: its node's wall clock steps {self.length:+.3f} s"
        if self.kind == "rollout":
            return f"t={self.at:.3f} rollout: every replica restarted in turn with Lease timings x{self.length:g}"
        if self.kind == "term":
            return f"t={self.at:.3f} term r{self.replica}: SIGTERM with a grace period of {self.length:.3f} s"
        return f"t={self.at:.3f} {self.kind} r{self.replica} for {self.length:.3f} s"


@dataclass(frozen=True)
class Violation:
    at: float
    invariant: str
    replica: str
    detail: str
    #: where a handler's code did it (a property of the user's handlers: the stack of the
    #: offending write trimmed to user code, as traceback lines); () for declop's invariants
    trace: tuple[str, ...] = ()
    #: the handler (registration name) a property of the user's handlers is about, when one is
    #: ("" for declop's invariants): ``declop sim --allow PROPERTY:HANDLER`` matches it
    handler: str = ""

    def __str__(self) -> str:
        return f"t={self.at:.3f} {self.invariant} {self.replica}: {self.detail}"


@dataclass
class Result:
    scenario: Scenario
    seed: int
    faults: list[Fault]
    violations: list[Violation]
    calls: int = 0
    requests: int = 0
    writes: int = 0  # accepted by the apiserver
    fenced: int = 0  # refused by the write fence: never sent

    @property
    def ok(self) -> bool:
        return not self.violations

    def repro(self) -> str:
        return self.scenario.repro(self.seed)

    def report(self) -> str:
        counts = f"calls: {self.calls}, writes: {self.writes} (+{self.fenced} fenced), Lease requests: {self.requests}"
        return report_text(self.repro(), self.faults, counts, self.violations)


def report_text(repro: str, faults: Sequence[Fault], counts: str, violations: Sequence[Violation]) -> str:
    """A run's report: its verdict and repro line, its faults, its counts, its first violation."""
    lines = [f"{'FAIL' if violations else 'ok'} {repro}", "faults:"]
    lines += [f"  {f}" for f in faults] or ["  (none)"]
    lines.append(counts)
    if violations:
        lines += ["first violation:", f"  {violations[0]}"]
        if violations[0].trace:
            lines += ["the handler's write (traceback, user code):", *(f"    {t}" for t in violations[0].trace)]
        if len(violations) > 1:
            lines += [f"  (and {len(violations) - 1} more)"]
    return "\n".join(lines)


def schedule(scenario: Scenario, rng: random.Random) -> list[Fault]:
    """The faults of one run, drawn from ``rng`` (sorted by time)."""
    faults = []
    kinds = tuple(k for k in scenario.kinds if k != "term")
    for _ in range(rng.randint(0, scenario.max_faults) if kinds else 0):
        kind = rng.choice(kinds)
        at = round(rng.uniform(0, scenario.duration), 3)
        length = round(rng.choice((rng.uniform(0.1, 3.0), rng.uniform(3.0, 2 * scenario.lease_duration))), 3)
        if kind == "stuck":
            length = round(rng.uniform(scenario.lease_duration, 3 * scenario.lease_duration), 3)
        faults.append(Fault(at, kind, rng.randrange(scenario.replicas), 0.0 if kind == "delete" else length))
    if scenario.kind == "rolling":  # a rollout of another --shards: one replica after the other
        roll = random.Random(f"roll-{rng.random()}")
        at = roll.uniform(5.0, scenario.duration / 2)
        # half of the rollouts stop part-way (a new pod that cannot be scheduled): the replicas
        # disagree on --shards from then on
        count = scenario.replicas if roll.random() < 0.5 else roll.randint(1, max(1, scenario.replicas - 1))
        for replica in range(count):
            faults.append(Fault(round(at, 3), "roll", replica, float(scenario.to_shards)))
            at += roll.uniform(3.0, 20.0)
    if "term" in scenario.kinds and rng.random() < 0.5:
        at, replica = round(rng.uniform(0, scenario.duration), 3), rng.randrange(scenario.replicas)
        faults.append(Fault(at, "term", replica, round(rng.uniform(0.1, 10.0), 3)))
    return sorted(faults, key=lambda f: (f.at, f.kind, f.replica))


@dataclass
class _Record:
    """The apiserver's last record of one Lease, as the invariants see it."""

    holder: str
    written_at: float
    duration: float
    deleted: bool = False

    def names(self, identity: str, now: float) -> bool:
        return self.holder == identity and now < self.written_at + self.duration


@dataclass
class _Replica:
    """One replica slot; ``gen`` counts its incarnations (a restart has empty memory)."""

    index: int
    gen: int = -1
    actor: Actor | None = None
    identity: str = ""
    net: str = "ok"  # ok | hang | fail | cut
    slow: float = 0.0
    stuck: float = 0.0  # the next call lasts this long
    exiting: bool = False
    stopping: bool = False  # a graceful stop began: no new call
    main: asyncio.Task[None] | None = None  # the Lease loop (hold, or ShardLeases.run)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    elector: LeaderElector | None = None
    shard_leases: ShardLeases | None = None
    fence: Callable[[str], bool] = lambda lease: False
    #: the covering Lease's ``valid()``, which a call's writes are checked against
    write_fence: Callable[[str], Callable[[], bool]] = lambda lease: lambda: False
    in_flight: dict[str, int] = field(default_factory=dict)  # lease -> calls running under it
    keys: dict[str, int] = field(default_factory=dict)  # key -> calls running
    since: dict[str, float] = field(default_factory=dict)  # key -> when the first of them started
    owned: Callable[[], list[str]] = lambda: []
    paused: list[list[float]] = field(default_factory=list)  # [from, until] of each pause
    wrote: dict[str, float] = field(default_factory=dict)  # lease -> its last write naming us
    controller: str = CONTROLLER
    shards: int = 0  # its --shards (sharded families)
    synced: bool = False  # its caches synced (the controller starts its workers then)
    never_sync: bool = False  # this incarnation's caches never sync

    @property
    def name(self) -> str:
        return f"r{self.index}#{self.gen}"

    def was_paused(self, since: float) -> bool:
        """Paused at some time after ``since``: it could not act on its loss (nothing stops its
        calls — fenced writes stop their writes, I9 —, so I1 and I5 do not hold it to the bound)."""
        return any(until > since for _, until in self.paused)

    @property
    def alive(self) -> bool:
        return self.actor is not None and not self.actor.dead


#: what a request of a replica under a ``fail`` fault gets, by its number modulo 4 (the fourth
#: arrives: a write is done and answered with a 500, a read is answered)
_FAILURES = {
    0: (0, "Unreachable", "connection refused"),
    1: (429, "TooManyRequests", "the apiserver is over its max-inflight limit, retry after 1 s"),
    2: (503, "ServiceUnavailable", "the apiserver is shutting down"),
}


class SimTransport:
    """One replica's way to the simulated apiserver, with its network faults."""

    def __init__(self, cluster: _Cluster, replica: _Replica) -> None:
        self.cluster, self.replica = cluster, replica
        self.actor = replica.actor

    async def request(self, method: str, path: str, *, body: Any = None, timeout: float = 30.0, **kw: Any) -> Any:
        # the network leg is two timers of the cluster (not of the replica: a request sent
        # before a pause still arrives), not a task: a task per request was most of a run's cost
        c, r = self.cluster, self.replica
        answer: asyncio.Future[Any] = c.loop.create_future()
        c.requests += 1
        latency = c.rng.uniform(0.0005, 0.005) + (c.rng.uniform(0, r.slow) if r.slow else 0.0)
        if r.actor is not self.actor or r.net == "hang":
            pass  # black-holed: no answer ever (the caller's timeout ends the wait)
        elif r.net == "fail" and c.requests % 4 != 3:
            # refused, or refused by the apiserver itself before it did anything (the request
            # number picks which: drawing it from the seed's random would move every schedule)
            status, reason, text = _FAILURES[c.requests % 4]
            error = ApiError(status, reason, f"{method} {path}: {text}")
            c.loop.call_later(latency / 4, self._answer, answer, None, error, False, context=c._neutral)
        else:
            c.loop.call_later(latency / 2, self._arrive, answer, method, path, body, kw.get("params"), latency, context=c._neutral)
        return await answer

    def _arrive(self, answer: asyncio.Future[Any], method: str, path: str, body: Any, params: Any, latency: float) -> None:
        c, r = self.cluster, self.replica
        if r.actor is not self.actor or r.net == "hang":
            return
        result: Any = None
        error: BaseException | None = None
        serving = c.server.request(method, path, body=body, params=params, lane="leader")
        try:
            serving.send(None)  # the fake apiserver answers without awaiting anything
        except StopIteration as done:
            result = done.value
            c.served(r, method, path, result)
        except ApiError as exc:
            error = exc
        else:
            serving.close()
            raise RuntimeError("the fake apiserver awaited inside a request")
        if r.net == "fail" and method != "GET":
            # the other failure: the write was done, the answer says it timed out (etcd's
            # "request timed out" is a 500 after the write may have been committed)
            result, error = None, ApiError(500, "InternalError", f"{method} {path}: etcdserver: request timed out")
        c.loop.call_later(latency / 2, self._answer, answer, result, error, True, context=c._neutral)

    def _answer(self, answer: asyncio.Future[Any], result: Any, error: BaseException | None, lossy: bool) -> None:
        if answer.done() or (lossy and self.replica.net in ("hang", "cut")):
            return  # the answer is lost
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)


@functools.lru_cache(maxsize=None)
def _uid(key: str) -> str:
    """The uid of ``key``'s object: random, as the apiserver's, but the same in every run (a name
    would not do: FNV-1a's top bits hardly see a last character)."""
    return str(uuid.UUID(int=random.Random(f"uid-{key}").getrandbits(128)))


@functools.lru_cache(maxsize=None)
def _covers(kind: str, keys: int, controller: str, n: int) -> dict[str, tuple[str, int]]:
    """key -> (the Lease covering it, its range), for ``controller``'s keys under ``--shards n``
    in a cluster of family ``kind`` with ``keys`` keys: a pure function of these, computed once
    per process (every run of a sweep asks again). Shared between runs: only read, never changed."""
    cluster_keys = _Cluster.key_names(kind, keys)[controller]
    #: what a key's range is chosen by: its namespace, or its object's uid
    hashed = {k: k.split("/")[0] if kind == "sharded-namespace" else _uid(k) for k in cluster_keys}
    ranges = ShardSet(controller, n or 1, "uid", [])  # only for index()
    if kind == "leader":
        return {k: (LEASE_ID, 0) for k in cluster_keys}
    return {k: (lease_name(LEASE_ID, controller, i, n), i) for k in cluster_keys for i in (ranges.index(hashed[k]),)}


class _Cluster:
    def __init__(self, scenario: Scenario, seed: int, loop: VirtualLoop) -> None:
        self.scenario, self.seed, self.loop = scenario, seed, loop
        self.rng = random.Random(f"net-{seed}")
        # nothing watches, pages a LIST or reads the recorded writes: none are kept (a run's
        # answers are the same, without a copy of every Lease written, twice)
        self.server = FakeApiServer(history=0)
        self.server.record_writes = False
        self.records: dict[str, _Record] = {}
        #: Lease name -> when it was last created (the free ones a run starts with: 0)
        self.created: dict[str, float] = {}
        self.violations: list[Violation] = []
        self.replicas = [_Replica(i) for i in range(scenario.replicas)]
        self.requests = 0
        self.calls = 0
        self.writes = self.fenced = 0
        self.last_change = 0.0  # the last fault, exit or restart
        self._neutral = contextvars.Context()
        if scenario.kind == "shared-id":
            for i in range(OTHER_REPLICAS):
                self.replicas.append(_Replica(scenario.replicas + i, controller=OTHER_CONTROLLER))
        for r in self.replicas:
            r.shards = OTHER_SHARDS if r.controller == OTHER_CONTROLLER else scenario.shards
        self.keys = self.key_names(scenario.kind, scenario.keys)

    def cover(self, r: _Replica) -> dict[str, tuple[str, int]]:
        """The Lease and the range covering each key of ``r``'s controller, for its --shards."""
        return _covers(self.scenario.kind, self.scenario.keys, r.controller, r.shards)

    @staticmethod
    def key_names(kind: str, keys: int) -> dict[str, list[str]]:
        """Each controller's keys in a cluster of family ``kind``."""
        if kind == "sharded-namespace":  # ten namespaces: ranges are lumpy, some empty
            names = {CONTROLLER: [f"{_NAMESPACES[i % 10]}/key-{i:04d}" for i in range(keys)]}
        else:
            names = {CONTROLLER: [f"key-{i:04d}" for i in range(keys)]}
        if kind == "shared-id":
            names[OTHER_CONTROLLER] = [f"gadget-{i:04d}" for i in range(keys // 2)]
        return names

    # -- plumbing -------------------------------------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro, context=self._neutral)

    def now(self) -> float:
        return self.loop.time()

    def wall(self) -> float:
        return _EPOCH + self.loop.time()

    def violate(self, invariant: str, replica: _Replica | str, detail: str) -> None:
        who = replica if isinstance(replica, str) else replica.name
        self.violations.append(Violation(round(self.now(), 6), invariant, who, detail))

    # -- what the apiserver saw -----------------------------------------------------------------
    def served(self, r: _Replica, method: str, path: str, result: Any) -> None:
        """A Lease write was applied: check I5 and I6, and keep the record."""
        if "/leases" not in path or method == "GET":
            return
        if method == "DELETE":
            name = path.rsplit("/", 1)[1]
            self._deleted(name, r)
            return
        name = result["metadata"]["name"]
        spec = result.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        old = self.records.get(name)
        if old is not None and old.holder == r.identity and not holder and r.in_flight.get(name):
            self.violate("I6", r, f"released {name} with {r.in_flight[name]} call(s) under it still running")
        if holder and (old is None or old.holder != holder):
            for other in self.replicas:
                # paused since its own last write of the Lease: it could not act on its loss
                # (another replica may have held and released the Lease meanwhile)
                since = other.wrote.get(name, 0.0)
                if other is not r and other.alive and other.in_flight.get(name) and not other.was_paused(since):
                    self.violate("I5", other, f"still alive with {other.in_flight[name]} call(s) under {name}, acquired by {r.name}")
        if holder == r.identity:
            r.wrote[name] = self.now()
        self.records[name] = _Record(holder, self.now(), float(spec.get("leaseDurationSeconds") or 0))
        if method == "POST":
            self.created[name] = self.now()

    def _deleted(self, name: str, by: _Replica | None) -> None:
        old = self.records.get(name)
        if old is None:
            return
        if by is not None and old.holder == by.identity and by.in_flight.get(name):
            self.violate("I6", by, f"deleted {name} with calls under it still running")
        old.deleted = True

    # -- calls ----------------------------------------------------------------------------------
    def call_started(self, r: _Replica, key: str, lease: str) -> None:
        self.calls += 1
        rec = self.records.get(lease)
        if rec is None or not rec.names(r.identity, self.now()):
            what = "no record" if rec is None else f"holder {rec.holder!r}, written at {rec.written_at:.3f} for {rec.duration:g} s"
            self.violate("I2", r, f"call of {key} started under {lease} ({what})")
        for other in self.replicas:
            if other is not r and other.controller == r.controller and other.alive and other.keys.get(key) and not other.was_paused(other.since[key]):
                self.violate("I1", r, f"call of {key} started while {other.name} runs one")
        r.since.setdefault(key, self.now())
        r.keys[key] = r.keys.get(key, 0) + 1
        r.in_flight[lease] = r.in_flight.get(lease, 0) + 1

    def write(self, r: _Replica, key: str, lease: str) -> None:
        """A call writes ``key``: the transport's fence check, then (I9) the apiserver's record
        of ``lease`` must name ``r``, unexpired, when it accepts the write."""
        try:
            WriteFence(r.write_fence(lease), lease, key).check("PATCH", key)
        except Fenced:
            self.fenced += 1
            return
        self.writes += 1
        rec = self.records.get(lease)
        if rec is None or not rec.names(r.identity, self.now()):
            what = "no record" if rec is None else f"holder {rec.holder!r}, written at {rec.written_at:.3f} for {rec.duration:g} s"
            self.violate("I9", r, f"write of {key} accepted under {lease} ({what})")

    def call_ended(self, r: _Replica, key: str, lease: str) -> None:
        for d, k in ((r.keys, key), (r.in_flight, lease)):
            d[k] -= 1
            if not d[k]:
                del d[k]
        if key not in r.keys:
            del r.since[key]

    # -- replicas -------------------------------------------------------------------------------
    def start(self, r: _Replica) -> None:
        if r.alive:  # the harness's own mistake, reported like a finding: a pod never runs two
            # incarnations at once (a crash's restart once started one over a rollout's)
            self.violate("harness", r, f"started while its incarnation #{r.gen} still runs")
            self.kill(r)
        r.gen += 1
        r.actor = Actor(self.loop, f"r{r.index}")
        r.identity = r.name
        r.exiting, r.stopping, r.stuck, r.workers = False, False, 0.0, []
        r.elector, r.shard_leases = None, None
        r.in_flight, r.keys, r.since, r.paused, r.wrote = {}, {}, {}, [], {}
        r.fence, r.owned = (lambda lease: False), (lambda: [])
        r.write_fence = lambda lease: lambda: False
        r.synced = False
        self.last_change = self.now()
        transport = SimTransport(self, r)
        s = self.scenario
        timings = dict(lease_duration=s.lease_duration, renew_deadline=s.renew_deadline, retry_period=s.retry_period)
        if s.kind == "leader":
            r.synced = True
            r.main = r.actor.spawn(self._leader(r, transport, timings))
        else:
            if not r.never_sync:
                r.actor.spawn(self._sync(r))
            r.main = r.actor.spawn(self._sharded(r, transport, timings))
        r.main.add_done_callback(lambda task: self._raised(r, task))

    def _raised(self, r: _Replica, task: asyncio.Task[None]) -> None:
        """An exception out of the Lease code is a bug (the manager would log it and exit 1):
        reported, not left to end the replica's task in silence."""
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.violate("bug", r, f"the Lease code raised {type(exc).__name__}: {exc}")

    async def _sync(self, r: _Replica) -> None:
        """The replica's caches sync 0.05-1.5 s after its start (its informers' first LISTs)."""
        await asyncio.sleep(random.Random(f"sync-{self.seed}-{r.index}-{r.gen}").uniform(0.05, 1.5))
        r.synced = True

    async def _leader(self, r: _Replica, transport: SimTransport, timings: dict[str, float]) -> None:
        assert r.actor is not None
        e = LeaderElector(transport, name=LEASE_ID, namespace=NAMESPACE, identity=r.identity, clock=self.loop.time, wall_clock=self.wall, **timings)  # type: ignore[arg-type]
        r.fence = lambda lease: e.valid()
        r.write_fence = lambda lease: e.valid
        r.owned = lambda: [LEASE_ID] if e.valid() else []
        r.elector = e
        e.running = lambda: sum(r.in_flight.values())  # the manager's count: calls whose thread still runs
        await e.acquire()
        for w in range(2):
            r.workers.append(r.actor.spawn(self._worker(r, w)))
        await e.hold()
        self.exit(r)  # the manager: a lost Lease halts the workers and exits 1

    async def _sharded(self, r: _Replica, transport: SimTransport, timings: dict[str, float]) -> None:
        assert r.actor is not None
        sl = ShardLeases(transport, lease_id=LEASE_ID, namespace=NAMESPACE, identity=r.identity, clock=self.loop.time, wall_clock=self.wall, **timings)  # type: ignore[arg-type]
        sl.suffix = f"r{r.index}-{r.gen}"  # deterministic member Lease names
        s = sl.add(r.controller, r.shards, "namespace" if self.scenario.kind == "sharded-namespace" else "uid")
        s.synced = lambda: r.synced  # the manager: the controller's caches synced
        names = [e.name for e in s.electors]
        r.fence = lambda lease: r.synced and s.may_start(names.index(lease))
        r.write_fence = lambda lease: s.electors[names.index(lease)].valid  # not draining: it may finish
        r.owned = lambda: [names[i] for i in range(s.n) if s.electors[i].valid()] if r.synced else []
        r.shard_leases = sl
        for w in range(2):
            r.workers.append(r.actor.spawn(self._worker(r, w, s)))
        await sl.run()
        self.exit(r)  # the manager's _shard: halt the controllers, exit 1

    async def _worker(self, r: _Replica, w: int, s: ShardSet | None = None) -> None:
        rng = random.Random(f"work-{self.seed}-{r.index}-{r.gen}-{w}")
        actor = r.actor
        keys, cover = self.keys[r.controller], self.cover(r)
        while not r.exiting and not r.stopping:
            await asyncio.sleep(rng.expovariate(2.0))
            if r.actor is not actor:
                return  # killed while asleep (a task of a dead replica may run once more)
            key = rng.choice(keys)
            lease, i = cover[key]
            if r.exiting or r.stopping or not r.fence(lease):
                continue
            if s is not None:  # the worker's take (fence.owned) counts it in flight for its range
                s.begin(i)
                await asyncio.sleep(0.001)  # preparation (cache read, finalizer)
                if r.exiting or r.stopping or not r.fence(lease):
                    s.end(i)
                    continue
            stuck = r.stuck
            duration, r.stuck = (stuck or rng.choice((rng.uniform(0.005, 0.3), rng.uniform(0.005, 0.3), rng.uniform(0.3, 4.0)))), 0.0
            if stuck:
                # a stuck call is a fault until it ends, not from its draw: the next call may
                # start long after (sharded-namespace seed 1525: drawn at 30.6 s, run 87-127 s
                # under a range its replica was draining, which nobody may take meanwhile — I1)
                self.last_change = max(self.last_change, self.now() + duration)
            self.call_started(r, key, lease)
            ends_at, handed = self.now() + duration, False
            try:
                await asyncio.sleep(duration)  # a call cannot be cancelled: it ends, or its process does
                self.write(r, key, lease)
            except asyncio.CancelledError:
                # the worker was cancelled (the grace period is over), not the process: the call
                # runs on in its thread, and stays in flight — as the controller counts it — until it ends
                if actor is not None and r.actor is actor and r.alive and self.now() < ends_at:
                    handed = True
                    actor.spawn(self._rest_of_call(r, key, lease, s, i, ends_at))
                raise
            finally:
                if not handed:
                    if r.actor is actor and r.alive:
                        self.call_ended(r, key, lease)
                    if s is not None:
                        s.end(i)

    async def _rest_of_call(self, r: _Replica, key: str, lease: str, s: ShardSet | None, i: int, ends_at: float) -> None:
        """The rest of a call whose worker was cancelled: a plain handler's thread."""
        actor = r.actor
        try:
            await asyncio.sleep(ends_at - self.now())
            if r.actor is actor and r.alive:
                self.write(r, key, lease)  # its write at its end, through the same fence
        finally:
            if r.actor is actor and r.alive:
                self.call_ended(r, key, lease)
            if s is not None:
                s.end(i)

    async def _term(self, r: _Replica, grace: float) -> None:
        """A graceful stop, in the manager's order: no new call (or range); the running calls
        get ``grace`` seconds while the Leases are still renewed; the workers are cancelled (a
        call in a thread runs on); renewing stops; the real release of the Leases — which must
        leave a Lease with a call under it to expire — and the process exits."""
        actor = r.actor
        r.stopping = True
        if r.shard_leases is not None:
            r.shard_leases.stopping = True
        until = self.now() + grace
        while r.in_flight and self.now() < until:
            await asyncio.sleep(min(0.05, until - self.now()))
        for task in r.workers:
            task.cancel()
        await asyncio.sleep(0)  # the workers take their cancellation
        if r.main is not None:
            r.main.cancel()
        e, sl = r.elector, r.shard_leases
        if (e is not None and e.is_leader and e.running is not None and e.running()) or (sl is not None and sl.busy()):
            # the manager: a Lease left to expire under a running call is a loss — the
            # watchdog is armed and the process is gone EXIT_BOUND later, whatever the release
            # of the other Leases still waits for (shared-id seed 402: 10 s under a partition)
            self.exit(r)
        if e is not None:
            await e.release()
        elif sl is not None:
            await sl.release_all()
        if r.exiting:
            return  # the watchdog ends the process
        self.last_change = self.now()
        self.spawn(self._gone(r, actor))

    def exit(self, r: _Replica) -> None:
        """The replica stops starting calls now and arms the watchdog, as ``declop run`` does:
        the watchdog's timer fires ``EXIT_BOUND - MARGIN`` later and the exit itself is given
        the margin, so the process is gone :data:`EXIT_BOUND` after the loss."""
        if r.exiting:
            return
        r.exiting = True
        actor = r.actor
        self.last_change = self.now()

        def timer(seconds: float, fire: Callable[[], None]) -> None:
            self.loop.call_later(seconds + MARGIN, fire, context=self._neutral)

        def fire() -> None:
            self.spawn(self._gone(r, actor))

        Watchdog(EXIT_BOUND, fire=fire, timer=timer).arm()

    async def _gone(self, r: _Replica, actor: Actor | None) -> None:
        """The process ``actor`` is gone now; the kubelet restarts it after a delay."""
        if r.actor is actor:
            self.kill(r)
            await asyncio.sleep(1.0 + self.rng.uniform(0, 5))
            if r.actor is actor:
                self.start(r)

    def kill(self, r: _Replica) -> None:
        assert r.actor is not None
        r.actor.kill()
        r.in_flight, r.keys, r.since = {}, {}, {}
        r.fence = lambda lease: False
        r.never_sync = False  # a later start syncs (unless an unsynced fault says otherwise)
        self.last_change = self.now()

    # -- faults ---------------------------------------------------------------------------------
    async def inject(self, f: Fault) -> None:
        await asyncio.sleep(f.at)
        r = self.replicas[f.replica]
        if f.kind not in ("roll", "unsynced"):
            self.last_change = max(self.last_change, f.at + (0.0 if f.kind == "term" else f.length))
        if f.kind == "delete":
            held = sorted(n for n, rec in self.records.items() if rec.holder and not rec.deleted)
            if held:
                name = held[self.rng.randrange(len(held))]
                try:
                    await self.server.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}")
                    self._deleted(name, None)
                except ApiError:
                    pass
            return
        if f.kind == "stuck":
            r.stuck = f.length
            return
        if f.kind in ("roll", "unsynced"):  # a restart: a new --shards, or caches that never sync
            if r.alive:
                self.kill(r)
            await asyncio.sleep(1.0)
            if r.alive:
                self.kill(r)  # a crash's restart came in between: one incarnation at a time
            if f.kind == "roll":
                r.shards = int(f.length)
            r.never_sync = f.kind == "unsynced"
            self.start(r)
            return
        if f.kind == "term":
            if r.alive and not r.exiting and not r.stopping and r.actor is not None:
                r.actor.spawn(self._term(r, f.length))
            return
        if f.kind == "crash":
            if r.alive:
                self.kill(r)
                await asyncio.sleep(f.length)
                if not r.alive:  # a rollout may have restarted it meanwhile: never two incarnations
                    self.start(r)
            return
        actor = r.actor
        if f.kind == "pause":
            assert actor is not None
            actor.pause()
            span = [f.at, float("inf")]
            r.paused.append(span)
            await asyncio.sleep(f.length)
            span[1] = self.now()
            actor.resume()
            return
        if f.kind == "slow":
            r.slow = f.length / 4
        else:
            r.net = f.kind
        await asyncio.sleep(f.length)
        r.net, r.slow = "ok", 0.0

    async def watch_owners(self, settle_from: float, until: float) -> None:
        """I7: from two lease durations after the last change, every key of every controller is
        covered by a range (of its replica's --shards) with a live owner — every range, when all
        replicas of a controller agree on --shards and the keys fill the ranges."""
        s = self.scenario
        while self.now() < until:
            await asyncio.sleep(s.retry_period)
            if self.now() < max(settle_from, self.last_change) + 2 * s.lease_duration:
                continue
            live = [r for r in self.replicas if r.alive and not r.exiting and not (r.actor and r.actor.paused)]
            owned = {lease for r in live for lease in r.owned()}
            able = {r.controller for r in live if r.synced}  # a replica whose caches never sync owns nothing
            # each unowned key: every Lease that may cover it (one per split of its controller;
            # the first split's names the key in the report)
            lacking: list[tuple[str, ...]] = []
            if s.kind == "leader":
                lacking = [] if LEASE_ID in owned else [(LEASE_ID,)]
            else:
                splits = {(r.controller, r.shards): r for r in self.replicas}
                for controller, keys in self.keys.items():
                    if controller not in able:
                        continue  # every live replica of it has caches that never sync (unsynced)
                    covers = [self.cover(r) for (c, _), r in sorted(splits.items()) if c == controller]
                    lacking += [leases for k in keys for leases in (tuple(cover[k][0] for cover in covers),) if not any(lease in owned for lease in leases)]
            since = max(settle_from, self.last_change)
            if self.now() < since + 2 * s.lease_duration + s.renew_deadline:
                # a Lease that did not exist then is created a lease duration after it was first
                # found missing and opens a renew deadline after its creation. In a
                # stopped rollout a key is owed by whichever split takes it, so it gets the
                # extra renew deadline when any of its Leases was absent — not only the first
                # split's: rolling seed 1034 had the new split's ranges missing (its Leases were
                # created at 87.66 s, open at 98.67 s, 31.6 s after the last change) while the
                # old split's existed, held by nobody, and its replica rightly gave way
                absent: dict[str, bool] = {}
                lacking = [leases for leases in lacking if not any(absent.setdefault(lease, self._absent(lease, since)) for lease in leases)]
            missing = sorted({leases[0] for leases in lacking})
            if missing:
                self.violate("I7", "-", f"no live owner of {', '.join(missing)} {self.now() - since:.3f} s after the last change")
                return

    def _absent(self, lease: str, since: float) -> bool:
        """Did ``lease`` not exist at ``since`` — created after it, or missing (deleted, or never
        created) now?"""
        at = self.created.get(lease)
        rec = self.records.get(lease)
        return at is None or at > since or (rec is not None and rec.deleted)


def run(scenario: Scenario, seed: int) -> Result:
    """Simulate one schedule: the seed draws the faults (unless the scenario fixes them), the
    workload, the network's latencies and the Lease code's jitter."""
    rng = random.Random(seed)
    faults = list(scenario.faults) if scenario.faults is not None else schedule(scenario, rng)
    if scenario.only is not None:
        faults = [faults[i] for i in scenario.only if i < len(faults)]
    loop = VirtualLoop()
    cluster = _Cluster(scenario, seed, loop)
    saved = random.getstate()
    random.seed(f"jitter-{seed}")  # LeaderElector.acquire's jitter
    try:
        loop.run_until_complete(_main(cluster, faults))
    finally:
        random.setstate(saved)
        for _ in range(3):  # a cancelled task may await another's cancellation (a gather)
            tasks = asyncio.all_tasks(loop)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        loop.close()
    return Result(scenario, seed, faults, cluster.violations, cluster.calls, cluster.requests, cluster.writes, cluster.fenced)


def shrink(failed: Result) -> Result:
    """The fewest of ``failed``'s faults that still fail, found greedily: drop each fault in
    turn and keep it dropped if the run still fails (every other random stream stays the same,
    so the rest of the run does not change). Returns the last failing run (``scenario.only``
    names the faults kept) — ``failed`` itself if nothing could go."""
    if failed.ok or failed.scenario.faults is not None:
        return failed
    kept = list(failed.scenario.only if failed.scenario.only is not None else range(len(failed.faults)))
    best = failed
    for index in list(kept):
        trial = [i for i in kept if i != index]
        result = run(dataclasses.replace(failed.scenario, only=tuple(trial)), failed.seed)
        if not result.ok:
            kept, best = trial, result
    return best


async def _main(c: _Cluster, faults: list[Fault]) -> None:
    s = c.scenario
    if not s.fresh:
        names = [LEASE_ID] if s.kind == "leader" else [lease_name(LEASE_ID, CONTROLLER, i, s.shards) for i in range(s.shards)]
        for name in names:  # free, as an earlier run's graceful stop left them
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {}}
            await c.server.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", body=body)
            c.created[name] = 0.0
    for r in c.replicas:
        c.start(r)
    for f in faults:
        c.spawn(c.inject(f))
    end_of_faults = max([s.duration] + [f.at + f.length for f in faults])
    until = end_of_faults + 3 * s.lease_duration
    owners = c.spawn(c.watch_owners(end_of_faults, until))
    await asyncio.sleep(until - c.now())
    await owners
    for r in c.replicas:
        if r.actor is not None:
            r.actor.kill()
    await asyncio.sleep(0)


# --------------------------------------------------------------------------- command line


def _virtual_time(record: logging.LogRecord) -> bool:
    """``-v``'s lines: the virtual instant of each (``-`` outside the run), and its pairs."""
    try:
        record.vt = f"{asyncio.get_running_loop().time():.3f}"
    except RuntimeError:
        record.vt = "-"
    if not hasattr(record, "kv"):
        record.kv = ""
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m declop.testing.simulation.leases", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", choices=SCENARIOS, default="leader")
    p.add_argument("--seed", type=int, help="run this one seed and print its schedule")
    p.add_argument("--seeds", type=int, default=100, help="run this many seeds (from --start)")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--replicas", type=int, default=Scenario.replicas)
    p.add_argument("--shards", type=int, default=Scenario.shards)
    p.add_argument("--keys", type=int, default=Scenario.keys)
    p.add_argument("--duration", type=float, default=Scenario.duration)
    p.add_argument("--only", default=None, help="keep only these faults of the seed's schedule (indices, comma-separated)")
    p.add_argument("--no-shrink", action="store_true", help="do not shrink a failing --seed run")
    p.add_argument("--faults", default="", help="the fault kinds to draw from (comma-separated; default: all the family's)")
    p.add_argument("--jobs", type=int, default=1, help="run --seeds in this many processes (one per core)")
    p.add_argument("--fresh", action="store_true", help="start in a cluster where the Leases never existed (the first start of an operator)")
    p.add_argument("-v", "--verbose", action="store_true", help="print declop's log lines (stderr)")
    args = p.parse_args(argv)
    logging.getLogger("declop").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL + 1)
    if args.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_virtual_time)
        handler.setFormatter(logging.Formatter("t=%(vt)s %(message)s %(kv)s"))
        logging.getLogger("declop").addHandler(handler)
    kinds = tuple(k for k in args.faults.split(",") if k)
    unknown = sorted(set(kinds) - set(SHARD_FAULT_KINDS))
    if unknown:
        p.error(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(SHARD_FAULT_KINDS)}")
    only = tuple(int(i) for i in args.only.split(",") if i) if args.only is not None else None
    scenario = Scenario(kind=args.scenario, replicas=args.replicas, shards=args.shards, keys=args.keys, duration=args.duration, kinds=kinds, only=only, fresh=args.fresh)
    if args.seed is not None:
        result = run(scenario, args.seed)
        print(result.report())
        if not result.ok and not args.no_shrink:
            shrunk = shrink(result)
            if len(shrunk.faults) < len(result.faults):
                print(f"shrunk to {len(shrunk.faults)} fault(s):")
                print(shrunk.report())
        return 0 if result.ok else 1
    began = time.perf_counter()
    failures = sweep(scenario, range(args.start, args.start + args.seeds), jobs=args.jobs, echo=True)
    took = time.perf_counter() - began
    print(
        f"{args.seeds} seeds, {len(failures)} failed, {took:.1f} s: {args.seeds / took * 60:.0f} schedules per minute"
        + (f" ({args.jobs} processes)" if args.jobs > 1 else "")
    )
    return 1 if failures else 0


def _failures(scenario: Scenario, seeds: Sequence[int]) -> list[str]:
    """One line per failing seed of ``seeds`` (a process of :func:`sweep`)."""
    logging.getLogger("declop").setLevel(logging.CRITICAL + 1)
    return [f"FAIL {r.repro()}  # {r.violations[0]}" for r in (run(scenario, seed) for seed in seeds) if not r.ok]


def sweep(scenario: Scenario, seeds: Sequence[int], *, jobs: int = 1, echo: bool = False) -> list[str]:
    """Run every seed of ``seeds``; one line per failing one (in seed order). ``jobs`` > 1 runs
    them in that many processes (each seed's run is the same wherever it runs)."""
    seeds = list(seeds)
    if jobs <= 1:
        lines = []
        for seed in seeds:
            result = run(scenario, seed)
            if not result.ok:
                lines.append(f"FAIL {result.repro()}  # {result.violations[0]}")
                if echo:
                    print(lines[-1], flush=True)
        return lines
    import concurrent.futures
    import multiprocessing

    chunk = max(1, min(50, len(seeds) // (jobs * 4) or 1))
    parts = [seeds[i : i + chunk] for i in range(0, len(seeds), chunk)]
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    lines = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for part in pool.map(_failures, [scenario] * len(parts), parts):
            lines += part
            if echo:
                for line in part:
                    print(line, flush=True)
    return lines


if __name__ == "__main__":
    raise SystemExit(main())

