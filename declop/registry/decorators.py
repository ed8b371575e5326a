"""The module-level decorators: ``@declop.reconciler``, ``declop.index`` … bound to the default registry.

Each forwards to the :class:`~declop.registry.registry.Registry` passed as ``registry=``, else
to ``declop.registry.default_registry``, read when the decorator is called: ``declop dev``, the
scaffold's check and tests swap that attribute of the package for a registry of their own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Never, Sequence, TypeVar

from declop.errors import RegistrationError
from declop.lifecycle import HookKind
from declop.registry.calls import Decorator, check_call, keywords_of
from declop.registry.options import TIMER_OPTION_NAMES, ReconcilerOptions
from declop.registry.registry import DAEMON_OPTIONS, Registry
from declop.webhooks.declaration import ANY_VALUE, WebhookKind

if TYPE_CHECKING:
    from declop.registry.options import ResourceLike

__all__ = [
    "RECONCILER_OPTIONS",
    "background",
    "converter",
    "daemon",
    "default_registry",
    "index",
    "mutator",
    "on_login",
    "on_probe",
    "on_shutdown",
    "on_startup",
    "reconciler",
    "timer",
    "transform",
    "validator",
]

F = TypeVar("F", bound=Callable[..., Any])

#: the registry the decorators write to when not given one (the package's attribute is the one read)
default_registry = Registry()


def _target(registry: Registry | None) -> Registry:
    """``registry``, else the package's ``default_registry`` as it is now (it may be swapped)."""
    if registry is not None:
        return registry
    from declop import registry as package

    return package.default_registry


@dataclass(frozen=True, slots=True, kw_only=True)
class _Routed(ReconcilerOptions):
    """The module-level decorator's keywords: the options, and the registry that records them."""

    registry: Registry | None = None


#: the keyword options of the module-level @reconciler, for "did you mean" on a misspelt one
RECONCILER_OPTIONS = tuple(f.name for f in dataclasses.fields(_Routed))


@keywords_of(_Routed)
def reconciler(resource: ResourceLike, *parts: Never, **options: Any) -> Decorator:
    """Register a reconciler of ``resource`` (``"pods"``, ``"deployments.apps"``, ``"widgets.example.com"``).

    The function is called with keyword arguments — the ones it declares among ``request``,
    ``name``, ``namespace``, ``client``, ``logger``, ``reconcile_id``, ``phase``, ``obj``,
    ``trigger`` — and returns ``None``, a :class:`~declop.reconcile.result.Result`, or raises. See
    ``docs/contract.md``.

    ``name=`` names the controller (metrics, logs, Leases); default: the function's
    ``__name__``. Two reconcilers with one name are refused: pass ``name=`` to tell them apart.

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

    Field changes (docs/changes.md): a handler that declares ``old``, ``new`` or ``diff`` gets
    them against a snapshot of what it last handled, kept in an annotation on the object and
    written after it succeeds; ``field="spec.size"`` calls it only when that field's value
    differs from the snapshot's, and ``old=``/``new=`` (a value, or a callable value -> bool)
    filter that value.

    ``permissions=[("create", "configmaps"), ("get", "secrets", "my-secret")]`` declares writes
    declop cannot infer (each a ``(verb, resource[, name])`` tuple or a
    :class:`~declop.kube.rbac.Permission`): ``declop rbac`` grants them and ``declop run``
    checks them at start (docs/rbac.md).

    The options are :class:`~declop.registry.options.ReconcilerOptions`' fields, plus
    ``registry=`` (default: ``declop.registry.default_registry``). ``parts`` and any other
    keyword only catch mistakes: an extra positional argument (Kopf's ``"group", "version",
    "plural"``) or a misspelt option raises :class:`~declop.errors.RegistrationError` with the one
    string or option meant. Type checkers flag such calls already: the signature they see is the
    resource and the options' keywords.
    """
    check_call("reconciler", (resource, *parts), options, RECONCILER_OPTIONS)
    registry = options.pop("registry", None)
    return _target(registry).register(resource, ReconcilerOptions(**options))


