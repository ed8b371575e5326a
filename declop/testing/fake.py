"""A unit-test kit: run a reconciler against an in-memory fake apiserver, with no cluster at all.

    from declop.testing.fake import run_reconcile

    outcome = run_reconcile(widget, "default/hello", objects=[widget_obj])
    assert outcome.error is None
    assert [w.verb for w in outcome.writes] == ["create", "create", "patch_status"]
    assert run_reconcile(widget, "default/hello", client=outcome.client).writes == ()  # idempotent

:func:`run_reconcile` does what a controller worker does for one key — the same phase deduction
(:func:`declop.reconcile.result.phase_of`), the same finalizer protocol (:mod:`declop.reconcile.finalizers`, against
the fake), the same keyword injection (``Registration.wants``) and the same outcome table
(``Controller._settle``) — and returns a :class:`ReconcileOutcome`: what the handler returned or
raised, what the queue would do, every write it sent, and its log lines.

:class:`FakeClient` (and :class:`FakeAsyncClient` for ``async def`` handlers) *are* declop's
``Client``/``AsyncClient`` — the same argument conventions, because they are the same code — over a
:class:`FakeApiServer` instead of an HTTP transport. Reads come from real :class:`~declop.cache.store.Store`
objects (so registry indexes work: ``client.list(..., index=(...))``); writes go through the fake
apiserver, which applies them (create, PUT with resourceVersion checks, merge/JSON patches, the
status subresource, deletion with finalizers) and records each one as a :class:`Write`.

Differences from a real cluster, on purpose or by simplicity:

* no cache lag: a read right after a write sees it (run the reconciler twice to check it is
  idempotent, rather than relying on that);
* no garbage collector, no admission, no defaulting, no schema validation; no other controllers
  (a Deployment never gets a status unless the test writes one);
* ``strategic`` patches and ``apply`` (server-side apply) are approximated by a merge that merges
  lists of objects by ``name`` (or ``type``, ``uid``, ``containerPort``, ``port``) and replaces
  other lists; SSA field ownership is not tracked;
* resources are known from a built-in table of the common Kubernetes resources, from CRD objects
  given in ``objects``/``resources``, and guessed from the apiVersion/kind of other objects (or a
  name like ``widgets.example.com``); pass ``resources=`` for exact names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import logging
import random
import string
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Iterable, Mapping, Sequence, TypeVar

from declop.cache.store import Store, Writer, clone
from declop.reconcile.client import AsyncClient, Client, ClientContext
from declop.reconcile.controller import Controller, invalid_outcome
from declop.kube.discovery import ResourceInfo, resolve
from declop.errors import ConfigError, TerminalError
from declop.reconcile.finalizers import ensure_finalizer, release_finalizer
from declop.kube.keys import Request, key_of
from declop.logs import PlainFormatter, ReconcileLogger
from declop.reconcile.registration import Registration
from declop.registry import Registry, default_registry
from declop.reconcile.result import Phase, Result, phase_of
from declop.kube.transport import PATCH_TYPES, dumps, error_from, loads

__all__ = [
    "FakeApiServer",
    "FakeAsyncClient",
    "FakeClient",
    "ReconcileOutcome",
    "Write",
    "arun_reconcile",
    "run_reconcile",
]

T = TypeVar("T")
Obj = dict[str, Any]

# --------------------------------------------------------------------------- known resources

# group, version, plural, kind, namespaced, short names, flags: s = status subresource, g = generation
_TABLE: tuple[tuple[str, str, str, str, bool, tuple[str, ...], str], ...] = (
    ("", "v1", "pods", "Pod", True, ("po",), "sg"),
    ("", "v1", "configmaps", "ConfigMap", True, ("cm",), ""),
    ("", "v1", "secrets", "Secret", True, (), ""),
    ("", "v1", "services", "Service", True, ("svc",), "s"),
    ("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), ""),
    ("", "v1", "endpoints", "Endpoints", True, ("ep",), ""),
    ("", "v1", "events", "Event", True, ("ev",), ""),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), "s"),
    ("", "v1", "replicationcontrollers", "ReplicationController", True, ("rc",), "sg"),
    ("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), "s"),
    ("", "v1", "limitranges", "LimitRange", True, ("limits",), ""),
    ("", "v1", "podtemplates", "PodTemplate", True, (), ""),
    ("", "v1", "namespaces", "Namespace", False, ("ns",), "s"),
    ("", "v1", "nodes", "Node", False, ("no",), "s"),
    ("", "v1", "persistentvolumes", "PersistentVolume", False, ("pv",), "s"),
    ("apps", "v1", "deployments", "Deployment", True, ("deploy",), "sg"),
    ("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), "sg"),
    ("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), "sg"),
    ("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), "sg"),
    ("apps", "v1", "controllerrevisions", "ControllerRevision", True, (), ""),
    ("batch", "v1", "jobs", "Job", True, (), "sg"),
    ("batch", "v1", "cronjobs", "CronJob", True, ("cj",), "sg"),
    ("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), "sg"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), "sg"),
    ("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("ing",), "sg"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ("netpol",), "g"),
    ("networking.k8s.io", "v1", "ingressclasses", "IngressClass", False, (), ""),
    ("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, (), ""),
    ("events.k8s.io", "v1", "events", "Event", True, ("ev",), ""),
    ("coordination.k8s.io", "v1", "leases", "Lease", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, (), ""),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, (), ""),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, (), ""),
    ("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",), ""),
    ("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",), ""),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, ("crd", "crds"), "sg"),
    ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False, (), "g"),
    ("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False, (), "g"),
)


def _info(group: str, version: str, plural: str, kind: str, namespaced: bool, short: tuple[str, ...], flags: str) -> ResourceInfo:
    return ResourceInfo(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        subresources=("status",) if "s" in flags else (),
    )


_BUILTIN: tuple[ResourceInfo, ...] = tuple(_info(*row) for row in _TABLE)
_GENERATION: frozenset[str] = frozenset(
    _info(*row).group_resource for row in _TABLE if "g" in row[6]
)


def _pluralize(word: str) -> str:
    if word.endswith("y") and word[-2:-1] not in tuple("aeiou"):
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def _singularize(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    return word.removesuffix("s")


def resources_of_crd(crd: Mapping[str, Any]) -> list[ResourceInfo]:
    """The resources a CustomResourceDefinition object serves (served versions, storage first)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = sorted(
        (v for v in spec.get("versions") or () if v.get("served", True)),
        key=lambda v: not v.get("storage", False),
    )
    return [
        ResourceInfo(
            group=spec["group"],
            version=v["name"],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            singular=names.get("singular") or names["kind"].lower(),
            short_names=tuple(names.get("shortNames") or ()),
            subresources=("status",) if "status" in (v.get("subresources") or {}) else (),
        )
        for v in versions
    ]


