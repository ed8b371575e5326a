"""Steps: per-step progress of a reconciler, recorded on the object it reconciles.

A reconciler that declares a ``steps`` argument gets a :class:`Steps` for its key, and runs its
named steps through it: ``steps.run("create-bucket", fn, once="object", retries=3, backoff=10)``
(``await steps.arun(...)`` in an ``async def`` handler). Whether a step runs is derived from the
*record* on the object — never from which event woke the handler — so a lost, merged or
duplicated event, a restart or a failover cannot change it.

The record is one JSON document per controller: the annotation ``steps.declop.dev/<controller>``
(default), or ``status.steps.<controller>`` when the handler says ``steps="status"``. Per step it holds
``generation`` (the one its attempts count for; the one it was done at), ``attempts``, ``done``,
``next`` (the wall-clock time before which it is not tried again, RFC 3339), ``failed`` (failed
for good, with the message), ``message`` (the last temporary failure) and, between a claim and
its outcome, ``by`` and ``at`` (which replica claimed it, and when).

Owns the record's format (:func:`parse`, :func:`dump`), the decision of one step
(:func:`decide`), the writes (:class:`Writer`), the memory of this replica's own writes
(:class:`Memory`) and the runner that makes a reconciler of a function taking ``steps``
(:func:`wrap`). Does not own retries of the call itself: a step that must wait ends the call
with :class:`~declop.errors.TemporaryError`, one that failed for good with
:class:`~declop.errors.TerminalError`, and the outcome table does the rest.

Invariants:
- a step runs only after its *claim* was written: a JSON patch that adds 1 to its attempts,
  guarded by a ``test`` of the record as the handler read it (when there was none, that it is
  still missing). When the record changed since — another replica,
  an older cached copy, an edit — the apiserver refuses the patch, the step does not run and
  the call ends with :class:`~declop.errors.Conflict` (retried; the newer object wakes the key);
- so a step never runs twice for one claim: two runs need two claims, each guarded by the
  record the other wrote;
- a claim without an outcome names its replica (``by``, unique per process and controller): to
  any other replica it is a step under way, and the step waits for its outcome, up to
  :data:`CLAIM_HOLD` after the claim's ``at`` (an ``at`` more than the hold in the future is not
  trusted: a hand-edited or garbage record cannot block a step for ever). So two live replicas on one key (a handover's
  overlap) never run one step twice. A claim older than that, or our own, is an attempt whose
  process died (or whose outcome write failed): the next call counts it as a failed attempt and
  runs the step again (steps are at-least-once across crashes, as Kopf's handlers are);
- after the step, one outcome write (done, next try after, or failed for good), guarded the
  same way by the claim it follows; it drops ``by`` and ``at``;
- a call whose steps are all done, waiting or failed sends no write;
- per key, the records this replica wrote, with the resourceVersions they produced, are kept
  until the cache shows the last of them (:class:`Memory`): a cached copy at one of those
  resourceVersions is older than our own write, and the handler decides on our last record
  instead — the echo of our own write costs no conflict and no wasted attempt. A copy at any
  other resourceVersion is taken as it is (the guard refuses it if it is older);
- ``next`` is wall-clock time on the object: a delay survives a restart and a failover;
- a removed record means "nothing ran yet": every step runs again (the way to reset); an edited
  one is read as it says; one that is not valid JSON counts as removed (and is replaced,
  guarded by its exact text).
"""

# size: one protocol — the record's format, the decision of a step, the guarded writes, the memory
# of our own writes and the runner — and Steps.run/arun spelled out side by side (sync and async).

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Literal, Mapping, Sequence

from declop.errors import ApiError, Conflict, NotFound, RegistrationError, TemporaryError, TerminalError
from declop.kube.keys import Request
from declop.kube.rbac import Permission
from declop.typed.dump import is_model

__all__ = [
    "ANNOTATION_PREFIX", "STORES", "Decision", "Memory", "Steps", "Writer", "decide", "dump", "grants", "parse",
    "record_key", "wrap",
]

