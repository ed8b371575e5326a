"""Registry: the ``@declop.reconciler`` decorator records handlers; the manager reads them at start.

Invariants:
- the decorator returns the function **unchanged**, so it stays callable in unit tests;
- a :class:`Registration` is frozen; the registry is frozen when a manager starts, and registering
  afterwards raises :class:`~declop.errors.RegistrationError` (decorators run at import time)
  until :meth:`Registry.clear` empties it for the next manager;
- argument names are checked at registration: a handler may only declare the injectable keyword
  arguments (``request``, ``name``, ``namespace``, ``client``, ``logger``, ``reconcile_id``,
  ``phase``, ``obj``) unless it takes ``**kwargs``.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from .cache import clone
from .errors import RegistrationError
from .labels import parse_selector
from .predicates import Predicate

__all__ = ["INJECTABLE", "Registration", "Registry", "default_registry", "index", "reconciler"]

F = TypeVar("F", bound=Callable[..., Any])

#: keyword arguments a handler may declare
INJECTABLE = frozenset({"request", "name", "namespace", "client", "logger", "reconcile_id", "phase", "obj"})

_FINALIZER = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _valid_finalizer(name: str) -> bool:
    """A qualified name: optional DNS-subdomain prefix (<= 253) and a name part (<= 63)."""
    prefix, _, part = name.rpartition("/")
    return len(part) <= 63 and len(prefix) <= 253 and bool(_FINALIZER.match(name))


@dataclass(frozen=True, slots=True)
class Registration:
    """One reconciler as declared by its decorator."""

    fn: Callable[..., Any]
    name: str
    resource: str
    finalizer: str | None = None
    namespaces: tuple[str, ...] | None = None
    labels: str = ""
    predicates: tuple[Predicate, ...] = ()
    owns: tuple[str, ...] = ()
    watches: tuple[tuple[str, Callable[[Any], Any]], ...] = ()
    max_concurrent: int = 1
    is_async: bool = False
    #: the injectable names the handler declares; None when it takes **kwargs (gets them all)
    wants: frozenset[str] | None = field(default=None)

    def arguments(
        self, request: Any, obj: Any, phase: Any, client: Any, logger: Any, reconcile_id: str
    ) -> dict[str, Any]:
        """The keyword arguments for one call: only those the handler declares. ``obj`` is a
        deep copy of the cached object (made only when declared), so the cache stays intact."""
        available = {
            "request": request,
            "name": request.name,
            "namespace": request.namespace,
            "client": client,
            "logger": logger,
            "reconcile_id": reconcile_id,
            "phase": phase,
        }
        wants = self.wants
        kwargs = available if wants is None else {k: v for k, v in available.items() if k in wants}
        if wants is None or "obj" in wants:
            kwargs["obj"] = clone(obj) if obj is not None else None
        return kwargs


@dataclass(frozen=True, slots=True)
class IndexRegistration:
    resource: str
    name: str
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]]


class Registry:
    """Holds registrations until a manager freezes and runs them."""

    def __init__(self) -> None:
        self._registrations: dict[str, Registration] = {}
        self._indexes: list[IndexRegistration] = []
        self._frozen = False

    @property
    def registrations(self) -> list[Registration]:
        return list(self._registrations.values())

    @property
    def indexes(self) -> list[IndexRegistration]:
        return list(self._indexes)

    def __len__(self) -> int:
        return len(self._registrations)

    def freeze(self) -> None:
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def clear(self) -> None:
        """Forget every registration and index and accept new ones — to load edited handlers
        between two managers (``declop dev`` reload). Never while a manager runs: it keeps the
        registrations it read at start."""
        self._registrations.clear()
        self._indexes.clear()
        self._frozen = False

    def _check_open(self, what: str) -> None:
        if self._frozen:
            raise RegistrationError(
                f"cannot register {what}: the manager has already started; make sure every "
                "handler module is imported before the manager runs"
            )

    def reconciler(
        self,
        resource: str,
        *,
        name: str | None = None,
        finalizer: str | None = None,
        namespaces: Sequence[str] | str | None = None,
        labels: str | Mapping[str, str] | None = None,
        predicates: Sequence[Predicate] = (),
        owns: Sequence[str] = (),
        watches: Sequence[tuple[str, Callable[[Any], Any]]] = (),
        max_concurrent: int = 1,
    ) -> Callable[[F], F]:
        """Register the decorated function as the reconciler of ``resource``; see design §2."""
        if not isinstance(resource, str) or not resource.strip():
            raise RegistrationError(f"resource must be a name like 'pods' or 'widgets.example.com', got {resource!r}")
        if finalizer is not None and not _valid_finalizer(finalizer):
            raise RegistrationError(f"finalizer {finalizer!r} is not a valid name; use 'my.domain/name'")
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise RegistrationError(f"max_concurrent must be a positive int, got {max_concurrent!r}")
        if isinstance(namespaces, str):
            namespaces = (namespaces,)
        selector = str(parse_selector(labels)) if labels else ""
        for p in predicates:
            if not callable(p):
                raise RegistrationError(f"predicate {p!r} is not callable; predicates are (old, new) -> bool")
        for w in watches:
            if not (isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], str) and callable(w[1])):
                raise RegistrationError(f"watches entries are ('resource', map_fn) pairs, got {w!r}")

        def decorate(fn: F) -> F:
            self._check_open(f"reconciler {getattr(fn, '__name__', fn)!r}")
            if not callable(fn):
                raise RegistrationError(f"@reconciler decorates a function, got {fn!r}")
            reg_name = name or fn.__name__
            if reg_name in self._registrations and self._registrations[reg_name].fn is not fn:
                raise RegistrationError(
                    f"a controller named {reg_name!r} is already registered; pass name= to tell them apart"
                )
            self._registrations[reg_name] = Registration(
                fn=fn,
                name=reg_name,
                resource=resource.strip(),
                finalizer=finalizer,
                namespaces=tuple(namespaces) if namespaces is not None else None,
                labels=selector,
                predicates=tuple(predicates),
                owns=tuple(owns),
                watches=tuple(watches),
                max_concurrent=max_concurrent,
                is_async=inspect.iscoroutinefunction(fn),
                wants=_wanted(fn, reg_name),
            )
            return fn

        return decorate

    def index(self, resource: str, name: str, fn: Callable[[Mapping[str, Any]], Iterable[str | None]]) -> None:
        """Add a cache index on ``resource``: ``fn(obj)`` returns the values the object is found under."""
        self._check_open(f"index {name!r}")
        if not callable(fn):
            raise RegistrationError(f"index {name!r}: expected a function obj -> list of values")
        self._indexes.append(IndexRegistration(resource, name, fn))


def _wanted(fn: Callable[..., Any], name: str) -> frozenset[str] | None:
    sig = inspect.signature(fn)
    wants: set[str] = set()
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            return None
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name not in INJECTABLE:
            if p.default is not p.empty:
                continue
            raise RegistrationError(
                f"handler {name!r} takes an unknown argument {p.name!r}; declop passes only "
                f"{', '.join(sorted(INJECTABLE))} (add **_ to accept the rest)"
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise RegistrationError(f"handler {name!r}: {p.name!r} must not be positional-only")
        wants.add(p.name)
    return frozenset(wants)


default_registry = Registry()


def reconciler(
    resource: str,
    *,
    name: str | None = None,
    finalizer: str | None = None,
    namespaces: Sequence[str] | str | None = None,
    labels: str | Mapping[str, str] | None = None,
    predicates: Sequence[Predicate] = (),
    owns: Sequence[str] = (),
    watches: Sequence[tuple[str, Callable[[Any], Any]]] = (),
    max_concurrent: int = 1,
    registry: Registry | None = None,
) -> Callable[[F], F]:
    """Register a reconciler of ``resource`` (``"pods"``, ``"deployments.apps"``, ``"widgets.example.com"``).

    The function is called with keyword arguments — the ones it declares among ``request``,
    ``name``, ``namespace``, ``client``, ``logger``, ``reconcile_id``, ``phase``, ``obj`` — and
    returns ``None``, a :class:`~declop.result.Result`, or raises. See ``docs/contract.md``.
    """
    return (registry if registry is not None else default_registry).reconciler(
        resource,
        name=name,
        finalizer=finalizer,
        namespaces=namespaces,
        labels=labels,
        predicates=predicates,
        owns=owns,
        watches=watches,
        max_concurrent=max_concurrent,
    )


def index(
    resource: str,
    name: str,
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]],
    *,
    registry: Registry | None = None,
) -> None:
    """Declare a cache index: ``client.list(resource, index=(name, value))`` finds objects by it."""
    (registry if registry is not None else default_registry).index(resource, name, fn)
