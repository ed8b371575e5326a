"""Registry: the ``@declop.reconciler`` decorator records handlers; the manager reads them at start.

It also records what surrounds them: cache indexes (``declop.index``), cache transforms
(``declop.transform``), lifecycle hooks (``@declop.on_startup``, ``@declop.on_shutdown``,
``@declop.background``; see :mod:`declop.lifecycle`) and webhooks (``@declop.validator``,
``@declop.mutator``, ``@declop.converter``; see :mod:`declop.webhooks.declaration`).

Invariants:
- the decorator returns the function **unchanged**, so it stays callable in unit tests;
- a :class:`Registration` is frozen; the registry is frozen when a manager starts, and registering
  afterwards raises :class:`~declop.errors.RegistrationError` (decorators run at import time)
  until :meth:`Registry.clear` empties it for the next manager;
- argument names are checked at registration (:func:`_wanted`): a parameter without a default
  must be one of the injectable names (``request``, ``name``, ``namespace``, ``client``,
  ``logger``, ``reconcile_id``, ``phase``, ``obj``, ``trigger``) — with or without ``**kwargs``, which never
  fills a name declop does not have; a parameter with a default is the handler's own unless its
  name is within a typo of an injectable one (``loger=None``), which is refused. Refusals say
  "did you mean" or, for Kopf's arguments (``spec``, ``body``, ``patch`` …), what declop does
  instead;
- a misspelt decorator option or a resource given in parts (Kopf's ``(group, version, plural)``)
  is a :class:`~declop.errors.RegistrationError` naming the closest option, not a bare
  ``TypeError``: the decorators take ``*parts: Never`` and ``**unknown: Never``, so type
  checkers still reject such calls while the runtime explains them;
- the primary resource and every ``owns=``/``watches=`` entry is stored as a
  :class:`~declop.kube.resource.Resource` (name, metadata only, field selector); wherever a
  resource name goes (decorators, indexes, transforms, webhooks) a typed model
  (``@declop.reconciler(Widget)``) may go, and is stored by its name;
- a handler whose ``obj`` is annotated with a typed model (``obj: Widget``, also as a string
  under ``from __future__ import annotations``) is resolved here: it gets a typed view
  (``Registration.model``); an annotation that cannot be resolved, a model of another resource
  than the one reconciled, or a model on a metadata-only primary is refused here. pydantic is
  never imported by the registry: a model can only be named once ``declop.typed.model`` is loaded;
- at most one transform per resource name; at most one converter per resource, and webhook
  names are unique per kind;
- tuning options (``priority``, ``rate_limit``, ``timeout``) are validated at registration: a bad
  value raises :class:`~declop.errors.RegistrationError` naming the option and what it accepts.
"""

# size: one piece: the Registry and the module-level decorators that forward to it, with the
# argument checks both share. The decorators must read this module's ``default_registry`` when
# called (``declop dev`` and tests swap it), so they cannot move below it, and the top level of
# declop/ has no room for a second module.

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Never, Sequence, TypeVar

from declop.errors import RegistrationError
from declop.hints import KOPF_KWARGS, KOPF_OPTIONS, did_you_mean, resource_in_parts
from declop.kube.labels import parse_selector
from declop.lifecycle import Hook, HookKind, make_hook
from declop.reconcile.predicates import Predicate
from declop.queue.priority import Priority
from declop.queue.ratelimit import RateLimit
from declop.reconcile.registration import INJECTABLE, Registration
from declop.kube.rbac import Grant, Permission, Resolve, Source, group_resource, needs
from declop.kube.resource import Resource, resource_name
from declop.leases.hashing import SHARD_KEYS
from declop.webhooks.declaration import Webhook, WebhookKind, make_webhook

if TYPE_CHECKING:
    from declop.typed.model import CustomResource

    #: what a decorator takes as a resource: a name, a Resource, or a typed model
    ResourceLike = str | Resource | type[CustomResource]