#: the record's annotation is ``ANNOTATION_PREFIX + <controller name>``
ANNOTATION_PREFIX = "steps.declop.dev/"
#: where the record may be kept (the default of the handler's ``steps`` parameter)
STORES = ("annotation", "status")
Once = Literal["generation", "object"]
Backoff = float | Callable[[int], float] | None

#: a claim another replica wrote is its step in progress for this long after the claim's ``at``;
#: after that it is taken for a claim whose replica died (and the step runs again here)
CLAIM_HOLD = 60.0
#: the fields of a claim that its outcome removes
_CLAIM = ("by", "at")
#: a failure's message is kept on the object up to this many characters (the record stays small)
MESSAGE_LIMIT = 512
#: what the runner itself reads of a call's arguments
_NEEDS = frozenset({"request", "obj", "client", "logger"})
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def record_key(controller: str) -> str:
    """The annotation key of ``controller``'s record: its name when that is a valid annotation
    name (<= 63 characters), else a valid name made of it and a hash."""
    if len(controller) <= 63 and _NAME.match(controller):
        return ANNOTATION_PREFIX + controller
    import hashlib

    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", controller).strip("-_.")[:50] or "controller"
    return f"{ANNOTATION_PREFIX}{cleaned}-{hashlib.sha256(controller.encode()).hexdigest()[:8]}"


def parse(raw: Any) -> dict[str, dict[str, Any]]:
    """The record as stored (an annotation's JSON text, or the status' object) as ``{step:
    entry}``; absent or unreadable: empty (every step runs again)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    if not isinstance(raw, Mapping):
        return {}
    return {k: dict(v) for k, v in raw.items() if isinstance(v, Mapping)}


def dump(record: Mapping[str, Mapping[str, Any]], store: str) -> Any:
    """The record as stored: compact JSON text for an annotation, the object itself in the status."""
    if store == "status":
        return {k: dict(v) for k, v in record.items()}
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Decision:
    """What one step does now: ``"skip"`` (done), ``"wait"`` (``delay`` seconds to its next try),
    ``"failed"`` (for good: ``message``), ``"give-up"`` (its attempts are used up by a claim that
    left no outcome: record it as failed) or ``"run"`` (claim it, with ``entry`` as the claim)."""

    action: Literal["skip", "wait", "failed", "give-up", "run"]
    entry: Mapping[str, Any]
    delay: float = 0.0
    message: str = ""


def decide(entry: Mapping[str, Any] | None, generation: int, once: Once, retries: int | None, now: float, me: str = "") -> Decision:
    """The decision for a step whose record entry is ``entry``, on an object at ``generation``,
    for the replica ``me`` (a pure function of the record, the object, the clock and who asks).

    A claim without an outcome (``by`` still set) is another replica's step in progress until
    :data:`CLAIM_HOLD` seconds after its ``at``: the step waits (the other's outcome wakes the key
    before that). Our own, an older one, or one whose ``at`` is more than the hold ahead of our
    clock (garbage, or a clock too far off to trust) is an attempt that left no outcome (a crash, or an
    outcome write that failed): it counts as failed, and the step runs again."""
    e = dict(entry or {})
    if once == "generation" and e.get("generation") != generation:
        e = {}  # a new generation: a fresh start (attempts, waits and failures were the old one's)
    if e.get("done"):
        return Decision("skip", e)
    if e.get("failed") is not None:
        return Decision("failed", e, message=str(e["failed"]))
    holder, since = e.get("by"), _seconds(e.get("at"))
    # a claim stamped more than the hold ahead of our clock is garbage (a hand edit, a clock far
    # off): held, it would block the step for ever, so it counts as expired too
    if holder and holder != me and since is not None and abs(now - since) < CLAIM_HOLD:
        return Decision("wait", e, delay=min(since + CLAIM_HOLD - now, CLAIM_HOLD), message=f"claimed by {holder}")
    e = {k: v for k, v in e.items() if k not in _CLAIM}
    attempts = e.get("attempts")
    attempts = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 0 else 0
    if retries is not None and attempts >= retries:  # the last claim left no outcome (a crash)
        message = e.get("message") or "no outcome was recorded for the last attempt (the process may have died)"
        return Decision("give-up", {**e, "generation": generation, "failed": f"{attempts} attempts: {message}"})
    due = _seconds(e.get("next"))
    if due is not None and due > now:
        return Decision("wait", e, delay=due - now)
    claim = {k: v for k, v in e.items() if k not in ("next",)}
    return Decision("run", {**claim, "generation": generation, "attempts": attempts + 1, "by": me, "at": _stamp(now)})


class Memory:
    """Per key, the records this replica wrote and the resourceVersions they produced, from the
    copy the first of them was based on, until the cache shows the last one (then the cache
    knows as much as we do). Thread-safe: plain handlers run in threads; one key is handled by
    one call at a time."""

    __slots__ = ("_chains", "_lock", "holder")

    def __init__(self, holder: str | None = None) -> None:
        #: who this replica's claims name (``by``): unique per process and controller, so a claim
        #: by anyone else is another replica's (or a dead process') step
        self.holder = holder or f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"
        #: key -> (uid, [(resourceVersion, stored record)...]), the copy read first
        self._chains: dict[Request, tuple[str, list[tuple[str, Any]]]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._chains)

    def base(self, key: Request, uid: str, rv: str, stored: Any) -> tuple[str, Any]:
        """The (resourceVersion, stored record) to decide on and to guard the next write with,
        for a cached copy at ``rv`` holding ``stored``: our last write's when the copy is one of
        the older states we wrote over (or based our first write on); else the copy's."""
        with self._lock:
            chain = self._chains.get(key)
            if chain is not None:
                if chain[0] == uid:
                    states = chain[1]
                    for i, (seen, _) in enumerate(states):
                        if seen == rv:
                            if i < len(states) - 1:
                                return states[-1]  # older than our own write: decide on ours
                            break
                del self._chains[key]  # caught up, or a state we did not write: the cache knows best
        return rv, stored

    def wrote(self, key: Request, uid: str, based: tuple[str, Any], written: tuple[str, Any]) -> None:
        """We wrote ``written`` (its resourceVersion, the stored record) over ``based``."""
        with self._lock:
            chain = self._chains.get(key)
            if chain is None or chain[0] != uid or chain[1][-1][0] != based[0]:
                chain = self._chains[key] = (uid, [based])
            chain[1].append(written)

    def forget(self, key: Request) -> None:
        with self._lock:
            self._chains.pop(key, None)


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


