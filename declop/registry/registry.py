"""Registry: what the decorators declared, held until a manager freezes and runs it.

It records reconcilers (as :class:`~declop.reconcile.registration.Registration`; a timer is one
whose ``fn`` is a :class:`~declop.handlers.timers.TimerRunner`'s handler), cache indexes,
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
from declop.handlers.timers import Schedule, TimerRunner
from declop.handlers.daemons import check_timing, default_finalizer, make_daemon
from declop.handlers.steps import grants as step_grants
from declop.handlers.steps import wrap as wrap_steps
from declop.kube.rbac import ClusterScoped, Grant, Resolve, Source, group_resource, is_cluster_scoped, needs
from declop.kube.resource import Resource, resource_name
from declop.handlers.changes import runner as changes_runner
from declop.handlers.returns import runner as returns_runner
from declop.lifecycle import Hook, HookKind, make_hook
from declop.reconcile.registration import Registration
from declop.registry.calls import Decorator, check_call, method_keywords_of
from declop.registry.options import OPTION_NAMES, TIMER_OPTION_NAMES, ReconcilerOptions, _valid_finalizer
from declop.registry.signatures import INJECTABLE, location, typed_model, wanted_names
from declop.webhooks.declaration import Webhook, WebhookKind, make_webhook

if TYPE_CHECKING:
    from declop.registry.options import ResourceLike

__all__ = ["IndexRegistration", "Registration", "Registry", "same_definition"]  # Registration: what Registry.registrations holds

F = TypeVar("F", bound=Callable[..., Any])

#: the keyword options of ``@declop.daemon`` (the "did you mean" list of a misspelt one)
DAEMON_OPTIONS = (
    "name", "stop_timeout", "backoff", "initial_delay", "finalizer", "namespaces", "labels", "fields",
    "predicates", "shard_by", "max_concurrent", "registry",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class IndexRegistration:
    resource: str
    name: str
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]]


def same_definition(a: Any, b: Any) -> bool:
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

        def decorate(fn: F) -> F:
            self._check_open(f"reconciler {getattr(fn, '__name__', fn)!r}")
            if not callable(fn):
                raise RegistrationError(f"@reconciler decorates a function, got {fn!r}")
            reg_name = options.name or getattr(fn, "__name__", None)
            if not reg_name:
                raise RegistrationError(f"@reconciler cannot name {type(fn).__name__} objects; pass name='...'")
            known = self._registrations.get(reg_name)
            if known is not None and not same_definition(inspect.unwrap(known.fn), fn):  # a runner wraps fn
                raise RegistrationError(
                    f"a controller named {reg_name!r} is already registered; pass name= to tell them apart"
                )
            model = typed_model(fn, reg_name, primary)
            settled = options.settled(primary, reg_name)
            runner, wants = wrap_steps(fn, reg_name, wanted_names)  # fn itself unless it takes `steps`
            reg = Registration(
                fn=runner,
                name=reg_name,
                resource=primary.name,
                is_async=inspect.iscoroutinefunction(fn),
                wants=wants,
                wants_first_seen="first_seen" in inspect.signature(fn).parameters,
                model=model,
                **{**settled, "permissions": (*settled["permissions"], *step_grants(runner, primary.name))},
            )
            # the runners, innermost first: a return value to the status, then field changes
            self._registrations[reg_name] = changes_runner(returns_runner(reg))
            return fn

        return decorate

    def timer(
        self,
        resource: ResourceLike,
        *parts: Never,
        interval: float,
        idle: float | None = None,
        initial_delay: float | None = None,
        **options: Any,
    ) -> Decorator:
        """Register the decorated function as a timer of ``resource``: called every ``interval``
        seconds per object, on the replica that owns the object's key; see
        :func:`declop.registry.timer` and docs/timers.md. ``options`` are the reconciler options a
        timer takes (:data:`~declop.registry.options.TIMER_OPTION_NAMES`)."""
        check_call("timer", (resource, *parts), options, ("interval", "idle", "initial_delay", *TIMER_OPTION_NAMES))
        return self.register_timer(resource, Schedule(interval, idle, initial_delay), ReconcilerOptions(**options))

    def register_timer(self, resource: ResourceLike, schedule: Schedule, options: ReconcilerOptions) -> Decorator:
        """The decorator that records a function as a timer: a :class:`~declop.handlers.timers.TimerRunner`
        around it becomes the ``fn`` of an ordinary registration named as the function (or ``name=``)."""
        primary = options.primary(resource)

        def decorate(fn: F) -> F:
            self._check_open(f"timer {getattr(fn, '__name__', fn)!r}")
            if not callable(fn):
                raise RegistrationError(f"@timer decorates a function, got {fn!r}")
            reg_name = options.name or getattr(fn, "__name__", None)
            if not reg_name:
                raise RegistrationError(f"@timer cannot name {type(fn).__name__} objects; pass name='...'")
            known = self._registrations.get(reg_name)
            if known is not None and same_definition(getattr(getattr(known.fn, "__self__", None), "fn", None), fn):
                del self._registrations[reg_name]  # the same timer again (its file loaded afresh): the newest
            wants = wanted_names(fn, reg_name)
            runner = TimerRunner(fn, schedule, name=reg_name, wants=wants, model=typed_model(fn, reg_name, primary))
            self.register(resource, dataclasses.replace(options, name=reg_name))(runner.handler)
            # the runner reads the key, the object, the trigger and the logger; the rest only when
            # the function declares it (a runner taking **kwargs would count as asking for all)
            needs = frozenset(INJECTABLE) if wants is None else wants | TimerRunner.NEEDS
            self._registrations[reg_name] = dataclasses.replace(self._registrations[reg_name], wants=needs)
            return fn

        return decorate

    def daemon(
        self,
        resource: ResourceLike,
        *parts: Never,
        name: str | None = None,
        stop_timeout: float = 10.0,
        backoff: float = 5.0,
        initial_delay: float | None = None,
        finalizer: str | bool | None = None,
        namespaces: Any = None,
        labels: Any = None,
        fields: str | None = None,
        predicates: Any = (),
        shard_by: str = "uid",
        max_concurrent: int = 4,
        **unknown: Never,
    ) -> Decorator:
        """Register the decorated function as a per-object daemon of ``resource``: see
        :func:`declop.registry.daemon` and docs/daemons.md."""
        check_call("daemon", (resource, *parts), unknown, DAEMON_OPTIONS)
        check_timing(stop_timeout, backoff, initial_delay)
        if finalizer is True or (finalizer is not None and finalizer is not False and not isinstance(finalizer, str)):
            raise RegistrationError(f"finalizer= is a finalizer name, None (the default: daemons.declop.dev/<name>) or False for none, got {finalizer!r}")
        options = ReconcilerOptions(
            name=name, finalizer=finalizer or None, namespaces=namespaces, labels=labels, fields=fields,
            predicates=predicates, shard_by=shard_by, max_concurrent=max_concurrent,
        )  # fmt: skip
        primary = options.primary(resource)
        settled = options.settled(primary)

        def decorate(fn: F) -> F:
            self._check_open(f"daemon {getattr(fn, '__name__', fn)!r}")
            if not callable(fn) or isinstance(fn, type):
                raise RegistrationError(f"@daemon decorates a function, got {fn!r}")
            reg_name = name or getattr(fn, "__name__", None)
            if not reg_name:
                raise RegistrationError(f"@daemon cannot name {type(fn).__name__} objects; pass name='...'")
            existing = self._registrations.get(reg_name)
            if existing is not None:
                known = getattr(getattr(existing.fn, "__self__", None), "fn", None)
                if known is fn:
                    return fn  # the same module imported twice
                if not same_definition(known, fn):
                    raise RegistrationError(f"a controller named {reg_name!r} is already registered; pass name= to tell them apart")
                del self._registrations[reg_name]  # its file loaded afresh: the newest replaces it
                replaced = True
            else:
                replaced = False
            if finalizer is None:
                settled["finalizer"] = default_finalizer(reg_name)
                if not _valid_finalizer(settled["finalizer"]):
                    raise RegistrationError(
                        f"daemon {reg_name!r}: its default finalizer {settled['finalizer']!r} is not a valid name "
                        "(63 characters at most after the '/'); pass name= or finalizer='my.domain/name'"
                    )
            registration, keeper = make_daemon(
                fn, reg_name, primary.name, settled, stop_timeout=stop_timeout, backoff=backoff, initial_delay=initial_delay
            )
            self._registrations[reg_name] = registration
            if replaced:
                self._hooks = [h for h in self._hooks if not (h.kind == keeper.kind and h.name == keeper.name)]
            self._hooks.append(keeper)
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
                namespaces=r.namespaces, records=bool(r.records),
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
        for i, known in enumerate(self._indexes):
            if known.resource == named and known.name == name:
                if not same_definition(known.fn, fn):
                    raise RegistrationError(f"an index named {name!r} on {named!r} is already registered; give this one another name")
                self._indexes[i] = IndexRegistration(named, name, fn)  # its file loaded afresh: the newest
                return
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
        if key in self._transforms and not same_definition(self._transforms[key], fn):
            raise RegistrationError(f"a transform of {key!r} is already registered; one transform per resource")
        self._transforms[key] = fn

    def hook(self, kind: HookKind, fn: Any, *, name: str | None = None, every_replica: bool = False, **probe: float) -> Hook:
        """Record a lifecycle hook (what the ``on_startup``/``on_shutdown``/``background``/``on_probe``
        decorators do); ``probe``: a probe's ``timeout`` and ``cache``."""
        self._check_open(f"{kind} hook {getattr(fn, '__name__', fn)!r}")
        hook = make_hook(fn, kind, name=name, every_replica=every_replica, **probe)
        for i, h in enumerate(self._hooks):
            if h.kind == kind and same_definition(h.fn, fn):
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
            if kind != "converter" and any(s in ("scale", "*") for s in hook.subresources):
                raise RegistrationError(
                    f"@{kind} {hook.name!r}: obj is annotated with a model, but a scale request carries an "
                    "autoscaling/v1 Scale, not the resource; annotate obj as dict, or register the scale webhook apart"
                )
            hook = dataclasses.replace(hook, model=model)
        for i, other in enumerate(self._webhooks):
            if other.kind == kind and other.name == hook.name and same_definition(other.fn, fn):
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
