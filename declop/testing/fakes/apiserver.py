"""The fake apiserver of :mod:`declop.testing.fakes.client`: objects in memory, every write recorded.

Owns :class:`FakeApiServer` (the ``transport`` and event recorder of the fake clients), the
:class:`Write` records it keeps, and the merge, strategic-merge (approximated) and JSON patches
it applies.

Invariants:
- every write request is recorded as one :class:`Write`, in order, before it is served (a refused
  one too); a refusal (404, 409, 422 …) raises the :class:`~declop.errors.ApiError` the real
  transport raises; a write under a closed fence (:mod:`declop.kube.fencing`) is not recorded;
- a write of an Event (``events.k8s.io`` or core) goes to :attr:`FakeApiServer.events`, not
  ``writes``: a new one as ``Write("event", …)`` keyed by the object it is about, a repeat
  folded into its series as the ``patch`` it is. ``client.event(...)`` reaches them through
  the real :class:`~declop.reconcile.events.EventRecorder` (:attr:`FakeApiServer.recorder`,
  on a :class:`~declop.clock.FakeClock` that moves only when a test advances it), and a new
  events.k8s.io/v1 Event is validated as the apiserver validates it: one it refuses is a 422
  (which the recorder logs, as in a cluster) and is not in ``events``;
- a request body goes through a JSON round trip, as on the wire: one that is not JSON fails here;
- objects live in real :class:`~declop.cache.store.Store` objects (so registry indexes work) and
  take their resourceVersion from one counter; a write naming a stale one is a 409 Conflict, a
  write that changes nothing keeps it;
- deleting an object with finalizers only sets its ``deletionTimestamp``; it goes once the last
  finalizer is removed;
- nothing ever waits: every call completes at once — except :meth:`FakeApiServer.watch`, a watch
  stream, which waits for changes;
- a LIST and a watch honour ``labelSelector`` and ``fieldSelector`` (the field labels each
  resource serves, :meth:`~declop.testing.fakes.resources.FakeDiscovery.field_labels`; another is a
  400); a selected watch sends ADDED when a change moves an object into its selectors and
  DELETED — the object as it was, at the change's resourceVersion — when one moves it out, as
  the apiserver's watch cache does;
- every change (an object added, modified or deleted — a deletion takes a new resourceVersion)
  is appended to a bounded history before any watch sees it; a watch from a resourceVersion
  older than the history (:meth:`FakeApiServer.compact`, or more than ``history`` changes ago)
  ends with an in-stream 410 ERROR event, and a LIST continue token that old is a 410 too.
"""

# size: the whole fake apiserver — objects, patches, lists and watches with their history — in one
# module, as the one thing both the fake clients and the simulator talk to.

from __future__ import annotations

import asyncio
import bisect
import datetime
import itertools
import random
import re
import string
import uuid
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Callable, Iterable, Mapping, Sequence

from declop.cache.store import Store, Writer, clone
from declop.clock import FakeClock
from declop.errors import ConfigError
from declop.kube.discovery import ResourceInfo
from declop.kube.fencing import check
from declop.kube.fields import FieldSelector, parse_fields
from declop.kube.keys import Request, key_of
from declop.kube.labels import Selector, parse_selector
from declop.kube.transport import PATCH_TYPES, dumps, error_from, loads
from declop.leases.hashing import fnv1a64
from declop.reconcile.client import ClientContext
from declop.reconcile.events import EventRecorder
from declop.registry import Registry
from declop.testing.fakes.resources import FakeDiscovery

__all__ = ["FakeApiServer", "Write"]

Obj = dict[str, Any]

class _Context(ClientContext):
    """A ClientContext over the fake apiserver; unknown kinds are learned, not refused."""

    def __init__(self, server: FakeApiServer) -> None:
        super().__init__(server, server.discovery, None, None, recorder=server.recorder)  # type: ignore[arg-type]

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

    ``verb`` is the client method that sent it: ``create``, ``update``, ``patch``,
    ``patch_status``, ``apply``, ``delete`` (or ``event`` in ``events``), and ``update_status``
    for ``update(obj, subresource="status")``. ``body`` is
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
    """What the apiserver receives: a JSON round trip (non-JSON values fail here, as on the wire);
    a body sent already encoded (bytes) is decoded."""
    if isinstance(body, (bytes, bytearray)):
        return loads(body)
    return None if body is None else loads(dumps(body))