__all__ = [
    "INJECTABLE",
    "Registration",
    "Registry",
    "background",
    "converter",
    "default_registry",
    "index",
    "mutator",
    "on_shutdown",
    "on_startup",
    "reconciler",
    "transform",
    "validator",
]

F = TypeVar("F", bound=Callable[..., Any])

#: a defaulted parameter this close to an injectable name (difflib ratio) is taken for a typo
TYPO_CUTOFF = 0.8

#: the keyword options of the module-level @reconciler, for "did you mean" on a misspelt one
RECONCILER_OPTIONS = (
    "name", "finalizer", "namespaces", "labels", "predicates", "owns", "watches", "max_concurrent",
    "priority", "rate_limit", "timeout", "metadata_only", "fields", "shard_by", "permissions", "registry",
)
_METHOD_OPTIONS = tuple(o for o in RECONCILER_OPTIONS if o != "registry")  # Registry.reconciler

_FINALIZER = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _valid_finalizer(name: str) -> bool:
    """A qualified name: optional DNS-subdomain prefix (<= 253) and a name part (<= 63)."""
    prefix, _, part = name.rpartition("/")
    return len(part) <= 63 and len(prefix) <= 253 and bool(_FINALIZER.match(name))


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
        self._transforms: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        self._hooks: list[Hook] = []
        self._webhooks: list[Webhook] = []
        self._frozen = False

    @property
    def registrations(self) -> list[Registration]:
        return list(self._registrations.values())

    @property
    def indexes(self) -> list[IndexRegistration]:
        return list(self._indexes)

    @property
    def transforms(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """Resource name (as registered) -> its cache transform."""
        return dict(self._transforms)

    @property
    def hooks(self) -> list[Hook]:
        """Lifecycle hooks in registration order."""
        return list(self._hooks)

    @property
    def webhooks(self) -> list[Webhook]:
        """Validators, mutators and converters in registration order."""
        return list(self._webhooks)

    def __len__(self) -> int:
        return len(self._registrations)

    def freeze(self) -> None:
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def clear(self) -> None:
        """Forget every registration, index, transform and hook and accept new ones — to load edited handlers
        between two managers (``declop dev`` reload). Never while a manager runs: it keeps the
        registrations it read at start."""
        self._registrations.clear()
        self._indexes.clear()
        self._transforms.clear()
        self._hooks.clear()
        self._webhooks.clear()
        self._frozen = False

    def _check_open(self, what: str) -> None:
        if self._frozen:
            raise RegistrationError(
                f"cannot register {what}: the manager has already started; make sure every "
                "handler module is imported before the manager runs"
            )

    def reconciler(
        self,
        resource: ResourceLike,
        *parts: Never,
        name: str | None = None,
        finalizer: str | None = None,
        namespaces: Sequence[str] | str | None = None,
        labels: str | Mapping[str, str] | None = None,
        predicates: Sequence[Predicate] = (),
        owns: Sequence[ResourceLike] = (),
        watches: Sequence[tuple[ResourceLike, Callable[[Any], Any]]] = (),
        max_concurrent: int = 1,
        priority: bool | Priority = True,
        rate_limit: RateLimit | None = None,
        timeout: float | None = None,
        metadata_only: bool | None = None,
        fields: str | Mapping[str, str] | None = None,
        shard_by: str = "uid",
        permissions: Sequence[Permission | tuple[str, str] | tuple[str, str, str]] = (),
        **unknown: Never,
    ) -> Callable[[F], F]:
        """Register the decorated function as the reconciler of ``resource``; see design §2.

        ``parts`` and ``unknown`` only catch mistakes (see :func:`reconciler`)."""
        _check_call("reconciler", (resource, *parts), unknown, _METHOD_OPTIONS)
        if metadata_only is not None and not isinstance(metadata_only, bool):
            raise RegistrationError(f"metadata_only must be True or False, got {metadata_only!r}")
        base = resource if isinstance(resource, Resource) else Resource(resource_name(resource))
        primary = Resource(
            base.name,
            metadata_only=base.metadata_only if metadata_only is None else metadata_only,
            fields=base.fields if fields is None else fields,  # type: ignore[arg-type]
        )
        owned = tuple(Resource.of(o, what="owns=") for o in owns)
        if finalizer is not None and not _valid_finalizer(finalizer):
            raise RegistrationError(f"finalizer {finalizer!r} is not a valid name; use 'my.domain/name'")
        if not isinstance(max_concurrent, int) or isinstance(max_concurrent, bool) or max_concurrent < 1:
            raise _BadConcurrency(
                f"max_concurrent must be a positive int (workers per process; with --shards, per replica), got {max_concurrent!r}"
            )
        if isinstance(namespaces, str):
            namespaces = (namespaces,)
        selector = str(parse_selector(labels)) if labels else ""
        for p in predicates:
            if not callable(p):
                raise RegistrationError(f"predicate {p!r} is not callable; predicates are (old, new) -> bool")
        for w in watches:
            if not (isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], (str, Resource, type)) and callable(w[1])):
                raise RegistrationError(f"watches entries are ('resource', map_fn) pairs, got {w!r}")
        priorities = _priority(priority)
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise RegistrationError(
                f"rate_limit must be declop.queue.ratelimit.RateLimit(base=, cap=, qps=, burst=) or None for client-go's defaults, got {rate_limit!r}"
            )
        if timeout is not None and not (
            isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < math.inf
        ):
            raise RegistrationError(f"timeout must be a number of seconds > 0, or None for no timeout, got {timeout!r}")
        watched = tuple((Resource.of(r, what="watches="), fn) for r, fn in watches)
        if isinstance(permissions, str) or (isinstance(permissions, tuple) and permissions and isinstance(permissions[0], str)):
            raise RegistrationError(
                f"permissions= is a list of ('verb', 'resource') tuples, e.g. [('create', 'configmaps')], got {permissions!r}"
            )
        granted = tuple(Permission.of(p) for p in permissions)
        if shard_by not in SHARD_KEYS:
            raise _BadShardKey(
                f"shard_by must be 'uid' (the default) or 'namespace', got {shard_by!r}; see docs/sharding.md"
            )

        def decorate(fn: F) -> F:
            self._check_open(f"reconciler {getattr(fn, '__name__', fn)!r}")
            if not callable(fn):
                raise RegistrationError(f"@reconciler decorates a function, got {fn!r}")
            reg_name = name or getattr(fn, "__name__", None)
            if not reg_name:
                raise RegistrationError(f"@reconciler cannot name {type(fn).__name__} objects; pass name='...'")
            if reg_name in self._registrations and self._registrations[reg_name].fn is not fn:
                raise RegistrationError(
                    f"a controller named {reg_name!r} is already registered; pass name= to tell them apart"
                )
            model = _model(fn, reg_name, primary)
            self._registrations[reg_name] = Registration(
                fn=fn,
                name=reg_name,
                resource=primary.name,
                finalizer=finalizer,
                namespaces=tuple(namespaces) if namespaces is not None else None,
                labels=selector,
                predicates=tuple(predicates),
                owns=owned,
                watches=watched,
                max_concurrent=max_concurrent,
                is_async=inspect.iscoroutinefunction(fn),
                wants=_wanted(fn, reg_name),
                priority=priorities,
                rate_limit=rate_limit,
                timeout=None if timeout is None else float(timeout),
                metadata_only=primary.metadata_only,
                fields=primary.fields,
                shard_by=shard_by,
                model=model,
                permissions=granted,
            )
            return fn

        return decorate

    def grants(
        self,
        resolve: Resolve = group_resource,
        *,
        leader: tuple[str, str] | None = None,
        shards: str | None = None,
        webhook_name: str = "declop",
        ca_secret_namespace: str | None = None,
        metrics_auth: bool = False,
    ) -> list[Grant]:
        """Every RBAC grant the registrations need (``declop rbac`` prints them, ``declop run``
        checks them at start); the deployment facts as :func:`declop.kube.rbac.needs` takes them."""
        sources = [
            Source(
                r.resource, finalizer=r.finalizer is not None, owns=tuple(o.name for o in r.owns),
                watches=tuple(w.name for w, _ in r.watches), permissions=r.permissions, name=r.name,
                namespaces=r.namespaces,
            )
            for r in self.registrations
        ]  # fmt: skip
        return needs(
            sources,
            reads=[*(ix.resource for ix in self._indexes), *self._transforms],
            leader=leader,
            shards=shards,
            webhook_name=webhook_name if self._webhooks else None,
            admission=any(h.kind != "converter" for h in self._webhooks),
            converters=[h.resource for h in self._webhooks if h.kind == "converter"],
            ca_secret_namespace=ca_secret_namespace if self._webhooks else None,
            metrics_auth=metrics_auth,
            resolve=resolve,
        )

    def index(self, resource: ResourceLike, name: str, fn: Callable[[Mapping[str, Any]], Iterable[str | None]]) -> None:
        """Add a cache index on ``resource``: ``fn(obj)`` returns the values the object is found under."""
        self._check_open(f"index {name!r}")
        named = resource_name(resource, what="index")
        if not callable(fn):
            raise RegistrationError(f"index {name!r}: expected a function obj -> list of values")
        self._indexes.append(IndexRegistration(named, name, fn))

    def transform(self, resource: ResourceLike, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Set the cache transform of ``resource``; it replaces the default (dropping managedFields)."""
        resource = resource_name(resource, what="transform")
        self._check_open(f"transform of {resource!r}")
        if not isinstance(resource, str) or not resource.strip():
            raise RegistrationError(f"transform: resource must be a name like 'pods', got {resource!r}")
        if not callable(fn) or isinstance(fn, type):
            raise RegistrationError(f"transform of {resource!r}: expected a function obj -> obj, got {fn!r}")
        key = resource.strip()
        if key in self._transforms and self._transforms[key] is not fn:
            raise RegistrationError(f"a transform of {key!r} is already registered; one transform per resource")
        self._transforms[key] = fn

    def hook(self, kind: HookKind, fn: Any, *, name: str | None = None, every_replica: bool = False) -> Hook:
        """Record a lifecycle hook (what the ``on_startup``/``on_shutdown``/``background`` decorators do)."""
        self._check_open(f"{kind} hook {getattr(fn, '__name__', fn)!r}")
        hook = make_hook(fn, kind, name=name, every_replica=every_replica)
        if any(h.kind == kind and h.name == hook.name and h.fn is not fn for h in self._hooks):
            raise RegistrationError(f"a {kind} hook named {hook.name!r} is already registered; pass name= to tell them apart")
        if not any(h.fn is fn and h.kind == kind for h in self._hooks):
            self._hooks.append(hook)
        return hook

    def webhook(self, kind: WebhookKind, fn: Any, resource: ResourceLike, **options: Any) -> Webhook:
        """Record a validator, mutator or converter (what their decorators do); see
        :func:`declop.webhooks.declaration.make_webhook` for the options."""
        self._check_open(f"{kind} {getattr(fn, '__name__', fn)!r}")
        named = resource_name(resource, what=f"@{kind}")
        if kind == "converter" and isinstance(resource, type):
            named = getattr(resource, "kind_of")().crd_name  # one converter serves every version of the CRD
        hook = make_webhook(fn, kind, named, **options)
        model = _model(fn, hook.name, Resource(named))
        if model is not None and kind != "validator":
            raise RegistrationError(
                f"@declop.{kind} {hook.name!r}{_where(fn)} declares obj: {model.__qualname__}; a typed obj is for "
                f"reconcilers and validators — a {kind} gets the object as a dict"
            )
        if model is not None:
            hook = dataclasses.replace(hook, model=model)
        for other in self._webhooks:
            if other.fn is fn and other.kind == kind and other.name == hook.name:
                return other  # the same module imported twice
            if other.kind == kind and other.name == hook.name:
                raise RegistrationError(
                    f"a {kind} named {hook.name!r} is already registered; pass name= to tell them apart"
                )
            if kind == "converter" and other.kind == kind and other.resource == hook.resource:
                raise RegistrationError(
                    f"{resource!r} already has a converter ({other.name!r}); one converter per resource "
                    "converts between all of its versions"
                )
        self._webhooks.append(hook)
        return hook


def _check_call(
    decorator: str, positional: tuple[Any, ...], unknown: Mapping[str, Any], options: Sequence[str]
) -> None:
    """Refuse extra positional arguments and unknown options with a hint instead of Python's
    bare ``TypeError`` (which says neither what was meant nor what to write)."""
    if len(positional) > 1:
        shown = ", ".join(_short(p) for p in positional)
        raise RegistrationError(f"@{decorator}({shown}): {resource_in_parts(positional)}")
    for option in unknown:
        # an exact Kopf option first: Kopf's field= is not declop's fields= (a field selector)
        hint = KOPF_OPTIONS.get(option) or did_you_mean(option, options) or f"the options are {', '.join(options)}"
        raise RegistrationError(f"@{decorator} got an unknown option {option}=: {hint}")


def _short(value: Any) -> str:
    """A decorator argument as it was written in the source: short strings quoted, else the type."""
    if isinstance(value, str) and len(value) <= 60:
        return repr(value)
    return f"<{type(value).__name__}>"


def _where(fn: Callable[..., Any]) -> str:
    """`` (handlers.py:12)``: the file and first line of the function, when it has code."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    code = getattr(inspect.unwrap(target), "__code__", None)
    if code is None:
        return ""
    return f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


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


def _wanted(fn: Callable[..., Any], name: str) -> frozenset[str] | None:
    """The injectable names ``fn`` declares (``None`` when it takes ``**kwargs``: it gets all).

    Raises:
        RegistrationError: a parameter without a default that declop cannot fill (whether or
            not there is ``**kwargs``: that never fills it); a defaulted one whose name is a
            typo of an injectable name (ratio >= :data:`TYPO_CUTOFF`, e.g. ``loger=None``)
            unless ``functools.partial`` bound it; or an injectable that is positional-only.
    """
    sig = inspect.signature(fn)
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    wants: set[str] = set()
    takes_all = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name in INJECTABLE:
            if p.kind is p.POSITIONAL_ONLY:
                raise RegistrationError(
                    f"handler {name!r}{_where(fn)}: {p.name!r} must not be positional-only; remove the '/'"
                )
            wants.add(p.name)
            continue
        if p.default is p.empty:
            raise RegistrationError(_unknown_required(fn, name, p.name))
        typo = did_you_mean(p.name, INJECTABLE, cutoff=TYPO_CUTOFF)
        if typo and p.name not in bound:
            raise RegistrationError(
                f"handler {name!r}{_where(fn)} takes an unknown argument {p.name!r}, which would always "
                f"keep its default: {typo} declop passes only {', '.join(sorted(INJECTABLE))}"
            )
    return None if takes_all else frozenset(wants)


def _model(fn: Callable[..., Any], name: str, primary: Resource) -> Any:
    """The typed model of ``fn``'s ``obj`` annotation (``obj: Widget``), or None for a dict.

    Raises:
        RegistrationError: the annotation cannot be resolved, the model is of another resource
            than ``primary``, or ``primary`` is cached as metadata only (there is no body to type).
    """
    if "declop.typed.model" not in sys.modules:
        return None  # no model class exists yet: obj cannot be annotated with one
    from declop.typed.view import model_of

    model = model_of(fn, name)
    if model is None:
        return None
    kind = model.kind_of()
    where = f"handler {name!r}{_where(fn)}"
    if "." in primary.name and primary.name not in (kind.resource, kind.crd_name):
        raise RegistrationError(
            f"{where} declares obj: {model.__qualname__} ({kind.resource}) but reconciles {primary.name!r}; "
            f"pass the model itself: @declop.reconciler({model.__qualname__})"
        )
    if primary.metadata_only:
        raise RegistrationError(
            f"{where} declares obj: {model.__qualname__} but its cache holds metadata only; drop metadata_only=True "
            "or annotate obj as a dict"
        )
    return model


def _unknown_required(fn: Callable[..., Any], name: str, param: str) -> str:
    """The one-line refusal of a parameter without a default that declop cannot fill."""
    where = f"handler {name!r}{_where(fn)}"
    if param in KOPF_KWARGS:
        return f"{where} takes {param!r}, which Kopf passes and declop does not: {KOPF_KWARGS[param]}"
    if param in ("kwargs", "kw", "_"):
        return f"{where} takes a plain argument {param!r}: did you mean **{param}?"
    hint = did_you_mean(param, INJECTABLE)
    lead = f"{hint} " if hint else ""
    return (
        f"{where} takes an unknown argument {param!r}: {lead}declop passes only "
        f"{', '.join(sorted(INJECTABLE))}; rename it, or give it a default if it is your own"
    )


default_registry = Registry()



class _BadConcurrency(RegistrationError):
    """``max_concurrent`` is not a positive int: a usage error (exit 2 from the CLI)."""

    exit_code = 2


class _BadShardKey(RegistrationError):
    """``shard_by`` is neither "uid" nor "namespace": a usage error (exit 2 from the CLI)."""

    exit_code = 2


def reconciler(
    resource: ResourceLike,
    *parts: Never,
    name: str | None = None,
    finalizer: str | None = None,
    namespaces: Sequence[str] | str | None = None,
    labels: str | Mapping[str, str] | None = None,
    predicates: Sequence[Predicate] = (),
    owns: Sequence[ResourceLike] = (),
    watches: Sequence[tuple[ResourceLike, Callable[[Any], Any]]] = (),
    max_concurrent: int = 1,
    priority: bool | Priority = True,
    rate_limit: RateLimit | None = None,
    timeout: float | None = None,
    metadata_only: bool | None = None,
    fields: str | Mapping[str, str] | None = None,
    shard_by: str = "uid",
    permissions: Sequence[Permission | tuple[str, str] | tuple[str, str, str]] = (),
    registry: Registry | None = None,
    **unknown: Never,
) -> Callable[[F], F]:
    """Register a reconciler of ``resource`` (``"pods"``, ``"deployments.apps"``, ``"widgets.example.com"``).

    The function is called with keyword arguments — the ones it declares among ``request``,
    ``name``, ``namespace``, ``client``, ``logger``, ``reconcile_id``, ``phase``, ``obj``,
    ``trigger`` — and returns ``None``, a :class:`~declop.reconcile.result.Result`, or raises. See
    ``docs/contract.md``.

    ``metadata_only=True`` caches the primary as metadata only: ``obj`` and ``client.get`` hold
    ``metadata`` and nothing else; read the body with ``client.live.get(request)``
    (docs/metadata-only.md). ``fields="spec.nodeName=node-1"`` is a field selector: only matching
    objects reach the cache and the handler (docs/fields-and-transforms.md). ``owns=`` and
    ``watches=`` entries may be a :class:`~declop.kube.resource.Resource` to say the same of them.

    Tuning (``docs/priority.md``, ``docs/tuning.md``): ``priority`` (True: listed and unchanged
    keys wait behind real changes, with aging; False: FIFO; or a :class:`~declop.queue.priority.Priority`),
    ``rate_limit`` (a :class:`~declop.queue.ratelimit.RateLimit`; default client-go's 5 ms..1000 s per key, 10
    qps / burst 100 overall), ``timeout`` (seconds; an ``async def`` handler is cancelled and
    retried with backoff, a plain one that overruns is reported).

    Sharding (``declop run --shards N``, docs/sharding.md): ``shard_by="uid"`` (the default)
    hashes the primary's uid, and an owned child its owner reference's uid; ``"namespace"``
    hashes the namespace, so everything of one namespace lands on one replica.

    ``permissions=[("create", "configmaps"), ("get", "secrets", "my-secret")]`` declares writes
    declop cannot infer (each a ``(verb, resource[, name])`` tuple or a
    :class:`~declop.kube.rbac.Permission`): ``declop rbac`` grants them and ``declop run``
    checks them at start (docs/rbac.md).

    ``parts`` and ``unknown`` only catch mistakes: an extra positional argument (Kopf's
    ``"group", "version", "plural"``) or a misspelt option raises
    :class:`~declop.errors.RegistrationError` with the one string or option meant. Type
    checkers flag such calls already: nothing is assignable to ``Never``.
    """
    _check_call("reconciler", (resource, *parts), unknown, RECONCILER_OPTIONS)
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
        priority=priority,
        rate_limit=rate_limit,
        timeout=timeout,
        metadata_only=metadata_only,
        fields=fields,
        shard_by=shard_by,
        permissions=permissions,
    )


