"""The **finalizers** property of a world run: a cleanup runs to success under faults, and the
object goes away.

A handler registered with ``finalizer=`` is called with ``Phase.DELETING`` once its object is
being deleted, and declop releases the finalizer only after such a call returned (I8). A call
that raises is retried — so a cleanup runs again whenever the one before did not return: its
delete landed but the answer was lost, a later write of the call was refused, the replica
crashed, or the thing to clean up was never made. A cleanup that cannot succeed the second time
(it raises on the 404 of what an earlier attempt deleted, or ends with ``TerminalError``) keeps
the object in Terminating for ever. :class:`Cleanups` (docs/simulation.md, "Finalizers"):

- records how each cleanup call (a ``DELETING`` call, by the object's uid) ended: returned, or
  raised — the exception and the handler's lines it came through (:func:`raised_frames`: the
  traceback trimmed to user code, as :func:`~declop.testing.simulation.props.user_frames` trims a write's
  stack);
- exercises it: while the workload runs, a handler's ``DELETE`` is applied but its answer is
  lost with probability :data:`RATE` (the client sees a timeout, as after a real request timeout
  or a connection reset), drawn from the seed's own stream (``finalizers-<seed>``: the other
  draws of the run do not move);
- :meth:`Cleanups.stuck` is the property: once the world settled, no object held by a
  handler's finalizer is still being deleted while its last cleanup call raised.

Invariants:
- only ``DELETE`` writes of a handler call lose their answer, and only after the apiserver
  applied them;
- :meth:`Cleanups.stuck` reports at most one violation — the stuck object deleted first —, and
  only objects whose last cleanup call raised; one stuck without a failed cleanup (never called,
  or its finalizer kept after a cleanup returned) is declop's, and stays with I4.
"""

from __future__ import annotations

import linecache
import os
import random
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Iterable, Mapping

from declop.errors import ApiError, TerminalError
from declop.kube.keys import Request
from declop.testing.simulation.leases import Violation
from declop.testing.simulation.props import _user

__all__ = ["RATE", "Attempt", "Cleanups", "raised_frames"]

#: the share of the handlers' DELETEs whose answer is lost while the workload runs (deletes
#: are few — about one per cleanup —, so more than the one in twenty writes conflicts refuses)
RATE = 0.2
#: at most this many characters of an exception's message in a report
MESSAGE = 200


@dataclass(frozen=True, slots=True)
class Attempt:
    """How one cleanup call (``DELETING``) of an object ended."""

    at: float
    controller: str
    key: Request
    #: ``"NotFound: secrets ns-a/w000-record not found"``; None: it returned
    error: str | None = None
    terminal: bool = False
    #: the handler's lines the exception came through (traceback lines, innermost last)
    trace: tuple[str, ...] = ()


def raised_frames(exc: BaseException, limit: int = 4) -> tuple[str, ...]:
    """The traceback of ``exc`` trimmed to the handler's code: the innermost run of user frames
    (not declop's client beneath them nor the runner above), at most ``limit``, innermost last."""
    frames = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    run: list[tuple[Any, int]] = []
    for code, line in reversed(frames):
        if _user(code.co_filename):
            run.append((code, line))
            if len(run) == limit:
                break
        elif run:
            break
    out: list[str] = []
    for code, line in reversed(run):
        name = os.path.relpath(code.co_filename)
        if name.startswith(".."):
            name = code.co_filename
        out += [f'File "{name}", line {line}, in {code.co_name}', f"  {linecache.getline(code.co_filename, line).strip()}"]
    return tuple(out)


@dataclass
class Cleanups:
    """The cleanup calls of one run, by uid, and the deletes whose answer was lost."""

    seed: int
    rate: float = RATE
    #: handler DELETEs applied whose answer was lost
    lost: int = 0
    #: cleanup calls that raised
    failed: int = 0
    #: uid -> the last cleanup call of that object, and how many raised
    last: dict[str, Attempt] = field(default_factory=dict)
    raised: dict[str, int] = field(default_factory=dict)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"finalizers-{self.seed}")

    def lose(self, method: str, target: str) -> ApiError | None:
        """The error to answer this applied handler write with instead of its result, or None."""
        if method != "DELETE" or self.rng.random() >= self.rate:
            return None
        self.lost += 1
        return ApiError(0, "Timeout", f"DELETE {target}: no answer (declop sim lost it after the apiserver applied the delete)")

    def returned(self, now: float, controller: str, key: Request, uid: str) -> None:
        self.last[uid] = Attempt(now, controller, key)

    def ended(self, now: float, controller: str, key: Request, uid: str, exc: BaseException) -> None:
        """A cleanup call of ``uid`` raised ``exc``."""
        self.failed += 1
        self.raised[uid] = self.raised.get(uid, 0) + 1
        message = " ".join(str(exc).split())
        if len(message) > MESSAGE:
            message = message[: MESSAGE - 1] + "…"
        error = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        self.last[uid] = Attempt(now, controller, key, error, isinstance(exc, TerminalError), raised_frames(exc))

    def failing(self, uid: str | None) -> bool:
        """The last cleanup call of ``uid`` raised."""
        a = self.last.get(uid or "")
        return a is not None and a.error is not None

    def stuck(
        self, resource: str, objects: Iterable[dict[str, Any]], held: set[str], deleted: Mapping[str, float],
        now: float, since: float,
    ) -> Violation | None:  # fmt: skip
        """The finalizers violation of a settled world, or None: the first deleted of the
        ``objects`` (of ``resource``) still being deleted, held by one of the handlers' finalizers
        (``held``), whose last cleanup call raised. ``deleted``: uid -> when the workload deleted
        it; ``since``: when the faults stopped."""
        stuck = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            mine = sorted(set(meta.get("finalizers") or ()) & held)
            if meta.get("deletionTimestamp") and mine and self.failing(meta.get("uid")):
                stuck.append((deleted.get(meta["uid"], float("inf")), meta["uid"], mine))
        if not stuck:
            return None
        stuck.sort()
        at, uid, mine = stuck[0]
        a = self.last[uid]
        when = f"at t={at:.3f}" if at != float("inf") else "by someone else"
        how = "ended with TerminalError, never retried" if a.terminal else f"raised {self.raised.get(uid, 0)} time(s)"
        detail = (
            f"{resource} {a.key} (uid {uid[:8]}), deleted {when}, is still being deleted {now - since:.3f} s after the faults "
            f"healed, held by finalizer {', '.join(mine)}: its cleanup ({a.controller}, DELETING) {how}, the last at t={a.at:.3f}: "
            f"{a.error} — a cleanup runs again until one returns, so it must be idempotent: treat NotFound (404) of what it "
            f"deletes as done, let transient errors (409, 429, 5xx, timeouts) propagate to be retried, and keep TerminalError "
            f"for what no retry can fix ({len(stuck)} object(s) stuck in all)"
        )
        return Violation(now, "finalizers", "-", detail, a.trace, a.controller)

    def counts(self) -> str:
        return f"handler deletes whose answer was lost: {self.lost}; cleanup calls that raised: {self.failed}"