def _fail(status: int, reason: str, message: str, method: str, path: str, causes: list[Obj] | None = None) -> Exception:
    status_obj: Obj = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": status}
    if causes:
        status_obj["details"] = {"causes": causes}
    return error_from(status, reason, dumps(status_obj), method, path)


_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def event_refusals(event: Mapping[str, Any], namespace: str) -> list[str]:
    """Why the apiserver refuses to create this events.k8s.io/v1 Event in ``namespace`` (empty:
    it accepts it) — kubernetes' ``ValidateEventCreate`` for that version, field by field."""
    out: list[str] = []
    name = (event.get("metadata") or {}).get("name") or ""
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        out.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain is required")
    if not event.get("eventTime"):
        out.append("eventTime: Required value")
    if event.get("type") not in ("Normal", "Warning"):
        out.append(f"type: Invalid value: \"\": has invalid value: {event.get('type') or ''}")
    regarding = event.get("regarding") or {}
    if not regarding.get("namespace") and namespace not in ("default", "kube-system"):
        out.append(f"involvedObject.namespace: Invalid value: \"\": does not match event.namespace")
    for field, limit in (("reportingController", 0), ("reportingInstance", 128), ("action", 128), ("reason", 128)):
        value = event.get(field) or ""
        if not value:
            out.append(f"{field}: Required value")
        elif limit and len(value) > limit:
            out.append(f"{field}: Invalid value: \"\": can have at most {limit} characters")
    controller = event.get("reportingController") or ""
    if controller and (not _QUALIFIED_NAME.match(controller) or len(controller.rpartition("/")[2]) > 63):
        out.append(f"reportingController: Invalid value: {controller!r}: must be a qualified name")
    if len(event.get("note") or "") > 1024:
        out.append("message: Invalid value: \"\": can have at most 1024 characters")
    return out


def _sort_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


_SHARD_RANGE = re.compile(r"shardRange\(object\.metadata\.(uid|namespace),\s*'0x([0-9a-fA-F]+)',\s*'0x([0-9a-fA-F]+)'\)")