def index(
    resource: ResourceLike,
    name: str,
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]],
    *,
    registry: Registry | None = None,
    **unknown: Never,
) -> None:
    """Declare a cache index: ``client.list(resource, index=(name, value))`` finds objects by it."""
    _check_call("index", (resource,), unknown, ("registry",))
    (registry if registry is not None else default_registry).index(resource, name, fn)


def transform(
    resource: ResourceLike,
    fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    *,
    registry: Registry | None = None,
    **unknown: Never,
) -> Any:
    """Set the cache transform of ``resource``: ``fn(obj) -> obj`` runs on every object before it
    enters the cache, **instead of** the default that drops ``metadata.managedFields``. It must be
    pure and fast (it runs on the event loop for every event) and keep ``metadata.name``,
    ``namespace`` and ``resourceVersion``. ``declop.transform("pods", fn)`` or, as a decorator,
    ``@declop.transform("pods")``. See docs/fields-and-transforms.md."""
    _check_call("transform", (resource,), unknown, ("registry",))
    reg = registry if registry is not None else default_registry
    if fn is None:

        def decorate(f: F) -> F:
            reg.transform(resource, f)
            return f

        return decorate
    reg.transform(resource, fn)
    return fn


def _hook_decorator(kind: HookKind, fn: Any, name: str | None, registry: Registry | None, every_replica: bool = False) -> Any:
    reg = registry if registry is not None else default_registry
    if fn is None:

        def decorate(f: F) -> F:
            reg.hook(kind, f, name=name, every_replica=every_replica)
            return f

        return decorate
    reg.hook(kind, fn, name=name, every_replica=every_replica)
    return fn


