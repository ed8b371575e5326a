"""Registration: one reconciler as its decorator declared it, and the arguments of one call.

The controller runs a :class:`Registration`; :mod:`declop.registry` builds and validates it (a
registration that exists has passed every check there). It lives here, beside the controller,
so that the controller does not import the registry (which also knows webhooks and hooks).
The reconciler options are named, defaulted and checked once, in
:class:`declop.registry.options.ReconcilerOptions`; a Registration holds them in canonical form
under the same names (``ReconcilerOptions.settled``), with what the registry derived from the
function (``fn``, ``name``, ``is_async``, ``wants``, ``model``) and the resource.

Invariants:
- a registration is frozen: nothing changes it after the registry accepted it;
- :meth:`Registration.arguments` gives a handler only the names it declares (all of them when
  it takes ``**kwargs``), and ``obj`` is a deep copy, so no handler can change the cache;
- with ``model`` (the handler declared ``obj: Widget``), ``obj`` is the typed view instead
  (:func:`declop.typed.view.view`: validated, sharing nothing with the cache) and an object that
  fails validation raises :class:`~declop.errors.InvalidObject` before the handler is called.
  pydantic is imported only then: a registration without a model never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from declop.cache.store import clone
from declop.kube.rbac import Permission
from declop.kube.resource import Resource
from declop.queue.priority import Priority
from declop.queue.ratelimit import RateLimit
from declop.reconcile.predicates import Predicate
from declop.reconcile.trigger import NO_TRIGGER, Trigger

__all__ = ["CHANGE_NAMES", "INJECTABLE", "Registration"]

#: what a handler declares to get the change since it last succeeded (:mod:`declop.handlers.changes`
#: fills them; :meth:`Registration.arguments` never does, and ``**kwargs`` alone does not ask for them)
CHANGE_NAMES = frozenset({"old", "new", "diff"})
#: keyword arguments a handler may declare
INJECTABLE = frozenset(
    {"request", "name", "namespace", "client", "logger", "reconcile_id", "phase", "obj", "trigger", "first_seen"}
) | CHANGE_NAMES


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
    owns: tuple[Resource, ...] = ()
    watches: tuple[tuple[Resource, Callable[[Any], Any]], ...] = ()
    max_concurrent: int = 1
    is_async: bool = False
    #: the injectable names the handler declares; None when it takes **kwargs (gets them all)
    wants: frozenset[str] | None = field(default=None)
    #: queue priorities; None: a plain FIFO queue
    priority: Priority | None = field(default_factory=Priority)
    #: retry pacing; None: client-go's defaults
    rate_limit: RateLimit | None = None
    #: seconds a handler call may take (None: unlimited)
    timeout: float | None = None

    #: the primary is cached as PartialObjectMetadata (``obj`` holds metadata only)
    metadata_only: bool = False
    #: the primary's field selector (canonical form), "" for none
    fields: str = ""
    #: what a key hashes by in sharded mode (``declop run --shards N``): "uid" or "namespace"
    shard_by: str = "uid"
    #: the CustomResource subclass ``obj`` is annotated with (a typed view); None: a dict
    model: Any = None
    #: writes declop cannot infer, declared with ``permissions=`` (``declop rbac`` grants them)
    permissions: tuple[Permission, ...] = ()
    #: the handler names ``first_seen`` (``**kwargs`` alone does not give it): only then the
    #: controller keeps the keys whose call succeeded on this replica — a set as large as the
    #: cache, which a handler that never reads it does not pay for
    wants_first_seen: bool = False
    #: ``field=``: the path of the one field whose changes call the handler; () for none
    field: tuple[str, ...] = ()
    #: ``old=``/``new=``: filters on that field's value (``...``: none)
    old: Any = ...
    new: Any = ...
    #: annotations declop keeps on the primary for this registration (``declop rbac`` grants patch)
    records: tuple[str, ...] = ()
    #: ``return_to=``: the path a returned value is written to (``("status", "summary")``); () for none
    return_to: tuple[str, ...] = ()

    @property
    def wants_trigger(self) -> bool:
        """The handler declares ``trigger`` (or takes ``**kwargs``)."""
        return self.wants is None or "trigger" in self.wants


    @property
    def primary(self) -> Resource:
        """The primary resource with its cache options."""
        return Resource(self.resource, metadata_only=self.metadata_only, fields=self.fields)

    def view(self, obj: Any) -> Any:
        """``obj`` as the handler gets it: the typed view when it declared a model, else a copy.

        Raises:
            InvalidObject: the object fails the model's validation.
        """
        if obj is None:
            return None
        if self.model is None:
            return clone(obj)
        from declop.typed.view import view  # pydantic: loaded only by typed handlers

        return view(self.model, obj)

    def arguments(
        self,
        request: Any,
        obj: Any,
        phase: Any,
        client: Any,
        logger: Any,
        reconcile_id: str,
        trigger: Trigger | None = None,
        first_seen: bool = True,
    ) -> dict[str, Any]:
        """The keyword arguments for one call: only those the handler declares. ``obj`` is a
        deep copy of the cached object, or its typed view (made only when declared), so the cache
        stays intact.

        Raises:
            InvalidObject: ``obj`` fails the validation of the handler's model.
        """
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
            kwargs["obj"] = (None if obj is None else clone(obj)) if self.model is None else self.view(obj)
        if wants is None or "trigger" in wants:
            kwargs["trigger"] = trigger if trigger is not None else NO_TRIGGER
        if self.wants_first_seen:
            kwargs["first_seen"] = first_seen
        return kwargs