def _shard_match(selector: str | None) -> Callable[[Mapping[str, Any]], bool] | None:
    """The objects a ``shardSelector`` selects (``shardRange(object.metadata.uid, '0x…', '0x…')``
    terms joined by ``||``), hashed with FNV-1a 64 like the apiserver; None: no selector."""
    if not selector:
        return None
    terms = [(field, int(lo, 16), int(hi, 16)) for field, lo, hi in _SHARD_RANGE.findall(selector)]

    def match(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return any(lo <= fnv1a64(meta.get(field) or "") < hi for field, lo, hi in terms)

    return match


def _selected(
    selector: Selector | None, fields: FieldSelector | None, shard: Callable[[Mapping[str, Any]], bool] | None, obj: Mapping[str, Any]
) -> bool:
    """Does a watch with this label selector (field selector, shard selector) select ``obj``?"""
    if selector is not None and not selector((obj.get("metadata") or {}).get("labels")):
        return False
    if fields is not None and not fields(obj):
        return False
    return shard is None or shard(obj)


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


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as the apiserver's ``test`` has it: objects key by key (in any order), arrays
    item by item, and a scalar by the bytes of its JSON as Go writes it (``1`` is not ``1.0``,
    and ``true`` is not ``1``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    from declop.typed.status import encode  # pydantic: loaded by a test of typed writes only

    return encode(a) == encode(b)


def _json_patch(doc: Any, ops: Sequence[Mapping[str, Any]]) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test. Raises ValueError when an op fails."""
    doc = clone(doc)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":  # as the apiserver's: a missing key tests as null, its parent must exist
                parent = _walk(doc, parts[:-1]) if parts else None
                if parts and isinstance(parent, dict) and parts[-1] not in parent:
                    found = None
                else:
                    found = _walk(doc, parts)
                if not _json_equal(found, op.get("value")):
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

    def __init__(self, resources: Iterable[ResourceInfo | Mapping[str, Any]] = (), *, history: int = 10_000) -> None:
        self.discovery = FakeDiscovery(resources)
        #: the clock of :attr:`recorder`'s spam filter and series folding: it moves only when a
        #: test advances it (``fake.server.clock.advance(11)``)
        self.clock = FakeClock()
        #: ``client.event(...)``'s recorder: the real one, sending to this fake
        self.recorder = EventRecorder(self, clock=self.clock)
        self.context = _Context(self)
        self.writes: list[Write] = []
        #: record every write in :attr:`writes` (False: a long simulation that never reads them
        #: keeps neither the list nor the copy of each body)
        self.record_writes = True
        self.events: list[Write] = []
        self._stores: dict[str, tuple[Store, Writer]] = {}
        self._indexes: list[tuple[str, str, Callable[[Mapping[str, Any]], Iterable[str | None]]]] = []
        self._counter = itertools.count(1)
        self._last_rv = "0"
        #: how many changes the watch history keeps (older resourceVersions are "too old": 410;
        #: 0: none — no watch or continue token from before the latest change is served)
        self.history = history
        # the changes, oldest first: (resourceVersion, group_resource, event type, object, the
        # object before a MODIFIED — what a label- or field-selected watch needs)
        self._changes: list[tuple[int, str, str, Obj, Obj | None]] = []
        self._change_rvs: list[int] = []
        self._compacted = 0  # resourceVersions up to this one are gone from the history
        self._changed: asyncio.Event | None = None  # set (and replaced) at every change
        #: seconds of quiet after which a watch sends a BOOKMARK (the apiserver's is ~1 minute)
        self.bookmark_interval = 30.0
        #: serve ``shardSelector`` on LIST and watch, as an apiserver with the ShardedListAndWatch
        #: gate (v1.36+) does: filtered answers, and ``metadata.shardInfo`` on a LIST; False: the
        #: parameter is ignored, as before the gate (a sharded informer then filters client-side)
        self.shard_selectors = False

    def _next_rv(self) -> str:
        self._last_rv = str(next(self._counter))
        return self._last_rv

    def _record_change(self, info: ResourceInfo, etype: str, obj: Obj, before: Obj | None = None) -> None:
        """Append one change to the watch history (bounded) and wake the watches. ``before``: the
        object a MODIFIED replaced (a filtered watch sends ADDED or DELETED when the change moved
        it into or out of its selectors, :meth:`watch`)."""
        rv = int(obj["metadata"]["resourceVersion"])
        if self.history <= 0:  # what the trimming below would leave, without copying the object
            self._compacted = rv
            self._changes.clear()
            self._change_rvs.clear()
        else:  # ``before`` left the store: never changed again, kept as it is (no copy)
            self._changes.append((rv, info.group_resource, etype, _copy(obj), before))
            self._change_rvs.append(rv)
        if len(self._changes) > self.history:
            drop = len(self._changes) - self.history // 2
            self._compacted = self._change_rvs[drop - 1]
            del self._changes[:drop], self._change_rvs[:drop]
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def compact(self) -> None:
        """Forget the whole history (etcd compaction): watches and continue tokens from any
        resourceVersion before now get 410."""
        self._compacted = int(self._last_rv)
        self._changes.clear()
        self._change_rvs.clear()
        if self._changed is not None:
            self._changed.set()
            self._changed = None

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
        self._record_change(info, "ADDED", obj)
        return _copy(obj)

    # -- the transport face -----------------------------------------------------------------------
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
        check(method, path)  # the write fence, as the transport: a fenced write is never sent
        body = _wire(body)
        patch_type = next((t for t, ct in PATCH_TYPES.items() if ct == content_type), None) if method == "PATCH" else None
        verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, "patch")
        if method == "PATCH" and patch_type == "apply":
            verb = "apply"
        if sub == "status" and verb in ("update", "patch"):
            verb += "_status"
        key_name = name if name is not None else ((body or {}).get("metadata") or {}).get("name") or ""
        if info.kind == "Event" and info.group in ("", "events.k8s.io"):
            return self._event(info, namespace, name, body, verb, patch_type, method, path)
        if self.record_writes:
            self.writes.append(Write(verb, info.group_resource, Request(namespace, key_name), clone(body), patch_type))
        if method == "POST":
            return self._create(info, namespace, body, method, path)
        assert name is not None, f"{method} {path}: no object name"
        if method == "PUT":
            return self._update(info, namespace, name, body, sub, method, path)
        if method == "PATCH":
            return self._patch(info, namespace, name, body, patch_type or "merge", sub, method, path)
        if method == "DELETE":
            return self._delete(info, namespace, name, body or {}, method, path)
        raise _fail(405, "MethodNotAllowed", f"{method} is not supported by the fake apiserver", method, path)

    def _event(self, info: ResourceInfo, namespace: str, name: str | None, body: Any, verb: str,
               patch_type: str | None, method: str, path: str) -> Any:
        """A write of an Event: recorded in :attr:`events`; a new events.k8s.io one validated first."""
        if method == "POST":
            refusals = event_refusals(body or {}, namespace) if info.group == "events.k8s.io" else []
            if refusals:  # not in events: what the apiserver refuses was never recorded
                raise _fail(422, "Invalid", f'Event "{((body or {}).get("metadata") or {}).get("name")}" is invalid: '
                            + ", ".join(refusals), method, path)
            sent = clone(body)
            created = self._create(info, namespace, body, method, path)
            regarding = (sent or {}).get("regarding") or (sent or {}).get("involvedObject") or {}
            if self.record_writes:
                self.events.append(Write("event", info.group_resource,
                                         Request(regarding.get("namespace") or "", regarding.get("name") or ""), sent))
            return created
        if self.record_writes:
            self.events.append(Write(verb, info.group_resource, Request(namespace, name or ""), clone(body), patch_type))
        assert name is not None, f"{method} {path}: no object name"
        if method == "PUT":
            return self._update(info, namespace, name, body, None, method, path)
        if method == "PATCH":
            return self._patch(info, namespace, name, body, patch_type or "merge", None, method, path)
        return self._delete(info, namespace, name, body or {}, method, path)

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
        """Every object, or a page of ``limit`` with a ``continue`` token. A later page lists the
        objects after the token's key as they are *now* (not as of the first page): a watch from
        the list's resourceVersion replays what changed meanwhile, so an informer ends up right.
        A token older than the history is a 410."""
        items = self.store(info).list(namespace=namespace or None, selector=params.get("labelSelector") or None)
        fields = self._field_selector(info, params, namespace)
        shard = _shard_match(params.get("shardSelector")) if self.shard_selectors else None
        if shard is not None or fields is not None:
            items = [o for o in items if _selected(None, fields, shard, o)]
        rv = self._last_rv
        token = params.get("continue")
        if token:
            rv, _, after = str(token).partition("|")
            if int(rv) < self._compacted:
                path = info.path(namespace=namespace or None)
                raise _fail(410, "Expired", "The provided continue parameter is too old to display a consistent list result.", "GET", path)
            items = [o for o in items if _sort_key(o) > tuple(after.split("/", 1))]
        items = sorted(items, key=_sort_key)
        meta: Obj = {"resourceVersion": rv}
        if shard is not None:
            meta["shardInfo"] = {"selector": params.get("shardSelector")}
        limit = int(params.get("limit") or 0)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = f"{rv}|{'/'.join(_sort_key(items[-1]))}"
        return {"apiVersion": info.api_version, "kind": f"{info.kind}List", "metadata": meta, "items": [clone(o) for o in items]}

    def _field_selector(self, info: ResourceInfo, params: Mapping[str, Any], namespace: str) -> FieldSelector | None:
        """The ``fieldSelector`` of a LIST or watch, each label read at the path the resource
        serves it from (None: no selector); a malformed one, or a label the resource does not
        serve, is the apiserver's 400 (:meth:`~declop.testing.fakes.resources.FakeDiscovery.field_labels`)."""
        text = params.get("fieldSelector")
        if not text:
            return None
        path = info.path(namespace=namespace or None)
        try:
            fields = parse_fields(text)
        except ValueError as exc:
            raise _fail(400, "BadRequest", str(exc), "GET", path) from None
        served, own = self.discovery.field_labels(info)
        if served is None:
            return fields
        terms = []
        for parts, equal, value in fields.terms:
            label = ".".join(parts)
            if label not in served:
                why = (f"field label not supported: {label}" if own else
                       f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"')
                raise _fail(400, "BadRequest", why, "GET", path)
            terms.append((tuple(served[label].split(".")), equal, value))
        return FieldSelector(tuple(terms))

    # -- watches ----------------------------------------------------------------------------------
    async def watch(self, path: str, params: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        """A watch stream, as JSON lines: from ``resourceVersion`` (the history after it, then live
        changes), or with ``sendInitialEvents=true`` an ADDED per object and the BOOKMARK
        annotated ``k8s.io/initial-events-end`` first; BOOKMARKs after
        :attr:`bookmark_interval` of quiet (``allowWatchBookmarks``); an in-stream 410 ERROR when
        the resourceVersion is older than the history. Ends after ``timeoutSeconds``."""
        info, namespace, _name, _sub = self._route("GET", path)
        loop = asyncio.get_running_loop()
        ends = loop.time() + float(params.get("timeoutSeconds") or 1800)
        selector = parse_selector(params.get("labelSelector")) or None
        fields = self._field_selector(info, params, namespace)
        bookmarks = str(params.get("allowWatchBookmarks")).lower() == "true"
        gr = info.group_resource
        shard = _shard_match(params.get("shardSelector")) if self.shard_selectors else None

        def line(etype: str, obj: Obj) -> bytes:
            return dumps({"type": etype, "object": obj})

        def bookmark(rv: str, initial_end: bool = False) -> bytes:
            meta: Obj = {"resourceVersion": rv}
            if initial_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return line("BOOKMARK", {"kind": info.kind, "apiVersion": info.api_version, "metadata": meta})

        if str(params.get("sendInitialEvents")).lower() == "true":
            last = int(self._last_rv)
            for obj in sorted(self.store(info).list(namespace=namespace or None, selector=selector), key=_sort_key):
                if _selected(None, fields, shard, obj):
                    yield line("ADDED", obj)
            yield bookmark(str(last), initial_end=True)
        else:
            last = int(params.get("resourceVersion") or self._last_rv)
        while True:
            if last < self._compacted:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                          "message": f"too old resource version: {last} ({self._compacted})"}
                yield line("ERROR", status)
                return
            at = bisect.bisect_right(self._change_rvs, last)
            pending = self._changes[at:]
            if pending:
                for rv, res, etype, obj, before in pending:
                    last = rv
                    if res != gr:
                        continue
                    meta = obj["metadata"]
                    if namespace and meta.get("namespace") != namespace:
                        continue
                    if _selected(selector, fields, shard, obj):
                        if before is not None and not _selected(selector, fields, shard, before):
                            etype = "ADDED"  # it starts to match: new to this watch
                        yield line(etype, obj)
                    elif before is not None and _selected(selector, fields, shard, before):
                        # it stops matching: the apiserver sends DELETED with the object as it
                        # was (still matching), at the change's resourceVersion
                        gone = _copy(before)
                        gone["metadata"]["resourceVersion"] = meta["resourceVersion"]
                        yield line("DELETED", gone)
                continue
            now = loop.time()
            if now >= ends:
                return
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), min(ends - now, self.bookmark_interval))
            except asyncio.TimeoutError:
                if bookmarks and loop.time() < ends:
                    yield bookmark(str(max(last, self._compacted)))

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
        self._record_change(info, "ADDED", obj)
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
            self._record_change(info, "DELETED", new)
        else:
            writer.upsert(new)
            self._record_change(info, "MODIFIED", new, stored)
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

    def _delete(self, info: ResourceInfo, namespace: str, name: str, options: Obj, method: str, path: str) -> Obj:
        stored = self._get(info, namespace, name, method, path)
        writer = self._store(info)[1]
        if stored["metadata"].get("finalizers"):
            if stored["metadata"].get("deletionTimestamp"):
                return _copy(stored)
            new = clone(stored)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = options.get("gracePeriodSeconds") or 0
            return self._commit(info, stored, new, method, path)
        writer.delete(Request(namespace, name))
        gone = _copy(stored)
        gone["metadata"]["resourceVersion"] = self._next_rv()  # a deletion is a change: a new RV
        self._record_change(info, "DELETED", gone)
        return _copy(stored)
