"""The options of ``@declop.reconciler``: named, defaulted and checked in one place.

:class:`ReconcilerOptions` is the one spelling of a reconciler's options. The decorators forward
their keywords to it; their signatures, the "did you mean" list of a misspelt option and
:data:`OPTION_NAMES` are all read from its fields. Adding an option is one field here (with its
check in ``__post_init__`` and its canonical form in :meth:`ReconcilerOptions.settled`) and the
:class:`~declop.reconcile.registration.Registration` attribute the engine reads.

Invariants:
- a :class:`ReconcilerOptions` that exists has passed every check: a bad value raises
  :class:`~declop.errors.RegistrationError` naming the option and what it accepts, in the order
  the fields are declared;
- the fields hold the values as the user gave them; :meth:`ReconcilerOptions.settled` gives
  their canonical form (tuples, a parsed label selector, :class:`~declop.kube.resource.Resource`
  entries, ``Priority | None``), keyed by the names of the Registration's attributes.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from declop.errors import RegistrationError
from declop.kube.labels import parse_selector
from declop.kube.rbac import Permission
from declop.kube.resource import Resource, parse_fields, resource_name
from declop.leases.hashing import SHARD_KEYS
from declop.queue.priority import Priority
from declop.queue.ratelimit import RateLimit
from declop.reconcile.predicates import Predicate

if TYPE_CHECKING:
    from declop.typed.model import CustomResource

    #: what a decorator takes as a resource: a name, a Resource, or a typed model
    ResourceLike = str | Resource | type[CustomResource]

__all__ = ["OPTION_NAMES", "TIMER_OPTION_NAMES", "ReconcilerOptions"]

_FINALIZER = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcilerOptions:
    """What ``@declop.reconciler(resource, ...)`` takes besides the resource, as given.

    See :func:`declop.registry.reconciler` for what each option does.
    """

    #: the controller's name (metrics, logs, Leases); default: the function's ``__name__``
    name: str | None = None
    #: a finalizer declop adds before the first call and removes after the delete phase
    finalizer: str | None = None
    #: the namespaces watched (one name or several); None: every namespace
    namespaces: Sequence[str] | str | None = None
    #: a label selector on the primary, as a string or a dict
    labels: str | Mapping[str, str] | None = None
    #: event filters ``(old, new) -> bool``; all must pass
    predicates: Sequence[Predicate] = ()
    #: child resources whose events wake the owner
    owns: Sequence[ResourceLike] = ()
    #: ``(resource, map_fn)`` pairs: ``map_fn(obj)`` names the keys an event wakes
    watches: Sequence[tuple[ResourceLike, Callable[[Any], Any]]] = ()
    #: workers per process (with ``--shards``, per replica)
    max_concurrent: int = 1
    #: True: a priority queue, False: FIFO, or a :class:`~declop.queue.priority.Priority`
    priority: bool | Priority = True
    #: retry pacing; None: client-go's defaults
    rate_limit: RateLimit | None = None
    #: seconds a call may take; None: unlimited
    timeout: float | None = None
    #: cache the primary as metadata only; None: as the resource says
    metadata_only: bool | None = None
    #: a field selector on the primary; None: as the resource says
    fields: str | Mapping[str, str] | None = None
    #: what a key hashes by in sharded mode: "uid" or "namespace"
    shard_by: str = "uid"
    #: writes declop cannot infer: ``(verb, resource[, name])`` tuples or Permissions
    permissions: Sequence[Permission | tuple[str, str] | tuple[str, str, str]] = ()
    #: call only when this field's value differs from the one last handled ("spec.size", or a
    #: tuple of keys); the handler may declare old, new, diff (docs/changes.md)
    field: str | Sequence[str] | None = None
    #: with field=: call only when the field's last handled value is this (or passes this callable)
    old: Any = ...
    #: with field=: call only when the field's present value is this (or passes this callable)
    new: Any = ...
    #: where a returned value is written: "status.summary", or True for status.<controller name>
    #: (Kopf's habit); None: returning anything but None or a Result is an error (docs/contract.md §3)
    return_to: str | bool | None = None

    def __post_init__(self) -> None:
        """Check every option (the messages name it and say what it accepts)."""
        if self.metadata_only is not None and not isinstance(self.metadata_only, bool):
            raise RegistrationError(f"metadata_only must be True or False, got {self.metadata_only!r}")
        if self.fields is not None:
            parse_fields(self.fields)
        for o in self.owns:
            Resource.of(o, what="owns=")
        if self.finalizer is not None and not _valid_finalizer(self.finalizer):
            raise RegistrationError(f"finalizer {self.finalizer!r} is not a valid name; use 'my.domain/name'")
        n = self.max_concurrent
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise _BadConcurrency(
                f"max_concurrent must be a positive int (workers per process; with --shards, per replica), got {n!r}"
            )
        if self.labels:
            parse_selector(self.labels)
        for p in self.predicates:
            if not callable(p):
                raise RegistrationError(f"predicate {p!r} is not callable; predicates are (old, new) -> bool")
        for w in self.watches:
            if not (isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], (str, Resource, type)) and callable(w[1])):
                raise RegistrationError(f"watches entries are ('resource', map_fn) pairs, got {w!r}")
        _priority(self.priority)
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise RegistrationError(
                f"rate_limit must be declop.queue.ratelimit.RateLimit(base=, cap=, qps=, burst=) or None for client-go's defaults, got {self.rate_limit!r}"
            )
        t = self.timeout
        if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf):
            raise RegistrationError(f"timeout must be a number of seconds > 0, or None for no timeout, got {t!r}")
        for r, _ in self.watches:
            Resource.of(r, what="watches=")
        permissions = self.permissions
        if isinstance(permissions, str) or (isinstance(permissions, tuple) and permissions and isinstance(permissions[0], str)):
            raise RegistrationError(
                f"permissions= is a list of ('verb', 'resource') tuples, e.g. [('create', 'configmaps')], got {permissions!r}"
            )
        for entry in permissions:
            Permission.of(entry)
        _field(self.field)
        if self.return_to is not None:
            from declop.handlers.returns import path_of

            path_of(self.return_to, "controller")
        if (self.old is not ... or self.new is not ...) and self.field is None:
            raise RegistrationError(
                "old= and new= filter the value of one field: pass field='spec.size' too (docs/changes.md)"
            )
        if self.shard_by not in SHARD_KEYS:
            raise _BadShardKey(
                f"shard_by must be 'uid' (the default) or 'namespace', got {self.shard_by!r}; see docs/sharding.md"
            )

    def primary(self, resource: ResourceLike) -> Resource:
        """The reconciled resource with its cache options: ``metadata_only=`` and ``fields=``
        override what a :class:`~declop.kube.resource.Resource` given as ``resource`` says."""
        base = resource if isinstance(resource, Resource) else Resource(resource_name(resource))
        return Resource(
            base.name,
            metadata_only=base.metadata_only if self.metadata_only is None else self.metadata_only,
            fields=base.fields if self.fields is None else self.fields,  # type: ignore[arg-type]
        )

    def settled(self, primary: Resource, controller: str = "") -> dict[str, Any]:
        """The options in canonical form, keyed by the Registration's attribute names (all but
        ``name``, which the registry resolves from the function and passes as ``controller``:
        ``return_to=True`` means ``status.<controller>``)."""
        from declop.handlers.returns import path_of
        namespaces = (self.namespaces,) if isinstance(self.namespaces, str) else self.namespaces
        return {
            "finalizer": self.finalizer,
            "namespaces": tuple(namespaces) if namespaces is not None else None,
            "labels": str(parse_selector(self.labels)) if self.labels else "",
            "predicates": tuple(self.predicates),
            "owns": tuple(Resource.of(o, what="owns=") for o in self.owns),
            "watches": tuple((Resource.of(r, what="watches="), fn) for r, fn in self.watches),
            "max_concurrent": self.max_concurrent,
            "priority": _priority(self.priority),
            "rate_limit": self.rate_limit,
            "timeout": None if self.timeout is None else float(self.timeout),
            "metadata_only": primary.metadata_only,
            "fields": primary.fields,
            "shard_by": self.shard_by,
            "permissions": tuple(Permission.of(p) for p in self.permissions),
            "return_to": path_of(self.return_to, controller),
            "field": _field(self.field),
            "old": self.old,
            "new": self.new,
        }


#: the option names in declaration order (the "did you mean" list, the decorators' signatures)
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(ReconcilerOptions))
#: the reconciler options a timer takes (``@declop.timer``): filters, predicates, pacing and
#: sharding; no finalizer, owns= or watches= (a timer reads its object, it does not own children)
TIMER_OPTION_NAMES = (
    "name", "namespaces", "labels", "fields", "predicates", "max_concurrent", "priority", "rate_limit", "timeout",
    "shard_by", "permissions",
)


def _valid_finalizer(name: str) -> bool:
    """A qualified name: optional DNS-subdomain prefix (<= 253) and a name part (<= 63)."""
    prefix, _, part = name.rpartition("/")
    return len(part) <= 63 and len(prefix) <= 253 and bool(_FINALIZER.match(name))


def _field(field: object) -> tuple[str, ...]:
    """``field=`` as a path of keys: ``"spec.size"`` or ``("metadata", "labels", "app.kubernetes.io/name")``."""
    if field is None:
        return ()
    parts = tuple(field.split(".")) if isinstance(field, str) else tuple(field) if isinstance(field, (tuple, list)) else ()
    if not parts or not all(isinstance(p, str) and p and "=" not in p for p in parts):
        raise RegistrationError(
            f"field= names the one field whose changes call the handler, as 'spec.size' or a tuple of keys, "
            f"got {field!r}; a field selector (which objects are cached) is fields='spec.x=y'"
        )
    return parts


def _priority(priority: object) -> Priority | None:
    if priority is True:
        return Priority()
    if priority is False:
        return None
    if isinstance(priority, Priority):
        return priority
    raise RegistrationError(
        f"priority must be True (the default: a priority queue), False (a FIFO queue) or "
        f"declop.queue.priority.Priority(listed=, unchanged=, aging=), got {priority!r}"
    )


class _BadConcurrency(RegistrationError):
    """``max_concurrent`` is not a positive int: a usage error (exit 2 from the CLI)."""

    exit_code = 2


class _BadShardKey(RegistrationError):
    """A shard key that cannot spread a controller's objects: ``shard_by`` is neither "uid" nor
    "namespace" (raised when declared), or "namespace" on a cluster-scoped resource (raised by the
    manager's wiring). A usage error (exit 2 from the CLI)."""

    exit_code = 2