class _Discovery:
    """What the fake apiserver serves: built-ins, CRDs given, and guesses for the rest."""

    def __init__(self, extra: Iterable[ResourceInfo | Mapping[str, Any]] = ()) -> None:
        self._resources: list[ResourceInfo] = []
        self.generation: set[str] = set(_GENERATION)
        for r in extra:
            self.add(r)
        self._resources.extend(_BUILTIN)

    def add(self, r: ResourceInfo | Mapping[str, Any]) -> None:
        infos = [r] if isinstance(r, ResourceInfo) else resources_of_crd(r)
        for info in infos:
            if info not in self._resources:
                self._resources.insert(0, info)  # given resources win over the table
            if not isinstance(r, ResourceInfo) or info.group not in {b.group for b in _BUILTIN}:
                self.generation.add(info.group_resource)  # custom resources always have a generation

    def resources(self) -> list[ResourceInfo]:
        return list(self._resources)

    def resolve_cached(self, name: str) -> ResourceInfo:
        try:
            return resolve(name, self._resources)
        except ConfigError:
            guess = self._guess(name)
            if guess is None:
                raise ConfigError(
                    f"the fake apiserver does not know {name!r}; pass resources=[ResourceInfo(...) or the CRD "
                    "object], or seed an object of that kind"
                ) from None
            self.add(guess)
            return guess

    async def resolve(self, name: str) -> ResourceInfo:
        return self.resolve_cached(name)

    @staticmethod
    def _guess(name: str) -> ResourceInfo | None:
        word, dot, rest = name.strip().lower().partition(".")
        if not dot or "." not in rest and not rest.startswith("v"):
            return None
        version, _, group = rest.partition(".")
        if not (version[:1] == "v" and version[1:2].isdigit()):
            version, group = "v1", rest
        if not group or "." not in group:
            return None
        plural = word if word.endswith("s") else _pluralize(word)
        kind = _singularize(plural).capitalize()
        return ResourceInfo(group, version, plural, kind, True, singular=kind.lower(), subresources=("status",))

    def learn(self, obj: Mapping[str, Any]) -> ResourceInfo | None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not api_version or not kind:
            return None
        group, _, version = str(api_version).rpartition("/")
        for r in self._resources:
            if r.kind == kind and r.group == group and r.version == version:
                return r
        for r in self._resources:  # another version of a known kind
            if r.kind == kind and r.group == group:
                info = dataclasses.replace(r, version=version)
                self.add(info)
                return info
        namespaced = bool((obj.get("metadata") or {}).get("namespace"))
        info = ResourceInfo(
            group, version, _pluralize(str(kind).lower()), str(kind), namespaced,
            singular=str(kind).lower(), subresources=("status",),
        )
        self.add(info)
        self.generation.add(info.group_resource)
        return info


