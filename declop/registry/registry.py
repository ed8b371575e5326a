"""Registry: what the decorators declared, held until a manager freezes and runs it.

It records reconcilers (as :class:`~declop.reconcile.registration.Registration`), cache indexes,
cache transforms, lifecycle hooks (:mod:`declop.lifecycle`) and webhooks
(:mod:`declop.webhooks.declaration`), and derives the RBAC grants they need.

Invariants:
- a decorator returns the function **unchanged**, so it stays callable in unit tests;
- the registry is frozen when a manager starts, and registering afterwards raises
  :class:`~declop.errors.RegistrationError` (decorators run at import time) until
  :meth:`Registry.clear` empties it for the next manager;
- the primary resource and every ``owns=``/``watches=`` entry is stored as a
  :class:`~declop.kube.resource.Resource`; wherever a resource name goes (reconcilers, indexes,
  transforms, webhooks) a typed model may go, and is stored by its name;
- one name per reconciler, per hook kind and per webhook kind; at most one transform per
  resource name and one converter per resource. Registering the same function again (a module
  imported twice, or a handler file loaded afresh: the same ``def`` at the same line) is
  harmless, and the newest function is the one kept.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Never, TypeVar

from declop.errors import RegistrationError
from declop.kube.rbac import ClusterScoped, Grant, Resolve, Source, group_resource, is_cluster_scoped, needs
from declop.kube.resource import Resource, resource_name
from declop.lifecycle import Hook, HookKind, make_hook
from declop.reconcile.registration import Registration
from declop.registry.calls import Decorator, check_call, method_keywords_of
from declop.registry.options import OPTION_NAMES, ReconcilerOptions
from declop.registry.signatures import location, typed_model, wanted_names
from declop.webhooks.declaration import Webhook, WebhookKind, make_webhook

if TYPE_CHECKING:
    from declop.registry.options import ResourceLike

__all__ = ["IndexRegistration", "Registration", "Registry"]  # Registration: what Registry.registrations holds

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class IndexRegistration:
    resource: str
    name: str
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]]


def _same_definition(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are one function: the same object, or the same ``def`` in another execution
    of its module (a handler file :func:`declop.loader.load` ran afresh): same module, qualified
    name and line, other module globals. Two functions one factory made in one module run are
    two handlers."""
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (
        code_a is not None and code_b is not None
        and getattr(a, "__globals__", None) is not getattr(b, "__globals__", None)
        and getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
        and (code_a.co_filename, code_a.co_firstlineno) == (code_b.co_filename, code_b.co_firstlineno)
    )  # fmt: skip


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

    def __bool__(self) -> bool:
        """Always true: a registry is a place, not a collection, so ``registry or default`` never
        trades an empty registry someone passed for the default one."""
        return True

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

    @method_keywords_of(ReconcilerOptions)
    def reconciler(self, resource: ResourceLike, *parts: Never, **options: Any) -> Decorator:
        """Register the decorated function as the reconciler of ``resource``; see design §2 and
        :func:`declop.registry.reconciler` for the options (:class:`ReconcilerOptions`).

        ``parts`` and unknown options only catch mistakes (see :func:`declop.registry.reconciler`)."""
        check_call("reconciler", (resource, *parts), options, OPTION_NAMES)
        return self.register(resource, ReconcilerOptions(**options))

    def register(self, resource: ResourceLike, options: ReconcilerOptions) -> Decorator:
        """The decorator that records a function as the reconciler of ``resource`` with
        ``options`` (already checked: a :class:`ReconcilerOptions` that exists is valid)."""
        primary = options.primary(resource)
        settled = options.settled(primary)

        def decorate(fn: F) -> F:
            self._check_open(f"reconciler {getattr(fn, '__name__', fn)!r}")
            if not callable(fn):
                raise RegistrationError(f"@reconciler decorates a function, got {fn!r}")
            reg_name = options.name or getattr(fn, "__name__", None)
            if not reg_name:
                raise RegistrationError(f"@reconciler cannot name {type(fn).__name__} objects; pass name='...'")
            if reg_name in self._registrations and not _same_definition(self._registrations[reg_name].fn, fn):
                raise RegistrationError(
                    f"a controller named {reg_name!r} is already registered; pass name= to tell them apart"
                )
            model = typed_model(fn, reg_name, primary)
            self._registrations[reg_name] = Registration(
                fn=fn,
                name=reg_name,
                resource=primary.name,
                is_async=inspect.iscoroutinefunction(fn),
                wants=wanted_names(fn, reg_name),
                model=model,
                **settled,
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
        cluster_scoped: ClusterScoped = is_cluster_scoped,
    ) -> list[Grant]:
        """Every RBAC grant the registrations need (``declop rbac`` prints them, ``declop run``
        checks them at start); the deployment facts as :func:`declop.kube.rbac.needs` takes them,
        names read with ``resolve`` and scopes with ``cluster_scoped`` (a
        :class:`~declop.kube.catalog.Catalog`'s, for both to read as ``declop run`` does)."""
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
            cluster_scoped=cluster_scoped,
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
        if key in self._transforms and not _same_definition(self._transforms[key], fn):
            raise RegistrationError(f"a transform of {key!r} is already registered; one transform per resource")
        self._transforms[key] = fn

    def hook(self, kind: HookKind, fn: Any, *, name: str | None = None, every_replica: bool = False, **probe: float) -> Hook:
        """Record a lifecycle hook (what the ``on_startup``/``on_shutdown``/``background``/``on_probe``
        decorators do); ``probe``: a probe's ``timeout`` and ``cache``."""
        self._check_open(f"{kind} hook {getattr(fn, '__name__', fn)!r}")
        hook = make_hook(fn, kind, name=name, every_replica=every_replica, **probe)
        for i, h in enumerate(self._hooks):
            if h.kind == kind and _same_definition(h.fn, fn):
                self._hooks[i] = hook  # the same hook again (its file loaded afresh): the newest
                return hook
            if h.kind == kind and h.name == hook.name:
                raise RegistrationError(f"a {kind} hook named {hook.name!r} is already registered; pass name= to tell them apart")
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
        if kind != "converter":
            model = typed_model(fn, hook.name, Resource(named))
        elif "declop.typed.model" in sys.modules:  # a converter names the models of the versions it reads
            from declop.webhooks.typed import converter_models

            model = converter_models(fn, hook.name, named) or None
        else:
            model = None
        if model is not None:
            hook = dataclasses.replace(hook, model=model)
        for i, other in enumerate(self._webhooks):
            if other.kind == kind and other.name == hook.name and _same_definition(other.fn, fn):
                self._webhooks[i] = hook  # the same module imported twice, or loaded afresh: the newest
                return hook
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
