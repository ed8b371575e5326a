"""The **conflicts** property of a world run: 409s, 429s and 5xx answered to the handlers' writes.

A real apiserver answers a write 409 Conflict when another writer got there first, 429 Too Many
Requests when API Priority and Fairness throttles the client, and 500/503 when it (or etcd) is
having a bad moment. All of them are transient: the same write, retried on a fresh read, goes
through. :class:`Conflicts` answers some of a handlers file's writes so (docs/simulation.md,
"Conflicts and throttling"):

- while the workload runs (before :attr:`~declop.testing.simulation.world._World.calm_at`), each write a
  handler call sends (:data:`~declop.testing.simulation.props.CALL` set) is refused with probability
  :data:`RATE`, drawn from the seed's own stream (``conflicts-<seed>``: the other draws of the run
  do not move); an update (PUT, PATCH) gets 409 or a throttle, any other write a throttle;
- a refused write is not applied (the apiserver never saw it);
- a handler call that ends with :class:`~declop.errors.TerminalError` (the outcome table's
  permanent failure: never retried) while its last write was refused here is the violation: a
  transient answer turned into a permanent failure. Only the first is reported, with the
  handler's line of the refused write; the world must converge anyway (I3, quiescence).

The built-in world (no handlers file) sends no handler write with a call, so it draws nothing
here and its pinned seeds keep their schedules.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from declop.errors import ApiError, Conflict
from declop.testing.simulation.leases import Violation
from declop.testing.simulation.props import Call

__all__ = ["RATE", "Conflicts", "Refusal", "refusal"]

#: the share of the handlers' writes refused while the workload runs
RATE = 0.05
#: the throttles' Retry-After, in seconds (429 and 503)
RETRY_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """One handler write answered with a transient error instead of being applied."""

    at: float
    call: Call
    verb: str
    target: str
    status: int
    reason: str
    trace: tuple[str, ...]

    @property
    def line(self) -> str:
        """The innermost user frame's location (``File "x.py", line 9, in fn``), or "?"."""
        return self.trace[-2] if len(self.trace) >= 2 else "?"


def refusal(status: int, message: str) -> ApiError:
    """The error a client raises for a transient answer ``status`` (409, 429, 500 or 503)."""
    if status == 409:
        return Conflict(message)
    reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}[status]
    error = ApiError(status, reason, message)
    if status in (429, 503):
        error.retry_after = RETRY_AFTER
    return error


@dataclass
class Conflicts:
    """The refusals of one run and the first handler call that gave up on one."""

    seed: int
    rate: float = RATE
    refused: int = 0
    #: handler calls that ended with TerminalError right after a refusal
    gave_up: int = 0
    violation: Violation | None = None
    #: each running call's last write, when it was refused (a later write of the call clears it)
    last: dict[Call, Refusal] = field(default_factory=dict)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"conflicts-{self.seed}")

    def answer(self, now: float, method: str, target: str, call: Call, trace: tuple[str, ...]) -> ApiError | None:
        """The error to answer this handler write with instead of applying it, or None: serve it."""
        draw = self.rng.random()
        if draw >= self.rate:
            self.last.pop(call, None)
            return None
        update = method in ("PUT", "PATCH")
        kinds = (409, 409, 429, 503, 500) if update else (429, 503, 500)
        status = kinds[int(draw / self.rate * len(kinds))]
        self.refused += 1
        error = refusal(status, f"{method} {target}: answered {status} by declop sim (a transient conflict or throttle)")
        self.last[call] = Refusal(now, call, method, target, status, error.reason, trace)
        return error

    def ended(self, now: float, call: Call | None, error: BaseException) -> Violation | None:
        """A handler call ended with ``error`` (TerminalError): the violation, when its last
        write was refused here and none was reported yet."""
        if call is None:
            return None
        r = self.last.pop(call, None)
        if r is None:
            return None
        self.gave_up += 1
        if self.violation is not None:
            return None
        detail = (
            f"handler {call.controller} of {call.key} ended with {type(error).__name__} at t={now:.3f}, a permanent failure "
            f"(never retried), right after its {r.verb} {r.target} was answered {r.status} {r.reason} at t={r.at:.3f}: a "
            f"conflict or a throttle is transient and must be retried — let the exception propagate (the call is retried "
            f"with backoff) or raise declop.TemporaryError"
        )
        self.violation = Violation(now, "conflicts", "-", detail, r.trace, call.controller)
        return self.violation

    def forget(self, call: Call | None) -> None:
        """A call ended otherwise: its refusal no longer matters."""
        if call is not None:
            self.last.pop(call, None)

    def counts(self) -> str:
        return f"handler writes refused (409, 429, 5xx): {self.refused}; calls that gave up on one (TerminalError): {self.gave_up}"