class _Context(ClientContext):
    """A ClientContext over the fake apiserver; unknown kinds are learned, not refused."""

    def __init__(self, server: FakeApiServer) -> None:
        super().__init__(server, server.discovery, None, None, recorder=server)  # type: ignore[arg-type]

    def resolve_kind(self, obj: Mapping[str, Any]) -> ResourceInfo:
        try:
            return super().resolve_kind(obj)
        except ConfigError:
            info = self.discovery.learn(obj)  # type: ignore[attr-defined]
            if info is None:
                raise
            return info  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Write:
    """One write request the fake apiserver received.

    ``verb`` is the client method that sent it: ``create``, ``update``, ``update_status``,
    ``patch``, ``patch_status``, ``apply``, ``delete`` (or ``event`` in ``events``). ``body`` is
    what was sent (a patch for patches); ``patch_type`` is ``merge``/``json``/``strategic``/``apply``.
    """

    verb: str
    resource: str
    key: Request
    body: Any = None
    patch_type: str | None = None

    def __repr__(self) -> str:
        pt = f", {self.patch_type}" if self.patch_type and self.patch_type != "merge" else ""
        return f"Write({self.verb} {self.resource} {self.key}{pt})"


def _copy(obj: Any) -> Obj:
    """:func:`~declop.cache.store.clone` of an object dict."""
    return clone(obj)  # type: ignore[no-any-return]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _wire(body: Any) -> Any:
    """What the apiserver receives: a JSON round trip (non-JSON values fail here, as on the wire)."""
    return None if body is None else loads(dumps(body))


def _fail(status: int, reason: str, message: str, method: str, path: str, causes: list[Obj] | None = None) -> Exception:
    status_obj: Obj = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": status}
    if causes:
        status_obj["details"] = {"causes": causes}
    return error_from(status, reason, dumps(status_obj), method, path)


# --------------------------------------------------------------------------- patches


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = _merge_patch(result.get(k), v)
    return result


_MERGE_KEYS = ("name", "type", "uid", "containerPort", "port", "mountPath", "ip")


def _strategic_merge(target: Any, patch: Any) -> Any:
    """A merge that merges lists of objects by a common key (an approximation of a strategic merge)."""
    if isinstance(patch, dict):
        result = clone(target) if isinstance(target, dict) else {}
        for k, v in patch.items():
            if k.startswith("$"):
                continue
            if v is None:
                result.pop(k, None)
            else:
                result[k] = _strategic_merge(result.get(k), v)
        return result
    if isinstance(patch, list) and isinstance(target, list):
        items = [*target, *patch]
        for mk in _MERGE_KEYS:
            if items and all(isinstance(i, dict) and mk in i for i in items):
                merged = {i[mk]: clone(i) for i in target}
                for i in patch:
                    merged[i[mk]] = _strategic_merge(merged.get(i[mk]), i)
                return list(merged.values())
    return clone(patch)


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for p in parts:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc


def _json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test. Raises ValueError when an op fails."""
    doc = clone(doc)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                if _walk(doc, parts) != op.get("value"):
                    raise ValueError(f"test failed at {op['path']}")
                continue
            if kind in ("move", "copy"):
                src = _pointer(op["from"])
                value = clone(_walk(doc, src))
                if kind == "move":
                    parent = _walk(doc, src[:-1])
                    del parent[int(src[-1]) if isinstance(parent, list) else src[-1]]
                kind, op = "add", {"value": value}
            if not parts:
                if kind in ("add", "replace"):
                    doc = clone(op["value"])
                    continue
                raise ValueError("cannot remove the whole document")
            parent, last = _walk(doc, parts[:-1]), parts[-1]
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), clone(op["value"]))
                else:
                    parent[last] = clone(op["value"])
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(last)] = clone(op["value"])
                else:
                    if last not in parent:
                        raise KeyError(last)
                    parent[last] = clone(op["value"])
            else:
                raise ValueError(f"unknown op {kind!r}")
        except (KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{kind} {op.get('path')!r}: no such location ({exc})") from None
    return doc


# --------------------------------------------------------------------------- the fake apiserver


class FakeApiServer:
    """An in-memory apiserver: stores per resource, a resourceVersion counter, recorded writes.

    It is the ``transport`` (``await request(method, path, ...)``) and the event recorder of the
    fake clients; you rarely use it directly: ``FakeClient(objects).server``.
    """

    def __init__(self, resources: Iterable[ResourceInfo | Mapping[str, Any]] = ()) -> None:
        self.discovery = _Discovery(resources)
        self.context = _Context(self)
        self.writes: list[Write] = []
        self.events: list[Write] = []
        self._stores: dict[str, tuple[Store, Writer]] = {}
        self._indexes: list[tuple[str, str, Callable[[Mapping[str, Any]], Iterable[str | None]]]] = []
        self._counter = itertools.count(1)
        self._last_rv = "0"

    def _next_rv(self) -> str:
        self._last_rv = str(next(self._counter))
        return self._last_rv

    # -- stores and indexes ---------------------------------------------------------------------
    def store(self, resource: ResourceInfo | str) -> Store:
        return self._store(resource)[0]

    def _store(self, resource: ResourceInfo | str) -> tuple[Store, Writer]:
        info = resource if isinstance(resource, ResourceInfo) else self.discovery.resolve_cached(resource)
        entry = self._stores.get(info.group_resource)
        if entry is None:
            store = Store(f"{info.group_resource} (fake)")
            store.synced = True
            entry = self._stores[info.group_resource] = (store, Writer(store))
            for res, name, fn in self._indexes:
                if self._same(res, info):
                    store.add_indexer(name, fn)
        return entry

    def _same(self, name: str, info: ResourceInfo) -> bool:
        try:
            return self.discovery.resolve_cached(name).group_resource == info.group_resource
        except ConfigError:
            return False

    def add_index(self, resource: str, name: str, fn: Callable[[Mapping[str, Any]], Iterable[str | None]]) -> None:
        """``declop.index(resource, name, fn)`` for this fake: ``client.list(resource, index=(name, v))``."""
        self._indexes.append((resource, name, fn))
        for gr, (store, _w) in self._stores.items():
            if self._same(resource, self._info(gr)):
                store.add_indexer(name, fn)

    def _info(self, group_resource: str) -> ResourceInfo:
        return next(r for r in self.discovery.resources() if r.group_resource == group_resource)

    def add_registry_indexes(self, registry: Registry) -> None:
        for ix in registry.indexes:
            if not any(ix.name == n and ix.resource == r and ix.fn is f for r, n, f in self._indexes):
                self.add_index(ix.resource, ix.name, ix.fn)

    def objects(self, resource: ResourceInfo | str | None = None) -> list[Obj]:
        """Copies of every stored object (of one resource, or all)."""
        if resource is not None:
            return [clone(o) for o in self.store(resource)]
        return [clone(o) for store, _w in self._stores.values() for o in store]

    # -- seeding ------------------------------------------------------------------------------
    def seed(self, given: Mapping[str, Any]) -> Obj:
        """Put an object in the store as if it existed already (no write is recorded)."""
        obj: Obj = _wire(given)
        if not obj.get("apiVersion") or not obj.get("kind"):
            raise ValueError(f"seeded objects need apiVersion and kind: {obj.get('metadata')}")
        if obj["kind"] == "CustomResourceDefinition" and obj.get("spec", {}).get("names"):
            self.discovery.add(obj)
        info = self.context.resolve_kind(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError(f"a seeded {obj['kind']} needs metadata.name")
        if info.namespaced and not meta.get("namespace"):
            raise ValueError(f"{obj['kind']} {meta['name']} is namespaced: give metadata.namespace")
        if not info.namespaced:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = self._next_rv()
        if info.group_resource in self.discovery.generation:
            meta.setdefault("generation", 1)
        self._store(info)[1].upsert(obj)
        return _copy(obj)

    # -- the transport face -----------------------------------------------------------------------
    async def record(self, obj: Mapping[str, Any], reason: str, message: str, type: str = "Normal", **_: Any) -> None:
        """The event recorder face: ``client.event(...)`` lands in :attr:`events`."""
        meta = obj.get("metadata") or {}
        self.events.append(
            Write("event", "events", Request(meta.get("namespace") or "", meta.get("name") or ""),
                  {"reason": reason, "message": message, "type": type, "involvedObject": {
                      "kind": obj.get("kind"), "name": meta.get("name"), "uid": meta.get("uid")}})
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str | None = None,
        timeout: float = 30.0,
        lane: str = "handler",
    ) -> Any:
        """Serve one request like the apiserver would; raise the errors the transport raises."""
        info, namespace, name, sub = self._route(method, path)
        if method == "GET":
            if name is None:
                return self._list(info, namespace, params or {})
            return _copy(self._get(info, namespace, name, method, path))
        body = _wire(body)
        patch_type = next((t for t, ct in PATCH_TYPES.items() if ct == content_type), None) if method == "PATCH" else None
        verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, "patch")
        if method == "PATCH" and patch_type == "apply":
            verb = "apply"
        if sub == "status" and verb in ("update", "patch"):
            verb += "_status"
        key_name = name if name is not None else ((body or {}).get("metadata") or {}).get("name") or ""
        self.writes.append(Write(verb, info.group_resource, Request(namespace, key_name), clone(body), patch_type))
        if method == "POST":
            return self._create(info, namespace, body, method, path)
        assert name is not None, f"{method} {path}: no object name"
        if method == "PUT":
            return self._update(info, namespace, name, body, sub, method, path)
        if method == "PATCH":
            return self._patch(info, namespace, name, body, patch_type or "merge", sub, method, path)
        if method == "DELETE":
            return self._delete(info, namespace, name, method, path)
        raise _fail(405, "MethodNotAllowed", f"{method} is not supported by the fake apiserver", method, path)

    def _route(self, method: str, path: str) -> tuple[ResourceInfo, str, str | None, str | None]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts[:1] == ["api"]:
            group, rest = "", parts[2:]
        else:
            group, rest = parts[1], parts[3:]
        candidates = [r for r in self.discovery.resources() if r.group == group]
        if len(rest) >= 3 and rest[0] == "namespaces":
            found = next((r for r in candidates if r.plural == rest[2] and r.namespaced), None)
            if found is not None:
                return found, rest[1], (rest[3] if len(rest) > 3 else None), (rest[4] if len(rest) > 4 else None)
        found = next((r for r in candidates if r.plural == rest[0]), None)
        if found is None:
            raise _fail(404, "NotFound", f"the server could not find the requested resource ({path})", method, path)
        return found, "", (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)

    def _get(self, info: ResourceInfo, namespace: str, name: str, method: str, path: str) -> Obj:
        obj = self.store(info).get(Request(namespace, name))
        if obj is None:
            raise _fail(404, "NotFound", f'{info.group_resource} "{name}" not found', method, path)
        return obj

    def _list(self, info: ResourceInfo, namespace: str, params: Mapping[str, Any]) -> Obj:
        items = self.store(info).list(namespace=namespace or None, selector=params.get("labelSelector") or None)
        return {
            "apiVersion": info.api_version,
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": self._last_rv},
            "items": [clone(o) for o in items],
        }

    def _create(self, info: ResourceInfo, namespace: str, body: Any, method: str, path: str) -> Obj:
        if not isinstance(body, dict):
            raise _fail(400, "BadRequest", "the body of a create must be an object", method, path)
        obj = body
        obj.setdefault("apiVersion", info.api_version)
        obj.setdefault("kind", info.kind)
        meta = obj.setdefault("metadata", {})
        if info.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise _fail(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request", method, path)
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _fail(422, "Invalid", "metadata.name: Required value: name or generateName is required", method, path,
                            [{"field": "metadata.name", "reason": "FieldValueRequired"}])
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        key = Request(namespace if info.namespaced else "", meta["name"])
        store, writer = self._store(info)
        if store.get(key) is not None:
            raise _fail(409, "AlreadyExists", f'{info.group_resource} "{meta["name"]}" already exists', method, path)
        for f in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(f, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self._next_rv()
        if info.group_resource in self.discovery.generation:
            meta["generation"] = 1
        if "status" in info.subresources:
            obj.pop("status", None)
        writer.upsert(obj)
        return _copy(obj)

    def _keep_server_fields(self, info: ResourceInfo, stored: Obj, new: Obj, sub: str | None) -> Obj:
        if sub == "status":
            result = _copy(stored)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            return result
        meta, old_meta = new.setdefault("metadata", {}), stored["metadata"]
        for f in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "generation"):
            if f in old_meta:
                meta[f] = old_meta[f]
            else:
                meta.pop(f, None)
        new.setdefault("apiVersion", stored.get("apiVersion"))
        new.setdefault("kind", stored.get("kind"))
        if "status" in info.subresources:
            if "status" in stored:
                new["status"] = stored["status"]
            else:
                new.pop("status", None)
        return new

    def _commit(self, info: ResourceInfo, stored: Obj, new: Obj, method: str, path: str) -> Obj:
        """Store ``new`` over ``stored`` like the apiserver: no change → no new resourceVersion."""
        meta, old_meta = new["metadata"], stored["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise _fail(422, "Invalid", f"metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)}", method, path,
                            [{"field": "metadata.finalizers", "reason": "FieldValueForbidden"}])
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if "generation" in old_meta:
            spec_changed = any(new.get(k) != stored.get(k) for k in set(new) | set(stored) if k not in ("metadata", "status"))
            deleting = bool(meta.get("deletionTimestamp")) and not old_meta.get("deletionTimestamp")
            meta["generation"] = old_meta["generation"] + (1 if spec_changed or deleting else 0)
        if new == stored:
            return _copy(stored)
        meta["resourceVersion"] = self._next_rv()
        writer = self._store(info)[1]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            writer.delete(key_of(new))
        else:
            writer.upsert(new)
        return _copy(new)

    def _update(self, info: ResourceInfo, namespace: str, name: str, body: Any, sub: str | None, method: str, path: str) -> Obj:
        stored = self._get(info, namespace, name, method, path)
        meta = (body or {}).get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise _fail(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})", method, path)
        rv = meta.get("resourceVersion")
        if rv and rv != stored["metadata"].get("resourceVersion"):
            raise _fail(409, "Conflict", f'Operation cannot be fulfilled on {info.group_resource} "{name}": the object has been modified; please apply your changes to the latest version and try again', method, path)
        new = self._keep_server_fields(info, stored, body, sub)
        return self._commit(info, stored, new, method, path)

    def _patch(self, info: ResourceInfo, namespace: str, name: str, patch: Any, patch_type: str, sub: str | None, method: str, path: str) -> Obj:
        stored = self.store(info).get(Request(namespace, name))
        if stored is None:
            if patch_type == "apply" and sub is None:
                return self._create(info, namespace, patch, method, path)
            raise _fail(404, "NotFound", f'{info.group_resource} "{name}" not found', method, path)
        if patch_type == "json":
            try:
                new = _json_patch(stored, patch)
            except ValueError as exc:
                # the apiserver answers a failed `test` with a bare 422, without causes
                raise _fail(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}", method, path) from None
        else:
            if not isinstance(patch, dict):
                raise _fail(400, "BadRequest", f"a {patch_type} patch must be a JSON object", method, path)
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv and rv != stored["metadata"].get("resourceVersion"):
                raise _fail(409, "Conflict", f'Operation cannot be fulfilled on {info.group_resource} "{name}": the object has been modified; please apply your changes to the latest version and try again', method, path)
            new = (_merge_patch if patch_type == "merge" else _strategic_merge)(stored, patch)
        new = self._keep_server_fields(info, stored, new, sub)
        return self._commit(info, stored, new, method, path)

    def _delete(self, info: ResourceInfo, namespace: str, name: str, method: str, path: str) -> Obj:
        stored = self._get(info, namespace, name, method, path)
        writer = self._store(info)[1]
        if stored["metadata"].get("finalizers"):
            if stored["metadata"].get("deletionTimestamp"):
                return _copy(stored)
            new = clone(stored)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit(info, stored, new, method, path)
        writer.delete(Request(namespace, name))
        return _copy(stored)


# --------------------------------------------------------------------------- the fake clients


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (everything the fake does is immediate) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a fake client call waited for something; the fake apiserver never makes you wait")


def _setup(
    objects: Iterable[Mapping[str, Any]],
    resources: Iterable[ResourceInfo | Mapping[str, Any]],
    registry: Registry | None,
    server: FakeApiServer | None,
    primary: ResourceInfo | str | None,
    request: Request | str | None,
) -> tuple[FakeApiServer, ResourceInfo | None, Request | None]:
    if server is None:
        server = FakeApiServer(resources)
    else:
        for r in resources:
            server.discovery.add(r)
    if registry is not None:
        server.add_registry_indexes(registry)
    for obj in objects:
        server.seed(obj)
    info = server.discovery.resolve_cached(primary) if isinstance(primary, str) else primary
    req = Request.parse(request) if isinstance(request, str) else request
    return server, info, req


class _FakeStores:
    """Reads from the fake apiserver's stores: the same Store class the informers fill."""

    _ctx: ClientContext
    primary: ResourceInfo | None
    request: Request | None

    def _stores(self, resource: ResourceInfo, namespace: str) -> list[Store]:
        return [self.server.store(resource)]

    @property
    def server(self) -> FakeApiServer:
        """The fake apiserver behind this client (shared by every view of it)."""
        return self._ctx.transport  # type: ignore[return-value]

    @property
    def writes(self) -> list[Write]:
        """Every write sent so far, in order."""
        return self.server.writes

    @property
    def events(self) -> list[Write]:
        """Every ``client.event(...)`` so far."""
        return self.server.events

    def objects(self, resource: ResourceInfo | str | None = None) -> list[Obj]:
        """Copies of every stored object (of one resource, or all)."""
        return self.server.objects(resource)

    def index(self, resource: str, name: str, fn: Callable[[Mapping[str, Any]], Iterable[str | None]]) -> None:
        """Add a cache index, as ``declop.index`` does for a running operator."""
        self.server.add_index(resource, name, fn)