class Writer:
    """The guarded writes of one controller's records: where the record lives and how to patch it."""

    __slots__ = ("controller", "store", "key")

    def __init__(self, controller: str, store: str = "annotation") -> None:
        if store not in STORES:
            raise ValueError(f"a steps record is kept in one of {', '.join(STORES)}, got {store!r}")
        self.controller = controller
        self.store = store
        self.key = record_key(controller)

    def read(self, obj: Mapping[str, Any]) -> Any:
        """The stored record on ``obj`` (None: none)."""
        if self.store == "annotation":
            return ((obj.get("metadata") or {}).get("annotations") or {}).get(self.key)
        return ((obj.get("status") or {}).get("steps") or {}).get(self.controller)

    def ops(self, obj: Mapping[str, Any], base: Any, new: Any) -> list[dict[str, Any]]:
        """The JSON patch that replaces ``base`` with ``new``, guarded by a ``test`` of ``base``.
        With no record, the test is that the first missing part of its path (the annotation,
        ``metadata.annotations``, ``status.steps`` …) is still missing — the apiserver tests a
        missing key as ``null`` — and the parts are added."""
        parts = ["metadata", "annotations", self.key] if self.store == "annotation" else ["status", "steps", self.controller]
        path = "/" + "/".join(_escape(p) for p in parts)
        if base is not None:
            return [{"op": "test", "path": path, "value": base}, {"op": "replace", "path": path, "value": new}]
        at: Any = obj
        for i, part in enumerate(parts):
            child = at.get(part) if isinstance(at, Mapping) else None
            if child is None or i == len(parts) - 1:
                break
            at = child
        missing = "/" + "/".join(_escape(p) for p in parts[: i + 1])
        ops: list[dict[str, Any]] = [{"op": "test", "path": missing, "value": None}]
        ops += [{"op": "add", "path": "/" + "/".join(_escape(p) for p in parts[:j]), "value": {}} for j in range(i + 1, len(parts))]
        ops.append({"op": "add", "path": path, "value": new})
        return ops

    def body(self, obj: Mapping[str, Any], base: Any, new: Any) -> bytes:
        """:meth:`ops` encoded as Go writes JSON (the apiserver's ``test`` compares bytes)."""
        from declop.typed.status import encode  # (it imports pydantic: only once a step writes)

        return encode(self.ops(obj, base, new))

    def subresource(self) -> str | None:
        return "status" if self.store == "status" else None

    def check(self, written: Mapping[str, Any], new: Any) -> None:
        """Raise when the apiserver dropped the record (a status schema that prunes it)."""
        if self.read(written) != new:
            raise TerminalError(
                f"the steps record of {self.controller!r} was not kept by the apiserver: with steps=\"status\" the "
                "CRD's status schema must keep status.steps (type: object, x-kubernetes-preserve-unknown-fields: true)"
            )


