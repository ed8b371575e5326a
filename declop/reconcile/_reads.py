"""What both client flavours share: the :class:`ClientContext` of one manager, and the base
class that reads the cache (``get``, ``list``: deep copies, no API call) and parses targets and
keys. The write methods live in :mod:`declop.reconcile.client`, side by side for the two flavours.

Typed everywhere: a target may be a typed model class (``client.get(Widget, key)``: its
resource, and the read gives the model's validated view), and an object may be a typed model
(its JSON form, :func:`declop.typed.dump.as_json`, is what is written).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Callable, Coroutine, Mapping, Sequence

from declop.cache.store import Store, clone
from declop.kube.discovery import Discovery, ResourceInfo
from declop.errors import ConfigError, NotFound
from declop.cache.informer import InformerPool
from declop.kube.keys import Request
from declop.kube.labels import Selector, parse_selector
from declop.kube.transport import Transport
from declop.typed.dump import as_json, is_model

__all__ = ["ClientContext", "KeyLike", "Obj", "Target", "DEFAULT_FIELD_MANAGER"]

Obj = dict[str, Any]
Target = str | ResourceInfo | None
KeyLike = Request | str | None

DEFAULT_FIELD_MANAGER = "declop"


class ClientContext:
    """What every client of one manager shares: transport, discovery, informers, the loop."""

    def __init__(
        self,
        transport: Transport,
        discovery: Discovery,
        informers: InformerPool,
        loop: asyncio.AbstractEventLoop,
        *,
        field_manager: str = DEFAULT_FIELD_MANAGER,
        sync_timeout: float = 120.0,
        recorder: Any = None,
    ) -> None:
        self.transport = transport
        self.discovery = discovery
        self.informers = informers
        self.loop = loop
        self.field_manager = field_manager
        self.sync_timeout = sync_timeout
        self.recorder = recorder
        #: runs a blocking client's coroutine to completion when a plain handler is called on the
        #: loop's own thread — only the simulator does that (:mod:`declop.testing.simulation.world`, so a
        #: run stays deterministic); None: such a call is a mistake and raises
        self.inline: Callable[[Coroutine[Any, Any, Any]], Any] | None = None

    def resolve(self, target: str | ResourceInfo | type) -> ResourceInfo:
        if isinstance(target, ResourceInfo):
            return target
        if _model_class(target):  # a typed model names its resource: widgets.v1.example.com
            target = target.kind_of().resource  # type: ignore[union-attr]
        return self.discovery.resolve_cached(target)

    def resolve_kind(self, obj: Mapping[str, Any] | Any) -> ResourceInfo:
        obj = as_json(obj, "identity")
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not api_version or not kind:
            raise ConfigError("the object has no apiVersion/kind; pass the resource name as well")
        if kind == "PartialObjectMetadata":
            raise ConfigError(
                "this object holds metadata only (it comes from a metadata_only cache): writing it would "
                "drop its body; patch it (client.patch(resource, key, {...})) or read it whole with "
                "client.live.get(resource, key) first"
            )
        group, _, version = api_version.rpartition("/")
        for r in self.discovery.resources():
            if r.kind == kind and r.group == group and r.version == version:
                return r
        raise ConfigError(f"no resource of kind {kind} in {api_version} is served by the apiserver")


def _model_class(target: Any) -> bool:
    """``target`` is a typed model class that names a kind (a ``CustomResource`` subclass)."""
    return isinstance(target, type) and getattr(target, "__kind__", None) is not None


def typed(target: Any, obj: Obj) -> Any:
    """``obj`` as ``target``'s validated view when ``target`` is a typed model class, else as it is."""
    if not _model_class(target):
        return obj
    from declop.typed.view import view  # pydantic is loaded: a model class exists

    return view(target, obj)