def timer(
    resource: ResourceLike,
    *parts: Never,
    interval: float,
    idle: float | None = None,
    initial_delay: float | None = None,
    registry: Registry | None = None,
    **options: Any,
) -> Decorator:
    """Register a timer of ``resource``: the function is called every ``interval`` seconds for
    each object, on the one replica that owns the object's key (docs/timers.md).

    Ticks sit on a grid anchored on the object's ``creationTimestamp`` plus ``initial_delay``
    (tick ``k`` at ``anchor + k * interval``); with ``idle`` a tick waits until the object has
    not changed (``status`` aside) for ``idle`` seconds. No tick while the object is being
    deleted. The function declares the same arguments as a reconciler (``request``, ``name``,
    ``namespace``, ``client``, ``logger``, ``obj`` …) and returns None; raising retries the tick
    with backoff until the next one is due, :class:`~declop.errors.TerminalError` skips it.

    ``options``: ``name``, ``namespaces``, ``labels``, ``fields``, ``predicates``,
    ``max_concurrent``, ``priority``, ``rate_limit``, ``timeout``, ``shard_by``, ``permissions``,
    as on :func:`reconciler`; ``registry=`` as everywhere.
    """
    check_call("timer", (resource, *parts), options, ("interval", "idle", "initial_delay", *TIMER_OPTION_NAMES, "registry"))
    return _target(registry).timer(resource, interval=interval, idle=idle, initial_delay=initial_delay, **options)


def daemon(
    resource: ResourceLike,
    *parts: Never,
    name: str | None = None,
    stop_timeout: float = 10.0,
    backoff: float = 5.0,
    initial_delay: float | None = None,
    finalizer: str | bool | None = None,
    namespaces: Sequence[str] | str | None = None,
    labels: str | Mapping[str, str] | None = None,
    fields: str | None = None,
    predicates: Sequence[Any] = (),
    shard_by: str = "uid",
    max_concurrent: int = 4,
    registry: Registry | None = None,
    **unknown: Never,
) -> Decorator:
    """Run the decorated function as one long task per object of ``resource`` (docs/daemons.md).

    ``async def fn(request, name, namespace, client, logger, stop, retry, current)`` runs as an
    asyncio task per object; a plain ``def`` runs in a thread of its own and gets ``stop`` as a
    ``threading.Event``. It declares only what it needs. ``stop`` is set when it must end;
    ``current()`` returns a deep copy of the object as the cache holds it *now* (None once it is
    gone from the cache); ``retry`` counts its crashes in a row; ``client`` writes are fenced like
    a reconcile's.

    It starts when the object exists, is not being deleted and matches ``namespaces=``,
    ``labels=``, ``fields=`` (after ``initial_delay`` seconds), on the replica that owns the key;
    it is stopped — ``stop`` set, awaited up to ``stop_timeout`` seconds, then cancelled if
    ``async def`` — before the finalizer (default ``daemons.declop.dev/<name>``; ``False``: none)
    is released, when the object leaves the filter, and on handover and shutdown. A crash
    restarts it after ``backoff`` seconds (an exception's ``delay`` attribute wins); a return ends
    it until the object's generation changes."""
    check_call("daemon", (resource, *parts), unknown, DAEMON_OPTIONS)
    return _target(registry).daemon(
        resource, name=name, stop_timeout=stop_timeout, backoff=backoff, initial_delay=initial_delay,
        finalizer=finalizer, namespaces=namespaces, labels=labels, fields=fields, predicates=predicates,
        shard_by=shard_by, max_concurrent=max_concurrent,
    )  # fmt: skip


def index(
    resource: ResourceLike,
    name: str,
    fn: Callable[[Mapping[str, Any]], Iterable[str | None]],
    *,
    registry: Registry | None = None,
    **unknown: Never,
) -> None:
    """Declare a cache index: ``client.list(resource, index=(name, value))`` finds objects by it."""
    check_call("index", (resource,), unknown, ("registry",))
    _target(registry).index(resource, name, fn)


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
    check_call("transform", (resource,), unknown, ("registry",))
    reg = _target(registry)
    if fn is None:

        def decorate(f: F) -> F:
            reg.transform(resource, f)
            return f

        return decorate
    reg.transform(resource, fn)
    return fn


def _hook_decorator(kind: HookKind, fn: Any, name: str | None, registry: Registry | None, every_replica: bool = False) -> Any:
    reg = _target(registry)
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
    check_call("on_startup", (fn,), unknown, ("name", "registry"))
    return _hook_decorator("startup", fn, name, registry)


def on_shutdown(
    fn: F | None = None, *, name: str | None = None, registry: Registry | None = None, **unknown: Never
) -> Any:
    """Run ``fn`` once on a stop, after in-flight reconciles drained and background tasks ended,
    while the client still works. A failure is logged and makes the exit code 1."""
    check_call("on_shutdown", (fn,), unknown, ("name", "registry"))
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
    check_call("background", (fn,), unknown, ("name", "every_replica", "registry"))
    if not isinstance(every_replica, bool):
        raise RegistrationError(f"every_replica must be True or False, got {every_replica!r}")
    return _hook_decorator("background", fn, name, registry, every_replica)


