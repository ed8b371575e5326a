"""The **crash-safety** property of a world run: a replica killed between two writes of one reconcile.

A process dies at any instant: after a handler's first write reached the apiserver and before its
second did, the cluster holds half of what the reconcile meant to do. A crash-safe handler finds
that half on its next run (any replica's) and finishes the job; an unsafe one starts over and
does the first half twice — the classic case is a child created with ``generateName`` whose name
is recorded in the primary by a second write: killed between the two, the next reconcile finds no
record and creates a second child. :class:`Crashes` kills replicas so (docs/simulation.md,
"Crash safety"), with the fault kind :data:`CRASH_BETWEEN_WRITES` (``--faults`` without it: none):

- each seed draws, from its own stream (``crash-<seed>``: the other draws of the run do not move),
  between 1 and :data:`MOST` crash times in the first :data:`WITHIN` of the workload's duration,
  and a restart delay for each;
- the first handler write at or after a crash time whose handler line is *followed*: an earlier
  call wrote again after a write from that line (so a crash after it falls between two writes,
  not after a call's last one), is a crash point: the write is applied and its replica is killed
  at once (the call sees no answer, sends nothing more), then started again, with empty memory,
  after its delay. One crash per call; none in the idempotence check's calls.

:func:`crash_safety` is the check, once the world settled; it reports at most one violation:

- **lost cleanup** — a crashed call that was a cleanup (its object held by the controller's
  finalizer, being deleted) whose object (that uid) is still there: the cleanup never completed;
- **duplicate child** — a crashed call created child X of a kind; a later call of the same
  controller for the same primary created Y of that kind while X was there (X's create was the
  last of its name, so X stood from then on); X and Y are both there at the end, the primary too
  (not deleted since X was created); and the primary has more live children of that kind than
  any primary no crashed call touched (the *peers*: what the handler makes when nothing
  crashes; with no peer having a child of the kind, nothing is judged). The peers keep a handler
  that makes several children of a kind (replicas, one per item of its spec) from a false alarm:
  its re-run creates the missing ones, and ends with the count the peers have.

A child is an object a handler call created (a changing ``POST``, the last of its name), counted
for its call's primary key; it does not have to carry an ownerReference.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from declop.kube.keys import Request
from declop.testing.simulation.leases import Violation
from declop.testing.simulation.gc import _stored, _where
from declop.testing.simulation.props import Call, Write, Writes

__all__ = ["CRASH_BETWEEN_WRITES", "MOST", "RESTART", "WITHIN", "CrashPoint", "Crashes", "crash_safety"]

#: the fault kind: kill a replica between two writes of one reconcile
CRASH_BETWEEN_WRITES = "crash-between-writes"
#: crash points a seed draws, at most (at least one)
MOST = 3
#: the crash times are drawn in this share of the workload's duration (the rest, and the
#: settling, leave the world time to converge)
WITHIN = 0.8
#: a killed replica starts again after this many virtual seconds (drawn between the two)
RESTART = (1.0, 6.0)


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """One kill: the replica that ran ``call``, right after its ``write``-th write (``after``) applied."""

    at: float
    call: Call
    replica: str
    write: int
    after: Write
    #: the uid of the object the call was cleaning up (its finalizer holding it), or None
    cleanup: str | None = None

    def text(self) -> str:
        return (
            f"{self.replica} was killed at t={self.at:.3f} right after write {self.write} of handler "
            f"{self.call.controller} for {self.call.key} ({self.after.verb} {self.after.target}, {self.after.line.strip()})"
        )


@dataclass
class Crashes:
    """The crash points of one run: when to kill, and what was killed."""

    seed: int
    duration: float
    #: crash times not reached yet, sorted, and each one's restart delay
    times: list[float] = field(init=False)
    delays: list[float] = field(init=False)
    points: list[CrashPoint] = field(default_factory=list)
    #: each call's writes so far and the (controller, line) of its last one
    written: dict[Call, tuple[int, tuple[str, str]]] = field(default_factory=dict)
    #: (controller, handler line) of writes that a later write of the same call followed
    followed: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        rng = random.Random(f"crash-{self.seed}")
        n = rng.randint(1, MOST)
        self.times = sorted(round(rng.uniform(0.0, WITHIN * self.duration), 3) for _ in range(n))
        self.delays = [round(rng.uniform(*RESTART), 3) for _ in range(n)]

    def due(self, now: float, write: Write) -> bool:
        """Note ``write`` (applied); whether its replica is to be killed now: a crash time has
        passed, and the write's line was followed by another write of its call before."""
        call = write.call
        n, last = self.written.get(call, (0, None))
        if last is not None:
            self.followed.add(last)
        here = (call.controller, write.line)
        self.written[call] = (n + 1, here)
        if not self.times or now < self.times[0] or call.extra or write.line == "?":
            return False
        return here in self.followed and not any(p.call == call for p in self.points)

    def crash(self, now: float, write: Write, replica: str, cleanup: str | None) -> float:
        """Record the kill of ``replica`` right after ``write``; the delay before it starts again."""
        self.times.pop(0)
        self.points.append(CrashPoint(now, write.call, replica, self.written[write.call][0], write, cleanup))
        return self.delays[len(self.points) - 1]

    def counts(self) -> str:
        return f"replicas killed between two writes of a reconcile: {len(self.points)}"