def _refusal(exc: ApiError) -> Conflict | None:
    """A refused guard (422 of a failed ``test``, or 409) as the quiet retry the call ends with."""
    from declop.typed.status import refused
    if exc.status == 409 or (exc.status == 422 and refused(exc)):
        return Conflict("the steps record changed since the handler read it; nothing ran (retried on the newer object)")
    return None


@dataclass(slots=True)
class _State:
    """What a call's Steps know of the object: the copy, and the record they decide on."""

    obj: Mapping[str, Any] | None
    rv: str
    stored: Any
    record: dict[str, dict[str, Any]]


class Steps:
    """The named steps of one reconcile of one key; see the module docstring for the record.

    ``run(name, fn, once=, retries=, backoff=, permanent=)`` (``await arun(...)`` in an async
    handler) runs ``fn()`` unless the record says the step is done, and returns what ``fn``
    returned (None when it did not run). ``once="generation"`` (the default) runs it once per
    ``metadata.generation``, ``once="object"`` once for the object's life. ``retries=N`` gives up
    after N attempts in all; ``backoff`` is the delay after a failed attempt (seconds, or
    ``attempt -> seconds``; recorded, so it survives a restart; None: the controller's rate
    limiter); ``permanent=(ValueError,)`` are exception classes that fail the step for good at
    once, as :class:`~declop.errors.TerminalError` always does. A ``TemporaryError(delay=)`` from
    ``fn`` waits its delay. A step that waits ends the call with ``TemporaryError``; one failed
    for good with ``TerminalError``: the steps after it do not run.
    """

    __slots__ = ("_writer", "_memory", "_key", "_state", "_client", "_logger", "_clock", "_async", "_me")

    def __init__(
        self,
        writer: Writer,
        memory: Memory,
        key: Request,
        obj: Mapping[str, Any] | None,
        client: Any,
        logger: Any = None,
        clock: Callable[[], float] = time.time,
        is_async: bool = False,
    ) -> None:
        self._writer, self._memory, self._key, self._me = writer, memory, key, memory.holder
        self._client, self._logger, self._clock, self._async = client, logger, clock, is_async
        if obj is None:  # gone: nothing of it is remembered any more
            memory.forget(key)
            self._state = _State(None, "", None, {})
            return
        meta = obj.get("metadata") or {}
        rv, stored = memory.base(key, meta.get("uid") or "", meta.get("resourceVersion") or "", writer.read(obj))
        self._state = _State(obj, rv, stored, parse(stored))

    @property
    def record(self) -> dict[str, dict[str, Any]]:
        """The record as the steps see it now (a copy)."""
        return {k: dict(v) for k, v in self._state.record.items()}

    def done(self, name: str, once: Once = "generation") -> bool:
        """The step ``name`` is done (for this generation, with ``once="generation"``)."""
        return decide(self._state.record.get(name), self._generation(), once, None, self._clock(), self._me).action == "skip"

    def attempt(self, name: str) -> int:
        """The attempts of step ``name`` as recorded: while its ``fn`` runs, the number of this
        attempt (1 for the first; Kopf's ``retry`` is one less)."""
        attempts = (self._state.record.get(name) or {}).get("attempts")
        return attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0

    def _generation(self) -> int:
        obj = self._state.obj
        gen = (obj.get("metadata") or {}).get("generation") if obj is not None else None
        return gen if isinstance(gen, int) else 0

    def _check(self, name: str, once: str, retries: Any, backoff: Any, permanent: Any) -> tuple[type[BaseException], ...]:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a step's name is a non-empty string, got {name!r}")
        if once not in ("generation", "object"):
            raise ValueError(f"once= is 'generation' or 'object', got {once!r}")
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 1):
            raise ValueError(f"retries= is a number of attempts >= 1, or None for no limit; got {retries!r}")
        if backoff is not None and not callable(backoff) and not _delay(backoff):
            raise ValueError(f"backoff= is seconds >= 0, a function attempt -> seconds, or None; got {backoff!r}")
        classes = permanent if isinstance(permanent, tuple) else tuple(permanent) if isinstance(permanent, Sequence) else (permanent,)
        if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            raise TypeError(f"permanent= is exception classes, e.g. (ValueError,); got {permanent!r}")
        return classes

    def _before(self, name: str, once: Once, retries: int | None) -> Decision:
        state = self._state
        decision = decide(state.record.get(name), self._generation(), once, retries, self._clock(), self._me)
        if decision.action == "wait":
            why = f" ({decision.message}, whose outcome it waits for)" if decision.message else ""
            raise TemporaryError(f"step {name!r} waits for its next try{why}", delay=decision.delay)
        if decision.action == "failed":
            raise TerminalError(f"step {name!r} failed for good: {decision.message}")
        return decision

    def _new(self, name: str, entry: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], Any]:
        record = {**self._state.record, name: dict(entry)}
        return record, dump(record, self._writer.store)

    def _written(self, record: dict[str, dict[str, Any]], new: Any, written: Any) -> None:
        """The write answered ``written``: it is the state the steps go on from, and remembered."""
        state, meta = self._state, (written.get("metadata") or {}) if isinstance(written, Mapping) else {}
        self._writer.check(written, new)
        rv = meta.get("resourceVersion") or ""
        self._memory.wrote(self._key, meta.get("uid") or "", (state.rv, state.stored), (rv, new))
        self._state = _State(state.obj, rv, new, record)  # the generation stays the one the handler read

    def _body(self, new: Any) -> bytes:
        state = self._state
        assert state.obj is not None
        return self._writer.body(state.obj, state.stored, new)

    def _after(self, name: str, claim: Mapping[str, Any], exc: BaseException | None, backoff: Backoff,
               retries: int | None, permanent: tuple[type[BaseException], ...]) -> tuple[dict[str, Any] | None, BaseException | None]:  # fmt: skip
        """The outcome entry of a claimed step (None: no write) and what the call raises then."""
        attempts = int(claim["attempts"])
        claim = {k: v for k, v in claim.items() if k not in _CLAIM}  # the outcome ends the claim
        if exc is None:
            return {k: v for k, v in claim.items() if k not in ("message", "next")} | {"done": True}, None
        message = (str(exc) or type(exc).__name__)[:MESSAGE_LIMIT]
        if isinstance(exc, TerminalError) or (permanent and isinstance(exc, permanent)):
            failed = {**claim, "failed": message}
            return failed, TerminalError(f"step {name!r} failed for good: {message}")
        if retries is not None and attempts >= retries:
            failed = {**claim, "failed": f"{attempts} attempts: {message}"}
            return failed, TerminalError(f"step {name!r} failed for good after {attempts} attempts: {message}")
        if isinstance(exc, TemporaryError):
            delay = exc.delay
        elif backoff is None:
            return None, exc  # the rate limiter's backoff; the claim counted the attempt
        else:
            delay = float(backoff(attempts) if callable(backoff) else backoff)
            if not _delay(delay):
                raise ValueError(f"backoff of step {name!r} gave {delay!r}, not seconds >= 0")
        entry = {**claim, "message": message, "next": _stamp(self._clock() + delay)}
        return entry, TemporaryError(f"step {name!r} failed (attempt {attempts}): {message}", delay=delay)

    def _log(self, name: str, exc: BaseException, raised: BaseException | None) -> None:
        """The traceback of a step that will be tried again after its backoff (the outcome table
        logs a TemporaryError without one; a re-raised or terminal error is logged there with it)."""
        if self._logger is not None and raised is not exc and isinstance(raised, TemporaryError) and not isinstance(exc, TemporaryError):
            self._logger.error(f"Step {name!r} failed", exc_info=exc, step=name, outcome=type(raised).__name__)

    def run(self, name: str, fn: Callable[[], Any], *, once: Once = "generation", retries: int | None = None,
            backoff: Backoff = None, permanent: Sequence[type[BaseException]] | type[BaseException] = ()) -> Any:  # fmt: skip
        """Run step ``name`` (``fn()``) unless the record says it is done; see :class:`Steps`.

        Raises:
            TemporaryError: the step waits for its next try, or failed and will be tried again.
            TerminalError: the step failed for good (now, or before).
            Conflict: the record changed since it was read; the step did not run.
        """
        if self._async:
            raise TypeError("in an async def handler use `await steps.arun(...)`")
        classes = self._check(name, once, retries, backoff, permanent)
        if self._state.obj is None:
            return None  # the object is gone: no step runs
        decision = self._before(name, once, retries)
        if decision.action == "skip":
            return None
        self._send(name, decision.entry)
        if decision.action == "give-up":
            raise TerminalError(f"step {name!r} failed for good: {decision.entry['failed']}")
        try:
            result = fn()
            if inspect.isawaitable(result):
                raise TypeError(f"step {name!r} returned an awaitable: in an async def handler use `await steps.arun(...)`")
        except Exception as exc:  # noqa: BLE001 - every failure of a step is recorded
            entry, raised = self._after(name, decision.entry, exc, backoff, retries, classes)
            self._log(name, exc, raised)
            if entry is not None:
                self._send(name, entry)
            assert raised is not None
            if raised is exc:
                raise
            raise raised from exc
        entry, _ = self._after(name, decision.entry, None, backoff, retries, classes)
        assert entry is not None
        self._send(name, entry)
        return result

    def _send(self, name: str, entry: Mapping[str, Any]) -> None:
        record, new = self._new(name, entry)
        try:
            written = self._client.patch(self._key, self._body(new), type="json", subresource=self._writer.subresource())
        except ApiError as exc:
            conflict = _refusal(exc)
            if conflict is None:
                raise
            self._memory.forget(self._key)
            raise conflict from None
        self._written(record, new, written)

    async def arun(self, name: str, fn: Callable[[], Any], *, once: Once = "generation", retries: int | None = None,
                   backoff: Backoff = None, permanent: Sequence[type[BaseException]] | type[BaseException] = ()) -> Any:  # fmt: skip
        """:meth:`run` for ``async def`` handlers: ``fn()`` is awaited when it returns an awaitable."""
        if not self._async:
            raise TypeError("in a plain def handler use `steps.run(...)`")
        classes = self._check(name, once, retries, backoff, permanent)
        if self._state.obj is None:
            return None
        decision = self._before(name, once, retries)
        if decision.action == "skip":
            return None
        await self._asend(name, decision.entry)
        if decision.action == "give-up":
            raise TerminalError(f"step {name!r} failed for good: {decision.entry['failed']}")
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # noqa: BLE001
            entry, raised = self._after(name, decision.entry, exc, backoff, retries, classes)
            self._log(name, exc, raised)
            if entry is not None:
                await self._asend(name, entry)
            assert raised is not None
            if raised is exc:
                raise
            raise raised from exc
        entry, _ = self._after(name, decision.entry, None, backoff, retries, classes)
        assert entry is not None
        await self._asend(name, entry)
        return result

    async def _asend(self, name: str, entry: Mapping[str, Any]) -> None:
        record, new = self._new(name, entry)
        try:
            written = await self._client.patch(self._key, self._body(new), type="json", subresource=self._writer.subresource())
        except ApiError as exc:
            conflict = _refusal(exc)
            if conflict is None:
                raise
            self._memory.forget(self._key)
            raise conflict from None
        self._written(record, new, written)