def on_startup(
    fn: F | None = None, *, name: str | None = None, registry: Registry | None = None, **unknown: Never
) -> Any:
    """Run ``fn`` once before any informer starts (``@declop.on_startup`` or ``@declop.on_startup()``).

    It may declare ``client``, ``logger``, ``stop``. Raising fails the start: ``declop run`` prints
    one line naming the hook and exits 1. Caches are not running yet: read with ``client.live``."""
    _check_call("on_startup", (fn,), unknown, ("name", "registry"))
    return _hook_decorator("startup", fn, name, registry)


def on_shutdown(
    fn: F | None = None, *, name: str | None = None, registry: Registry | None = None, **unknown: Never
) -> Any:
    """Run ``fn`` once on a stop, after in-flight reconciles drained and background tasks ended,
    while the client still works. A failure is logged and makes the exit code 1."""
    _check_call("on_shutdown", (fn,), unknown, ("name", "registry"))
    return _hook_decorator("shutdown", fn, name, registry)


def background(
    fn: F | None = None,
    *,
    name: str | None = None,
    every_replica: bool = False,
    registry: Registry | None = None,
    **unknown: Never,
) -> Any:
    """Run the ``async def`` ``fn`` as a long-running task once the caches synced: only on the
    leader (at once without leader election), or on every replica with ``every_replica=True``.

    It may declare ``client``, ``logger``, ``stop`` (an ``asyncio.Event`` set when it should end).
    It is cancelled on shutdown (after the grace period) and, leader-only, at once when the Lease
    is lost; when it raises it is logged and restarted with backoff (0.8 s doubling to 30 s)."""
    _check_call("background", (fn,), unknown, ("name", "every_replica", "registry"))
    if not isinstance(every_replica, bool):
        raise RegistrationError(f"every_replica must be True or False, got {every_replica!r}")
    return _hook_decorator("background", fn, name, registry, every_replica)


