"""``@declop.on_probe``: values the user's functions report on ``/probes`` on the health port.

Kopf's ``@kopf.on.probe(id=…)`` adds keys to its liveness JSON; here they are a JSON document
of their own, so that ``/healthz`` stays what a liveness probe needs — proof that the loop runs,
answered without running user code::

    GET /probes  →  200 {"probes": {"now": "2026-12-06T03:52:13", "queue": 4}, "failed": []}
                    503 {"probes": {"now": "…"}, "failed": ["queue"]}   (a probe raised or timed out)

Invariants (what :class:`Probes` guarantees, per probe):

- **at most one call at a time**, ever: concurrent requests share the call in flight, and a
  plain ``def`` probe still running in its thread after its timeout is not called again until
  it returned (it reports failed meanwhile) — a stuck probe holds one handler thread, not one
  per request;
- **its outcome is reused for** ``cache`` **seconds** (monotonic clock) from the end of the call,
  failures too: however often ``/probes`` is asked, a probe runs at most once per ``cache``
  period plus its own duration;
- **a request waits at most** ``timeout`` **seconds** for any probe: then that probe is reported
  failed (an ``async def`` one is cancelled);
- **what is served is the user's values and the probes' names only**: a probe that raises is
  logged with its traceback and served as its name in ``failed``; the error's text is never
  served (the health port is unauthenticated). A value that is not JSON (``json.dumps`` refuses
  it) is a failure of the probe, logged.

The values are the user's choice, and so is what they reveal: they are served to whoever
reaches the health port, like ``/healthz``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from declop import collector
from declop.lifecycle import Hook

__all__ = ["Probes"]

log = logging.getLogger("declop.probes")


@dataclass
class _State:
    """One probe's last outcome and its call in flight."""

    #: when the last call ended (None: never)
    at: float | None = None
    ok: bool = False
    value: Any = None
    #: the call in flight (None: none); kept after a timeout until the call really ended
    call: asyncio.Future[Any] | None = None
    #: the look in flight (a call and its timeout) that concurrent requests share
    look: asyncio.Future[None] | None = None


class Probes:
    """Runs the probe hooks for ``/probes`` (see the module docstring)."""

    def __init__(self, hooks: list[Hook], call: Callable[[Hook], Awaitable[Any]], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.hooks = [h for h in hooks if h.kind == "probe"]
        self._call = call
        self._clock = clock
        self._states = {h.name: _State() for h in self.hooks}
        #: calls made so far per probe (for tests and statistics)
        self.calls: dict[str, int] = {h.name: 0 for h in self.hooks}

    async def report(self) -> tuple[dict[str, Any], list[str]]:
        """Each probe's value (fresh, or reused within its ``cache``), and the names that failed."""
        await asyncio.gather(*(self._current(h) for h in self.hooks))
        values = {h.name: self._states[h.name].value for h in self.hooks if self._states[h.name].ok}
        return values, [h.name for h in self.hooks if not self._states[h.name].ok]

    async def _current(self, hook: Hook) -> None:
        state = self._states[hook.name]
        if state.at is not None and self._clock() - state.at < hook.cache:
            return
        if state.look is None or state.look.done():
            state.look = asyncio.ensure_future(self._look(hook, state))
        await asyncio.shield(state.look)  # a caller that hangs up does not cancel the others' look

    async def _look(self, hook: Hook, state: _State) -> None:
        kv = {"probe": hook.name}
        if state.call is not None and not state.call.done():
            # a plain def probe still in its thread since its last timeout: not called twice
            state.ok, state.value, state.at = False, None, self._clock()
            return
        self.calls[hook.name] += 1
        state.call = call = asyncio.ensure_future(self._call(hook))
        call.add_done_callback(collector.retrieved)
        done, _ = await asyncio.wait([call], timeout=hook.timeout)
        ok, value = False, None
        if not done:
            if hook.is_async:
                call.cancel()
            log.warning("Probe timed out", extra={"kv": {**kv, "timeout": hook.timeout}})
        elif call.cancelled():
            log.warning("Probe was cancelled", extra={"kv": kv})
        elif call.exception() is not None:
            exc = call.exception()
            log.error("Probe failed", exc_info=(type(exc), exc, exc.__traceback__), extra={"kv": kv})  # type: ignore[arg-type]
        else:
            value = call.result()
            try:
                json.dumps(value)
                ok = True
            except (TypeError, ValueError) as exc:
                log.error("Probe returned a value that is not JSON", extra={"kv": {**kv, "type": type(value).__name__, "error": str(exc)}})
                value = None
        state.ok, state.value, state.at = ok, value, self._clock()