class FakeClient(_FakeStores, Client):
    """A :class:`declop.Client` over an in-memory apiserver, seeded with ``objects``.

    ``FakeClient([configmap, widget])`` — every method of the real client works (``get``, ``list``
    with labels and indexes, ``create``, ``update``, ``patch``, ``apply``, ``patch_status``,
    ``delete``, ``event``, ``live``); writes change the fake's objects and are recorded in
    :attr:`writes`. ``registry=`` adds that registry's ``declop.index`` declarations.
    """

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        *,
        resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
        registry: Registry | None = None,
        server: FakeApiServer | None = None,
        primary: ResourceInfo | str | None = None,
        request: Request | str | None = None,
    ) -> None:
        server, info, req = _setup(objects, resources, registry, server, primary, request)
        Client.__init__(self, server.context, info, req)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return _drive(coro)

    def bind(self, primary: ResourceInfo | str | None, request: Request | str | None) -> FakeClient:
        """A view of the same fake as a handler of ``primary`` reconciling ``request`` sees it."""
        return FakeClient(server=self.server, primary=primary, request=request)

    @property
    def aio(self) -> FakeAsyncClient:
        """The same fake as an ``async def`` handler sees it (awaitable writes)."""
        return FakeAsyncClient(server=self.server, primary=self.primary, request=self.request)