_ADMISSION_OPTIONS = ("operations", "name", "failure_policy", "timeout", "labels", "system_namespaces", "registry")


def _webhook_decorator(kind: WebhookKind, registry: Registry | None, resource: ResourceLike, **options: Any) -> Callable[[F], F]:
    reg = registry if registry is not None else default_registry

    def decorate(fn: F) -> F:
        reg.webhook(kind, fn, resource, **options)
        return fn

    return decorate


def validator(
    resource: ResourceLike,
    *parts: Never,
    operations: Sequence[str] = ("CREATE", "UPDATE"),
    name: str | None = None,
    failure_policy: str = "Fail",
    timeout: int = 10,
    labels: str | Mapping[str, str] | None = None,
    system_namespaces: bool = False,
    registry: Registry | None = None,
    **unknown: Never,
) -> Callable[[F], F]:
    """Register a validating admission webhook for ``resource`` (docs/webhooks.md).

    The function declares what it needs among ``obj``, ``old_obj``, ``operation``,
    ``user_info``, ``dry_run``, ``subresource``, ``logger``, ``request_uid``, ``warnings``;
    it returns ``None`` to allow, a string or list of strings to allow with warnings, and raises
    :class:`~declop.webhooks.declaration.Rejected` to deny. ``failure_policy`` (``"Fail"``/``"Ignore"``) and
    ``timeout`` (1–30 s) go into the ValidatingWebhookConfiguration; ``labels`` is its object
    selector. Requests in ``kube-system``, ``kube-public``, ``kube-node-lease`` and the
    operator's own namespace are not sent to it unless ``system_namespaces=True`` (the
    operator's own namespace stays excluded). It must be fast and free of side effects: it runs on every write, dry runs too."""
    _check_call("validator", (resource, *parts), unknown, _ADMISSION_OPTIONS)
    return _webhook_decorator(
        "validator", registry, resource, operations=operations, name=name,
        failure_policy=failure_policy, timeout=timeout, labels=labels, system_namespaces=system_namespaces,
    )