def _delay(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _raw(obj: Any, client: Any, request: Request) -> Mapping[str, Any] | None:
    """The object as stored: ``obj`` itself, or for a typed view (whose dump adds defaults the
    stored object does not have, e.g. empty annotations) the cached dict it was made from."""
    if obj is None or not is_model(obj):
        return obj  # type: ignore[no-any-return]
    try:
        return client.get(request)  # type: ignore[no-any-return]
    except NotFound:
        return None


def wrap(
    fn: Callable[..., Any], name: str, wanted: Callable[[Callable[..., Any], str], frozenset[str] | None]
) -> tuple[Callable[..., Any], frozenset[str] | None]:
    """The callable a controller runs for ``fn`` and the names it wants: ``fn`` itself when it
    declares no ``steps``; else a runner (async for an async ``fn``) that calls ``fn`` with the
    names it declares plus ``steps``. The default of ``steps``, if any, says where the record is
    kept: ``"annotation"`` (also without a default) or ``"status"`` — declop always passes
    ``steps``. ``wanted`` is the registry's :func:`~declop.registry.signatures.wanted_names`
    (this module sits below the registry).

    Raises:
        RegistrationError: the default of ``steps`` is not one of :data:`STORES`, or ``steps`` is positional-only.
    """
    params = inspect.signature(fn).parameters
    param = params.get("steps")
    if param is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        return fn, wanted(fn, name)
    if param.kind is param.POSITIONAL_ONLY:
        raise RegistrationError(f"handler {name!r}: 'steps' must not be positional-only; remove the '/'")
    store = "annotation" if param.default is param.empty else param.default
    if store not in STORES:
        raise RegistrationError(
            f"handler {name!r}: the default of `steps` says where its record is kept, 'annotation' or 'status'; got {store!r}"
        )
    writer = Writer(name, store)
    user_wants = wanted(functools.partial(fn, steps=None), name)
    memory = Memory()
    # the handler's own defaulted parameters pass through (run_reconcile's kwargs=, the test seam)
    own = user_wants | {n for n in params if n != "steps"} if user_wants is not None else None
    pick = (lambda kw: kw) if own is None else (lambda kw: {k: v for k, v in kw.items() if k in own})

    if inspect.iscoroutinefunction(fn):

        async def run_steps_async(**kwargs: Any) -> Any:
            request, client = kwargs["request"], kwargs["client"]
            steps = Steps(writer, memory, request, _raw(kwargs.get("obj"), client, request), client, kwargs.get("logger"), is_async=True)
            return await fn(**pick(kwargs), steps=steps)

        runner: Callable[..., Any] = run_steps_async
    else:

        def run_steps(**kwargs: Any) -> Any:
            request, client = kwargs["request"], kwargs["client"]
            steps = Steps(writer, memory, request, _raw(kwargs.get("obj"), client, request), client, kwargs.get("logger"))
            return fn(**pick(kwargs), steps=steps)

        runner = run_steps
    functools.update_wrapper(runner, fn)
    kept = [p for p in params.values() if p.name != "steps" and p.kind is not p.VAR_KEYWORD]
    runner.__signature__ = inspect.Signature([*kept, inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])  # type: ignore[attr-defined]
    runner.memory = memory  # type: ignore[attr-defined]  # for tests and the bench
    runner.store = store  # type: ignore[attr-defined]  # for grants()
    return runner, None if user_wants is None else user_wants | _NEEDS


def grants(runner: Callable[..., Any], resource: str) -> tuple[Permission, ...]:
    """What ``declop rbac`` must grant a runner :func:`wrap` made, on its primary ``resource``:
    ``patch`` of the object (the annotation) or of its status; nothing for a plain function."""
    store = getattr(runner, "store", None)
    if store is None:
        return ()
    return (Permission("patch", resource if store == "annotation" else f"{resource}/status"),)
