"""Properties of the user's handlers in a world run: **idempotence** and **quiescence**.

Where the invariants of :mod:`declop.testing.simulation.world` hold declop to its own promises, these
hold a handlers file to what a correct operator does (docs/simulation.md, one section each):

- **quiescence** — once the workload and the faults stop, the handlers' writes that change
  something stop within a bound (:data:`QUIET_AFTER` lease durations), and stay stopped for a
  window (one lease duration). A write that changes something after that is a hot loop; the
  report names its cycle — handler → write → event → same handler — with its period in virtual
  seconds. A run that hits its step bound first (:class:`Bounds`) is a quiescence failure too:
  something kept the loop busy for ever.
- **idempotence** — once the world has converged (quiet), one more reconcile of every object the
  handlers watch (each controller's cached primary keys, queued again: a resync) sends no write
  that changes something. Writes that change nothing (a patch or apply of what is there) are
  allowed, counted and reported.

:class:`Writes` records every write a handler call sends: which call (:data:`CALL`, set by the
world's handler wrapper around each call), what it wrote, whether it changed the apiserver's
state (the fake apiserver keeps the resourceVersion of a write that changes nothing) and the
handler's source lines that sent it — the stack of the write call trimmed to user code
(:func:`user_frames`: no frame of declop, the standard library or site-packages).

Invariants:
- a write is recorded only while a handler call runs (:data:`CALL` set); Lease writes and
  Events never are;
- :meth:`Writes.quiescence` and :meth:`Writes.idempotence` return at most one
  :class:`~declop.testing.simulation.leases.Violation` each, for the first offending write, with its trace.
"""

from __future__ import annotations

import collections
import contextvars
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Collection

from declop.kube.keys import Request
from declop.testing.simulation.leases import Violation

__all__ = ["CALL", "QUIET_AFTER", "Bounds", "Call", "Write", "Writes", "target", "user_frames"]

#: the bound of quiescence: lease durations after the workload and the faults stopped (the same
#: as I3's: by then every object has been reconciled)
QUIET_AFTER = 4


@dataclass(frozen=True, slots=True)
class Call:
    """The handler call that is running: its controller (registration name) and key."""

    controller: str
    key: Request
    started: float
    #: one more reconcile queued by the idempotence check
    extra: bool = False


#: the handler call whose code is running now (the world's handler wrapper sets it)
CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("declop_sim_call", default=None)


@dataclass(frozen=True, slots=True)
class Bounds:
    """What bounds one seed: loop turns (steps) and virtual seconds. A run ends at the first of
    its end, a quiescence failure, :attr:`steps` turns of the loop, or :attr:`seconds` of
    virtual time; :attr:`WorldResult.ended <declop.testing.simulation.world.WorldResult>` says which."""

    steps: int
    seconds: float


_SKIP = tuple(
    os.path.realpath(p) + os.sep
    for p in {
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),  # declop
        *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    if p
)


def _user(filename: str, cache: dict[str, bool] = {}) -> bool:  # noqa: B006 - a per-process memo
    mine = cache.get(filename)
    if mine is None:
        path = os.path.realpath(filename)
        mine = cache[filename] = not filename.startswith("<") and not path.startswith(_SKIP)
    return mine