class FakeAsyncClient(_FakeStores, AsyncClient):
    """A :class:`declop.AsyncClient` over the fake apiserver: cache reads are plain, writes awaited."""

    def __init__(
        self,
        objects: Iterable[Mapping[str, Any]] = (),
        *,
        resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
        registry: Registry | None = None,
        server: FakeApiServer | None = None,
        primary: ResourceInfo | str | None = None,
        request: Request | str | None = None,
    ) -> None:
        server, info, req = _setup(objects, resources, registry, server, primary, request)
        AsyncClient.__init__(self, server.context, info, req)

    @property
    def sync(self) -> FakeClient:
        """The same fake with blocking methods, for assertions."""
        return FakeClient(server=self.server, primary=self.primary, request=self.request)


# --------------------------------------------------------------------------- run_reconcile


@dataclass(frozen=True)
class ReconcileOutcome:
    """What one reconcile did, as :func:`run_reconcile` observed it.

    ``action`` is what the controller's queue would do: ``"done"`` (forget the key),
    ``"requeue_after"``, ``"retry"`` (an exception: rate-limited retry, quietly for a Conflict) or
    ``"terminal"`` (a :class:`~declop.errors.TerminalError`: not retried).
    """

    phase: Phase
    result: Any
    error: BaseException | None
    requeue_after: float | None
    action: str
    writes: tuple[Write, ...]
    events: tuple[Write, ...]
    logs: tuple[str, ...] = field(repr=False)
    messages: tuple[str, ...]
    reconcile_id: str = field(repr=False)
    client: FakeClient = field(repr=False)

    @property
    def ok(self) -> bool:
        """True when the handler neither raised nor returned something invalid."""
        return self.error is None

    def raise_error(self) -> ReconcileOutcome:
        """Re-raise the handler's exception, if any (for a full traceback in a failing test)."""
        if self.error is not None:
            raise self.error
        return self

    def writes_of(self, verb: str | None = None, resource: str | None = None) -> list[Write]:
        """The writes with this verb and/or resource (``"deployments.apps"``)."""
        return [w for w in self.writes if (verb is None or w.verb == verb) and (resource is None or w.resource == resource)]