def mutator(
    resource: ResourceLike,
    *parts: Never,
    operations: Sequence[str] = ("CREATE", "UPDATE"),
    name: str | None = None,
    failure_policy: str = "Fail",
    timeout: int = 10,
    labels: str | Mapping[str, str] | None = None,
    system_namespaces: bool = False,
    registry: Registry | None = None,
    **unknown: Never,
) -> Callable[[F], F]:
    """Register a mutating admission webhook for ``resource`` (docs/webhooks.md).

    Same arguments as :func:`validator`; ``obj`` is a deep copy the function changes in place
    (or it returns a new object). declop answers with the JSON Patch from the object as sent to
    the result, and with no patch when nothing changed. Raising
    :class:`~declop.webhooks.declaration.Rejected` denies the request."""
    _check_call("mutator", (resource, *parts), unknown, _ADMISSION_OPTIONS)
    return _webhook_decorator(
        "mutator", registry, resource, operations=operations, name=name,
        failure_policy=failure_policy, timeout=timeout, labels=labels, system_namespaces=system_namespaces,
    )


def converter(
    resource: ResourceLike,
    *parts: Never,
    name: str | None = None,
    registry: Registry | None = None,
    **unknown: Never,
) -> Callable[[F], F]:
    """Register the conversion webhook of the custom resource ``resource`` (docs/webhooks.md).

    The function declares ``obj``, ``desired_api_version``, ``logger``; it converts ``obj`` (a
    copy) to ``desired_api_version`` in place or returns the converted object. declop sets
    ``apiVersion`` and keeps ``metadata`` as it was except labels and annotations (all that
    Kubernetes lets a conversion change). Raising fails the conversion of that batch with a
    message; the operator sets the CRD's ``spec.conversion`` at start."""
    _check_call("converter", (resource, *parts), unknown, ("name", "registry"))
    return _webhook_decorator("converter", registry, resource, name=name)
