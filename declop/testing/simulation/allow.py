"""Silencing a property of the user's handlers on purpose: ``declop sim --allow PROPERTY[:HANDLER]``.

A property (:data:`PROPERTIES`: quiescence, idempotence, conflicts, ownership, crash safety,
finalizers) can be wrong for
one handler by design — a handler that stamps a heartbeat, a child kept on purpose. :class:`Allow`
names what the user allows, everywhere (``"idempotence"``) or for one handler, by its
registration name (``"quiescence:heartbeat"``). A world run routes each property violation
through :meth:`Allow.covers`: one it covers goes to the run's *allowed* list instead of its
violations (docs/simulation.md, "Silencing a property on purpose").

Invariants:
- an allowed violation is never dropped: the run keeps the first of each (property, handler), and
  the summaries count the seeds that had one (:func:`allowed_summary`);
- only the handlers' properties can be allowed; declop's own invariants (I1 … I14, T1, T2) are
  its promises and never are — :meth:`Allow.parse` refuses them, and unknown names, with a
  ``ConfigError`` that lists the choices;
- the ownership property has its own, per-object silencer (the annotation
  ``sim.declop.dev/outlives-parent``); ``--allow ownership`` silences it for every child.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Iterable, Sequence

from declop.errors import ConfigError

if TYPE_CHECKING:
    from declop.testing.simulation.leases import Violation

__all__ = ["PROPERTIES", "Allow", "allowed_summary"]

#: the properties of the user's handlers that ``--allow`` may silence (a new property adds its name)
PROPERTIES = ("quiescence", "idempotence", "conflicts", "ownership", "crash-safety", "finalizers")
_INVARIANT = re.compile(r"^(I\d+|T\d+)$")


@dataclass(frozen=True, slots=True)
class Allow:
    """What the user allows: properties everywhere, and (property, handler) pairs."""

    everywhere: frozenset[str] = frozenset()
    handlers: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def parse(cls, specs: Iterable[str], known: Collection[str] | None = None) -> Allow:
        """``("idempotence", "quiescence:heartbeat")`` (a comma-separated item is split) → an
        :class:`Allow`; ``known``: the registration names a handler must be one of (None: any).

        Raises:
            ConfigError: an unknown property, one of declop's invariants, or an unknown handler.
        """
        everywhere: set[str] = set()
        handlers: set[tuple[str, str]] = set()
        for spec in (part.strip() for item in specs for part in item.split(",")):
            if not spec:
                continue
            prop, _, handler = spec.partition(":")
            if _INVARIANT.match(prop):
                raise ConfigError(
                    f"--allow {spec}: {prop} is an invariant of declop, not a property of your handlers, and cannot be "
                    f"allowed; a failure of it is a bug of declop's (report it with its repro line)"
                )
            if prop not in PROPERTIES:
                raise ConfigError(f"--allow {spec}: unknown property {prop!r}; choose from {', '.join(PROPERTIES)} (optionally PROPERTY:HANDLER)")
            if not handler:
                everywhere.add(prop)
            elif known is not None and handler not in known:
                raise ConfigError(f"--allow {spec}: no handler is registered as {handler!r}; the registrations are {', '.join(sorted(known))}")
            else:
                handlers.add((prop, handler))
        return cls(frozenset(everywhere), frozenset(handlers))

    def __bool__(self) -> bool:
        return bool(self.everywhere or self.handlers)

    def covers(self, prop: str, handler: str = "") -> bool:
        """Whether a violation of ``prop`` by ``handler`` ("" when it names none) is allowed."""
        return prop in self.everywhere or (prop, handler) in self.handlers

    def of(self, prop: str) -> frozenset[str]:
        """The handlers ``prop`` is allowed for, one by one (not those of an everywhere allow)."""
        return frozenset(h for p, h in self.handlers if p == prop)

    def specs(self) -> tuple[str, ...]:
        """The items, as ``--allow`` takes them (sorted: a repro line is stable)."""
        return tuple(sorted(self.everywhere) + sorted(f"{p}:{h}" for p, h in self.handlers))


def allowed_summary(allowed: Sequence[Sequence[Violation]]) -> str:
    """``"allowed on purpose: idempotence in 3 seed(s), quiescence:beat in 1"`` for the allowed
    violations of each seed ("" when none)."""
    seeds: collections.Counter[str] = collections.Counter()
    for violations in allowed:
        seeds.update({f"{v.invariant}:{v.handler}" if v.handler else v.invariant for v in violations})
    if not seeds:
        return ""
    return "allowed on purpose: " + ", ".join(f"{name} in {n} seed(s)" for name, n in sorted(seeds.items()))