class _Capture(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.setFormatter(PlainFormatter())
        self.lines: list[str] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.messages.append(record.getMessage())


class _RecordingQueue:
    """Stands in for the workqueue while ``Controller._settle`` settles one outcome."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def forget(self, key: Request) -> None:
        self.calls.append(("forget", None))

    def add_after(self, key: Request, seconds: float) -> None:
        self.calls.append(("add_after", seconds))

    def add_rate_limited(self, key: Request) -> None:
        self.calls.append(("add_rate_limited", None))

    def add(self, key: Request) -> None:
        self.calls.append(("add", None))


class _NoMetrics:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


def _registration(
    handler: Callable[..., Any] | Registration,
    resource: str | None,
    finalizer: str | None,
    registry: Registry | None,
) -> tuple[Registration, Registry]:
    if isinstance(handler, Registration):
        reg, source = handler, registry or default_registry
    elif resource is not None:
        throwaway = Registry()
        throwaway.reconciler(resource, name=getattr(handler, "__name__", None) or "handler", finalizer=finalizer)(handler)
        reg, source = throwaway.registrations[0], registry or default_registry
    else:
        source = registry or default_registry
        found = [r for r in source.registrations if r.fn is handler]
        if not found:
            raise TypeError(
                f"{getattr(handler, '__name__', handler)!r} is not registered in "
                f"{'the given registry' if registry else 'the default registry'}; pass resource='widgets.example.com' "
                "(and finalizer=...), registry=, or the Registration"
            )
        if len(found) > 1:
            raise TypeError(f"{handler.__name__!r} is registered {len(found)} times; pass the Registration you mean")
        reg = found[0]
    if finalizer is not None and reg.finalizer != finalizer:
        reg = dataclasses.replace(reg, finalizer=finalizer)
    return reg, source


def _key(request: Request | str | Mapping[str, Any], info: ResourceInfo) -> Request:
    if isinstance(request, Request):
        key = request
    elif isinstance(request, str):
        key = Request.parse(request)
    else:
        key = key_of(request)
    if info.namespaced and not key.namespace:
        raise ValueError(f"{info.group_resource} is namespaced: pass the request as 'namespace/name'")
    return key if info.namespaced else Request("", key.name)


async def _reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]],
    resource: str | None,
    finalizer: str | None,
    client: FakeClient | FakeAsyncClient | None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]],
    registry: Registry | None,
    reconcile_id: str | None,
    log_level: int,
) -> ReconcileOutcome:
    reg, source = _registration(handler, resource, finalizer, registry)
    server, _, _ = _setup(objects, resources, source, client.server if client is not None else None, None, None)
    info = server.discovery.resolve_cached(reg.resource)
    key = _key(request, info)
    rid = reconcile_id or str(uuid.uuid4())

    name = f"declop.controller.{reg.name}"
    capture = _Capture(log_level)
    lg = logging.Logger(name, log_level)  # noqa: LOG001 - private: no global logging state changes
    lg.parent = logging.getLogger(name)  # …but lines still reach pytest's log capture
    lg.addHandler(capture)
    logger = ReconcileLogger(lg, {"controller": reg.name, "namespace": key.namespace, "name": key.name, "reconcileID": rid})

    first_write = len(server.writes)
    first_event = len(server.events)
    obj = server.store(info).get(key)
    phase = phase_of(obj, reg.finalizer)  # the controller's phase table
    outcome: Any = None
    error: BaseException | None = None
    try:
        if phase is Phase.CREATED and reg.finalizer is not None:
            obj = await ensure_finalizer(server, info, obj, reg.finalizer)
        view: Client | AsyncClient = (
            FakeAsyncClient(server=server, primary=info, request=key)
            if reg.is_async
            else FakeClient(server=server, primary=info, request=key)
        )
        given = obj
        if reg.metadata_only and obj is not None:  # what a metadata-only cache holds
            meta = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
            given = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
        kwargs = reg.arguments(key, given, phase, view, logger, rid)
        outcome = (await reg.fn(**kwargs)) if reg.is_async else reg.fn(**kwargs)
        if phase is Phase.DELETING and reg.finalizer is not None and (outcome is None or isinstance(outcome, Result)):
            await release_finalizer(server, info, obj, reg.finalizer)
    except Exception as exc:  # noqa: BLE001 - the outcome table handles every exception
        error = exc
    if error is None:
        error = invalid_outcome(reg.name, key, outcome)

    # the controller's own outcome table settles it, against a queue that only records
    queue = _RecordingQueue()
    stub = types.SimpleNamespace(queue=queue, metrics=_NoMetrics(), name=reg.name, _log=lg, _delayed={})
    Controller._settle(stub, key, outcome, error, logger, 0.0)  # type: ignore[arg-type]
    verbs = [c[0] for c in queue.calls]
    if "add_rate_limited" in verbs:
        action = "retry"
    elif "add_after" in verbs:
        action = "requeue_after"
    elif isinstance(error, TerminalError):
        action = "terminal"
    else:
        action = "done"
    requeue = next((c[1] for c in queue.calls if c[0] == "add_after"), None)
    return ReconcileOutcome(
        phase=phase,
        result=outcome,
        error=error,
        requeue_after=requeue,
        action=action,
        writes=tuple(server.writes[first_write:]),
        events=tuple(server.events[first_event:]),
        logs=tuple(capture.lines),
        messages=tuple(capture.messages),
        reconcile_id=rid,
        client=FakeClient(server=server, primary=info, request=key),
    )


def run_reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]] = (),
    *,
    resource: str | None = None,
    finalizer: str | None = None,
    client: FakeClient | FakeAsyncClient | None = None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
    registry: Registry | None = None,
    reconcile_id: str | None = None,
    log_level: int = logging.INFO,
) -> ReconcileOutcome:
    """Reconcile ``request`` once with ``handler``, against a fake apiserver holding ``objects``.

    ``handler`` is a function decorated with ``@declop.reconciler`` (found in ``registry``, by
    default the default registry), any function plus ``resource=`` (and ``finalizer=``), or a
    :class:`~declop.registry.Registration`. ``request`` is ``"namespace/name"``, a
    :class:`~declop.Request` or the object itself. Pass ``client=outcome.client`` to continue from a
    previous reconcile's state (its writes are not repeated in the new outcome). The registry's
    ``declop.index`` declarations are added to the fake's stores.

    ``async def`` handlers run in ``asyncio.run``; inside a running event loop use
    ``await arun_reconcile(...)``.
    """
    reg, _ = _registration(handler, resource, finalizer, registry)
    coro = _reconcile(reg, request, objects, None, None, client, resources, registry, reconcile_id, log_level)
    if not reg.is_async:
        return _drive(coro)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("run_reconcile was called inside a running event loop: use `await arun_reconcile(...)`")


async def arun_reconcile(
    handler: Callable[..., Any] | Registration,
    request: Request | str | Mapping[str, Any],
    objects: Iterable[Mapping[str, Any]] = (),
    *,
    resource: str | None = None,
    finalizer: str | None = None,
    client: FakeClient | FakeAsyncClient | None = None,
    resources: Iterable[ResourceInfo | Mapping[str, Any]] = (),
    registry: Registry | None = None,
    reconcile_id: str | None = None,
    log_level: int = logging.INFO,
) -> ReconcileOutcome:
    """:func:`run_reconcile` for async tests (runs on the current event loop)."""
    return await _reconcile(handler, request, objects, resource, finalizer, client, resources, registry, reconcile_id, log_level)