def user_frames(limit: int = 4) -> tuple[str, ...]:
    """The stack of the caller trimmed to the handler's code: the innermost run of user frames
    (the handler and the helpers it called, not declop's client beneath them nor the runner above),
    at most ``limit`` of them, innermost last, as traceback lines (``File "x.py", line 9, in fn``
    and the source line)."""
    out: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and not _user(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    while frame is not None and _user(frame.f_code.co_filename) and len(out) < 2 * limit:
        code = frame.f_code
        name = os.path.relpath(code.co_filename)
        if name.startswith(".."):
            name = code.co_filename
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        out[:0] = [f'File "{name}", line {frame.f_lineno}, in {code.co_name}', f"  {source}"]
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Write:
    """One write a handler call sent."""

    at: float
    call: Call
    verb: str  # the HTTP method
    target: str  # "configmaps ns-a/w000"
    changed: bool
    trace: tuple[str, ...]

    @property
    def line(self) -> str:
        """The innermost user frame's location (``File "x.py", line 9, in fn``), or "?"."""
        return self.trace[-2] if len(self.trace) >= 2 else "?"


@dataclass
class Writes:
    """The handler writes of one run (the changing ones kept; the others counted)."""

    changed: list[Write] = field(default_factory=list)
    unchanged: int = 0
    #: writes that changed nothing, sent by the idempotence check's reconciles
    unchanged_extra: int = 0

    def note(self, write: Write) -> None:
        if write.changed:
            self.changed.append(write)
        else:
            self.unchanged += 1
            self.unchanged_extra += write.call.extra

    def quiescence(self, now: float, since: float, why: str, skip: Collection[str] = ()) -> Violation:
        """The quiescence violation at ``now``: ``why`` (what ended the wait), and the busiest
        cycle among the writes changing something since ``since`` — one handler line writing
        (its own object, or another that wakes it) over and over, with its period per object.
        The writes of the handlers in ``skip`` (allowed to keep writing: ``--allow``) are left out."""
        held = [w for w in self.changed if w.call.controller not in skip] if skip else self.changed
        late = [w for w in held if w.at >= since] or held[-200:]
        if not late:
            return Violation(now, "quiescence", "-", f"{why}; no handler write changed anything meanwhile: the loop was kept busy outside the handlers")
        cycles = collections.Counter(_cycle(w) for w in late)
        top, n = cycles.most_common(1)[0]
        mine = [w for w in late if _cycle(w) == top]
        controller, verb, plural, own, _line = top
        by_key: dict[Request, list[float]] = collections.defaultdict(list)
        for w in mine:
            by_key[w.call.key].append(w.at)
        spans = [(t[-1] - t[0]) / (len(t) - 1) for t in by_key.values() if len(t) > 1]
        period = f"one every {sum(spans) / len(spans):.3f} virtual s per object" if spans else "once per object"
        example, times = max(by_key.items(), key=lambda kv: len(kv[1]))
        written = f"{plural}, the object itself" if own else f"{plural} (another object, whose event maps back to it)"
        detail = (
            f"{why}; the cycle: handler {controller} → {verb} {written}, changing it → event → handler {controller} "
            f"of the same object again — {n} time(s) on {len(by_key)} object(s) since t={mine[0].at:.3f}, {period} "
            f"(e.g. {example}: {len(times)} time(s) from t={times[0]:.3f} to t={times[-1]:.3f})"
        )
        return Violation(now, "quiescence", "-", detail, mine[0].trace, controller)

    def idempotence(self, now: float, controllers: Collection[str] | None = None) -> Violation | None:
        """The violation for the first changing write of the idempotence check's reconciles (of
        the handlers in ``controllers``; None: all)."""
        extra = [w for w in self.changed if w.call.extra and (controllers is None or w.call.controller in controllers)]
        if not extra:
            return None
        w = extra[0]
        detail = (
            f"one more reconcile of {w.call.key} by {w.call.controller}, the world converged and nothing changed since, "
            f"sent {w.verb} {w.target} at t={w.at:.3f}, which changed it "
            f"({len(extra)} changing write(s) from {len({x.call.key for x in extra})} object(s) in the check; "
            f"{self.unchanged_extra} write(s) that changed nothing, allowed)"
        )
        return Violation(now, "idempotence", "-", detail, w.trace, w.call.controller)

    def counts(self) -> str:
        return f"handler writes: {len(self.changed)} changed something, {self.unchanged} changed nothing"


def _cycle(w: Write) -> tuple[str, str, str, bool, str]:
    """What makes writes one cycle: the handler, the verb, the resource, whether the write was to
    the call's own object, and the handler's line."""
    plural, _, where = w.target.partition(" ")
    return w.call.controller, w.verb, plural, where == str(w.call.key) or where == f"/{w.call.key}", w.line


def target(method: str, plural: str, namespace: str, name: str | None, result: Any) -> str:
    """``"configmaps ns/name"`` of a write (a create's name from its result: ``generateName``)."""
    if name is None and isinstance(result, dict):
        name = (result.get("metadata") or {}).get("name")
    return f"{plural} {namespace}/{name}" if namespace else f"{plural} {name}"