def on_login(fn: F | None = None, *, name: str | None = None, registry: Registry | None = None, **unknown: Never) -> Any:
    """Connect with what ``fn`` returns instead of a kubeconfig (Kopf's ``@kopf.on.login``):
    a :class:`~declop.kube.login.ConnectionInfo` (or a mapping of its fields: ``server``,
    ``token`` or ``cert_data``/``key_data``, ``ca_data``, ``insecure``, ``expiration``).

    It may declare ``logger``. It is called at start, before the first request; again before
    the first request at or after its refresh time when it gave an ``expiration``; and after a
    401 (docs/lifecycle.md, "Login"). Several: the first that returns something else than None wins."""
    check_call("on_login", (fn,), unknown, ("name", "registry"))
    return _hook_decorator("login", fn, name, registry)


def on_probe(
    fn: F | None = None,
    *,
    name: str | None = None,
    timeout: float = 5.0,
    cache: float = 10.0,
    registry: Registry | None = None,
    **unknown: Never,
) -> Any:
    """Report ``fn``'s return value under ``name`` (default: the function's name) on ``/probes``
    on the health port (Kopf's ``@kopf.on.probe(id=…)``; docs/lifecycle.md, "Probes").

    It may declare ``client``, ``logger``, ``stop``; it returns a JSON value. It is called when
    ``/probes`` is asked and its last outcome is older than ``cache`` seconds, at most once at a
    time; a call longer than ``timeout`` seconds, or one that raises, reports the probe as failed
    (503, its name only: the error is logged, never served)."""
    check_call("on_probe", (fn,), unknown, ("name", "timeout", "cache", "registry"))
    reg = _target(registry)
    if fn is None:

        def decorate(f: F) -> F:
            reg.hook("probe", f, name=name, timeout=timeout, cache=cache)
            return f

        return decorate
    reg.hook("probe", fn, name=name, timeout=timeout, cache=cache)
    return fn


_ADMISSION_OPTIONS = (
    "operations", "name", "failure_policy", "timeout", "labels", "system_namespaces", "subresource", "field", "value", "when",
    "registry",
)


def _webhook_decorator(kind: WebhookKind, registry: Registry | None, resource: ResourceLike, **options: Any) -> Callable[[F], F]:
    reg = _target(registry)

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
    subresource: str | Sequence[str] | None = None,
    field: str | Sequence[str] | None = None,
    value: Any = ANY_VALUE,
    when: Callable[..., Any] | None = None,
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
    operator's own namespace stays excluded). It must be fast and free of side effects: it runs on every write, dry runs too.

    ``subresource="status"`` (or ``"scale"``, a list) makes it a webhook of that subresource
    instead of the main resource; ``"*"`` of both, ``subresource`` tells which (a ``scale``
    request's ``obj`` is an ``autoscaling/v1`` ``Scale``). ``field="spec.size"`` calls it only when that field of the
    object is present (``old_obj``'s on DELETE), ``value=`` only when it also equals the value
    (or a callable of it returns true), ``when=`` only when that function of the injectable
    arguments returns true; any other request is allowed unchanged without a call."""
    check_call("validator", (resource, *parts), unknown, _ADMISSION_OPTIONS)
    return _webhook_decorator(
        "validator", registry, resource, operations=operations, name=name,
        failure_policy=failure_policy, timeout=timeout, labels=labels, system_namespaces=system_namespaces,
        subresource=subresource, field=field, value=value, when=when,
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
    subresource: str | Sequence[str] | None = None,
    field: str | Sequence[str] | None = None,
    value: Any = ANY_VALUE,
    when: Callable[..., Any] | None = None,
    registry: Registry | None = None,
    **unknown: Never,
) -> Callable[[F], F]:
    """Register a mutating admission webhook for ``resource`` (docs/webhooks.md).

    Same arguments as :func:`validator`; ``obj`` is a deep copy the function changes in place
    (or it returns a new object). declop answers with the JSON Patch from the object as sent to
    the result, and with no patch when nothing changed. Raising
    :class:`~declop.webhooks.declaration.Rejected` denies the request."""
    check_call("mutator", (resource, *parts), unknown, _ADMISSION_OPTIONS)
    return _webhook_decorator(
        "mutator", registry, resource, operations=operations, name=name,
        failure_policy=failure_policy, timeout=timeout, labels=labels, system_namespaces=system_namespaces,
        subresource=subresource, field=field, value=value, when=when,
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
    check_call("converter", (resource, *parts), unknown, ("name", "registry"))
    return _webhook_decorator("converter", registry, resource, name=name)