def crash_safety(
    server: Any, writes: Writes, crashes: Crashes, resource_of: Callable[[str], str | None], now: float,
    deleted: Mapping[tuple[str, Request], float] = {},  # noqa: B006 - read only
) -> Violation | None:  # fmt: skip
    """The crash-safety violation of a settled world, or None (module docstring). ``resource_of``:
    a controller's primary resource (None: not a controller); ``deleted``: (resource, key) -> when
    its object was last deleted."""
    for p in crashes.points:
        if p.cleanup is None:
            continue
        resource = resource_of(p.call.controller)
        obj = _stored(server, resource, p.call.key) if resource is not None else None
        if obj is not None and obj["metadata"].get("uid") == p.cleanup:
            detail = (
                f"the cleanup of {p.call.key} (uid {p.cleanup[:8]}) by {p.call.controller} never completed after a crash: "
                f"{p.text()}, and {p.call.key} is still there {now - p.at:.3f} s later — the cleanup must finish on its "
                f"next run from what the cluster holds (a step already done is found done, not skipped nor failed)"
            )
            return Violation(now, "crash-safety", "-", detail, p.after.trace, p.call.controller)
    # the live children: the last create of each name, counted for its call's primary
    last: dict[str, Write] = {}
    for w in writes.changed:
        if w.verb == "POST":
            last[w.target] = w
    live: dict[tuple[str, Request], list[Write]] = collections.defaultdict(list)
    for target, w in last.items():
        resource = resource_of(w.call.controller)
        if resource is None or _stored(server, *_where(target)) is None:
            continue
        if _stored(server, resource, w.call.key) is None or deleted.get((resource, w.call.key), -1.0) >= w.at:
            continue  # its primary went since: ownership's business
        live[(w.call.controller, w.call.key)].append(w)
    touched = {(p.call.controller, p.call.key) for p in crashes.points}
    peers: dict[tuple[str, str], int] = {}
    for (controller, key), children in live.items():
        if (controller, key) not in touched:
            for kind, n in collections.Counter(_kind(w) for w in children).items():
                peers[(controller, kind)] = max(peers.get((controller, kind), 0), n)
    for p in crashes.points:
        children = live.get((p.call.controller, p.call.key), [])
        for x in (w for w in children if w.call == p.call):
            kind = _kind(x)
            ys = [w for w in children if _kind(w) == kind and w.call != p.call and w.at > p.at]
            n, most = sum(_kind(w) == kind for w in children), peers.get((p.call.controller, kind), 0)
            if not ys or not most or n <= most:
                continue
            y = ys[0]
            detail = (
                f"{p.call.key} has {n} {kind} created by {p.call.controller}, where a primary no crash touched has at most "
                f"{most}: {y.target}, created at t={y.at:.3f}, duplicates {x.target}, created at t={x.at:.3f} by a call "
                f"killed before its next write ({p.text()}); a reconcile must find what an interrupted one created — "
                f"a deterministic name (409 AlreadyExists: it is there) or a lookup by label or ownerReference, "
                f"not a record written after the create"
            )
            return Violation(now, "crash-safety", "-", detail, y.trace, y.call.controller)
    return None


def _kind(w: Write) -> str:
    """The resource (plural) a write's target is of."""
    return w.target.partition(" ")[0]