class _Base:
    """Shared reading logic and argument parsing for both client flavours."""

    def __init__(
        self,
        ctx: ClientContext,
        primary: ResourceInfo | None = None,
        request: Request | None = None,
        controller: str = "",
        own: Sequence[Store] = (),
        read: Obj | None = None,
    ) -> None:
        self._ctx = ctx
        self.primary = primary
        self.request = request
        self.controller = controller
        #: the stores of the informers whose events wake this controller (read first for its own key)
        self._own = own
        #: the object the handler was handed (a cached dict, never changed in place), then what
        #: each typed status write of it returned: the base of a typed status write to it
        self._read = read

    # -- argument parsing -------------------------------------------------------------------
    def _resource(self, target: Target) -> ResourceInfo:
        if target is None:
            if self.primary is None:
                raise ConfigError("name the resource: client.get('configmaps', key)")
            return self.primary
        return self._ctx.resolve(target)

    def _key(self, resource: ResourceInfo, key: KeyLike, namespace: str | None, name: str | None) -> Request:
        if isinstance(key, Request):
            req = key
        elif isinstance(key, str):
            req = Request.parse(key) if "/" in key else Request(namespace or "", key)
        elif name is not None:
            req = Request(namespace or "", name)
        elif self.request is not None and resource is self.primary:
            req = self.request
        else:
            raise ConfigError("which object? pass a key (Request or 'ns/name') or name=")
        if not resource.namespaced:
            return Request("", req.name)
        if not req.namespace:
            if self.request is None or not self.request.namespace:
                raise ConfigError(f"{resource.group_resource} is namespaced: give namespace= or 'ns/name'")
            return Request(self.request.namespace, req.name)
        return req

    def _split(self, target: Any, key: Any) -> tuple[Target, KeyLike]:
        # get(request) / get("ns/name") on the primary resource, or get("configmaps", key)
        if isinstance(target, Request):
            return None, target
        if key is None and isinstance(target, str) and "/" in target and self.primary is not None:
            try:
                self._ctx.resolve(target)
            except ConfigError:
                return None, target
        return target, key

    def _stores(self, resource: ResourceInfo, namespace: str) -> list[Store]:
        pool = self._ctx.informers
        informers = pool.existing(resource)
        if not informers:
            informers = self._ensure(resource)
        stores = [i.store for i in informers if not i.namespace or not namespace or i.namespace == namespace]
        if not stores:
            raise NotFound(
                f"{resource.group_resource} in namespace {namespace} is outside this operator's namespaces"
            )
        for s in stores:
            s.require_synced()
        return stores

    def _ensure(self, resource: ResourceInfo) -> list[Any]:
        raise NotImplementedError

    # -- reads: the cache, never the API ------------------------------------------------------
    def get(
        self, target: Any = None, key: KeyLike = None, *, namespace: str | None = None, name: str | None = None
    ) -> Obj:
        """A copy of the cached object; raises :class:`~declop.errors.NotFound` if it is not there.
        With a typed model class as the target (``client.get(Widget, key)``), its validated view."""
        target, key = self._split(target, key)
        resource = self._resource(target)
        req = self._key(resource, key, namespace, name)
        if resource is self.primary and req == self.request:
            for store in self._own:  # what woke this reconcile: never older than its event
                obj = store.get(req)
                if obj is not None:
                    return typed(target, obj) if _model_class(target) else clone(obj)  # type: ignore[no-any-return]
        for store in self._stores(resource, req.namespace):
            obj = store.get(req)
            if obj is not None:
                return typed(target, obj) if _model_class(target) else clone(obj)  # type: ignore[no-any-return]
        raise NotFound(f'{resource.group_resource} "{req}" not found')

    def list(
        self,
        target: Target = None,
        *,
        namespace: str | None = None,
        labels: str | Mapping[str, str] | Selector | None = None,
        index: tuple[str, str] | None = None,
    ) -> list[Obj]:
        """Copies of the cached objects, filtered by namespace, label selector and/or an index
        (the validated views, for a typed model class as the target)."""
        resource = self._resource(target)
        ns = namespace or "" if resource.namespaced else ""
        out: list[Obj] = []
        raw: list[Obj] = []  # the stores' own objects; copied (or typed) once, below
        copy = (lambda o: typed(target, o)) if _model_class(target) else clone
        for store in self._stores(resource, ns):
            raw.extend(store.list(namespace=ns or None, selector=labels, index=index))
        if resource is self.primary and self.request is not None and self._own:
            self._own_version(raw, ns, labels, index)
        out.extend(copy(o) for o in raw)
        return out

    def _own_version(self, out: list[Obj], ns: str, labels: Any, index: tuple[str, str] | None) -> None:
        """In a list of the primary resource, the reconciled object as :meth:`get` reads it: from
        the stores that woke this reconcile when they hold it (the unfiltered stores the list read
        may lag them); when they do not (it left the filter), the unfiltered stores' copy stays,
        and their catching up wakes the controller again (``Controller.unfiltered_subscriber``)."""
        req = self.request
        assert req is not None
        for store in self._own:
            mine = store.get(req)
            if mine is not None:
                break
        else:
            return
        if ns and req.namespace != ns or labels and not parse_selector(labels)(mine["metadata"].get("labels")):
            mine = None
        elif index is not None and not any(o is mine for o in store.list(index=index)):
            mine = None  # (the bucket of the index value: no longer than the list itself)
        at = next((i for i, o in enumerate(out) if o["metadata"]["name"] == req.name
                   and (o["metadata"].get("namespace") or "") == req.namespace), None)
        if mine is None:
            if at is not None:
                del out[at]
        elif at is None:
            out.append(mine)
        else:
            out[at] = mine

    # -- request building for writes -----------------------------------------------------------
    def _write_target(self, target: Any, obj: Any) -> tuple[ResourceInfo, Obj]:
        if obj is None and (isinstance(target, Mapping) or is_model(target)):
            body = dict(as_json(target, "whole"))
            return self._ctx.resolve_kind(body), body
        return self._resource(target), dict(as_json(obj, "whole"))

    def _obj_path(self, resource: ResourceInfo, obj: Mapping[str, Any], with_name: bool, sub: str | None = None) -> str:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or (self.request.namespace if self.request else "")
        if resource.namespaced and not ns:
            raise ConfigError(f"{resource.group_resource} is namespaced: set metadata.namespace")
        return resource.path(namespace=ns or None, name=meta["name"] if with_name else None, subresource=sub)

    def _status_patch(self, target: Any, key: Any, patch: Any, type: str) -> tuple[Any, Any, Any, Obj | None, bool]:
        """``patch_status``'s arguments in order, a typed status turned into its guarded JSON
        patch (:func:`declop.typed.status.status_ops`); then the object to return unsent when a
        typed status changes nothing, and whether the patch is typed (its base is the object the
        handler read when it writes that object, else the cached one)."""
        if isinstance(target, Request) or (patch is None and not isinstance(target, str)):
            target, key, patch = None, target, key
        pydantic = sys.modules.get("pydantic")  # a model exists only once pydantic is loaded
        if pydantic is None or not isinstance(patch, pydantic.BaseModel):
            return target, key, patch, None, False
        from declop.typed.status import status_ops

        if type != "merge":
            raise ValueError(f"a typed status is sent as a guarded JSON patch declop makes; drop type={type!r}")
        base = self._read if self._is_read(target, key) else None
        if base is None:
            base = self.get(target, key)
        ops = status_ops(patch, base.get("status"))
        if not ops:
            return target, key, None, clone(base), True
        return target, key, ops, None, True

    def _is_read(self, target: Any, key: Any) -> bool:
        """``target``/``key`` name the object this handler was handed."""
        if self._read is None or self.request is None:
            return False
        resource = self._resource(target)
        return resource is self.primary and self._key(resource, key, None, None) == self.request

    def _status_written(self, target: Any, key: Any, written: Any) -> None:
        """A typed status write of the handler's own object succeeded: the next one diffs
        against what it stored (not what the handler read: its own change is no conflict)."""
        if self._read is not None and isinstance(written, dict) and self._is_read(target, key):
            self._read = written

    def _with_kind(self, resource: ResourceInfo, obj: Obj) -> Obj:
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        return obj
