"""A scriptable fake list/watch server: one resource, plain HTTP (aiohttp), on the test's loop.

It answers what an informer sends — paginated LISTs, watches, streaming lists — from a small
object store with a linear history, and lets a test script the edges a real apiserver reaches
only by chance: error statuses, expired continue tokens, 410 on connect and in-stream, ERROR
events of any code, bookmarks, the initial-events-end bookmark, idle periods, abrupt closes.

    async with ListWatchServer() as server:
        server.add("a")                                  # ADDED, resourceVersion 2
        server.script_watch(Step.error(410))             # the next watch: an in-stream 410
        server.script_list(Step.status(500))             # the next LIST: a 500
        informer = Informer(server.transport(), server.resource)
        ...
        assert server.count("list") == 2

Unscripted requests get the default behaviour:

- LIST: every object, in pages of ``limit`` with continue tokens, at the current resourceVersion;
- watch from resourceVersion R: the history after R, then live changes until the server's
  ``timeoutSeconds`` (or forever); R older than the compacted revision → an in-stream 410 ERROR;
- ``sendInitialEvents=true``: an ADDED per object, the bookmark annotated
  ``k8s.io/initial-events-end`` at the current resourceVersion, then live changes; refused with
  422 when ``streaming=False`` (an apiserver without WatchList).

A scripted watch plays its steps, then goes live (``then_live=True``) or ends normally. Every
request is recorded in :attr:`ListWatchServer.requests` with its arrival time.

Invariants: resourceVersions are increasing integers (as strings); every change is appended to
the history before any watch sees it; a scripted response is used by exactly one request.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

from declop.kube.discovery import ResourceInfo
from declop.kube.transport import Transport

__all__ = ["ListWatchServer", "Recorded", "Step"]

_ANNOTATION = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class Step:
    """One scripted action. Build with the class methods."""

    kind: str
    code: int = 0
    payload: Any = None
    seconds: float = 0.0
    retry_after: float | None = None
    message: str = "scripted"

    @classmethod
    def status(cls, code: int, reason: str = "", retry_after: float | None = None, message: str = "scripted") -> Step:
        """Answer the request itself with this HTTP status (a Status body)."""
        return cls("status", code, reason, retry_after=retry_after, message=message)

    @classmethod
    def expire_continue(cls) -> Step:
        """LIST: answer 410 Expired if the request carries a continue token, else list normally."""
        return cls("expire_continue")

    @classmethod
    def error(cls, code: int, reason: str = "", retry_after: float | None = None) -> Step:
        """Watch: an in-stream ERROR event with this code (the stream then closes)."""
        return cls("error", code, reason, retry_after=retry_after)

    @classmethod
    def event(cls, etype: str, obj: Any) -> Step:
        """Watch: send this event verbatim (any type, any object — for bad input too)."""
        return cls("event", payload={"type": etype, "object": obj})

    @classmethod
    def raw(cls, line: bytes) -> Step:
        """Watch: send these bytes as one line."""
        return cls("raw", payload=line)

    @classmethod
    def bookmark(cls, initial_end: bool = False) -> Step:
        """Watch: a BOOKMARK at the current resourceVersion (annotated initial-events-end)."""
        return cls("bookmark", payload=initial_end)

    @classmethod
    def initial_events(cls) -> Step:
        """Watch: an ADDED event per object (what a streaming list starts with)."""
        return cls("initial")

    @classmethod
    def history(cls) -> Step:
        """Watch: the history after the request's resourceVersion."""
        return cls("history")

    @classmethod
    def idle(cls, seconds: float) -> Step:
        """Watch: send nothing for this long."""
        return cls("idle", seconds=seconds)

    @classmethod
    def close(cls) -> Step:
        """Watch: end the stream normally (the chunked body is terminated)."""
        return cls("close")

    @classmethod
    def abort(cls) -> Step:
        """Watch: drop the connection mid-stream (no terminating chunk)."""
        return cls("abort")


@dataclass(frozen=True)
class Recorded:
    """One request the server received: ``verb`` is list, watch or stream (a streaming list)."""

    verb: str
    query: dict[str, str]
    at: float


@dataclass
class _Script:
    steps: tuple[Step, ...]
    then_live: bool = False


@dataclass
class _State:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    rv: int = 1
    compacted: int = 0


class ListWatchServer:
    """A fake apiserver for one namespaced resource (default: ConfigMaps in ``default``)."""

    def __init__(self, *, streaming: bool = True, namespace: str = "default") -> None:
        self.streaming = streaming
        self.namespace = namespace
        self.resource = ResourceInfo(
            group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True, verbs=("list", "watch")
        )
        self.path = self.resource.path(namespace=namespace)
        self.requests: list[Recorded] = []
        self._state = _State()
        self._lists: collections.deque[Step] = collections.deque()
        self._watches: collections.deque[_Script] = collections.deque()
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._transports: list[Transport] = []
        self.port = 0
        self._open: set[Any] = set()  # transports of watches being served
        self._expired = 0  # bumped by compact(): live watches end with a 410
        #: while set, every request (list or watch) is answered with this status
        self.failing: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> ListWatchServer:
        app = web.Application()
        app.router.add_get(self.path, self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        for transport in self._transports:
            await transport.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def transport(self, **kw: Any) -> Transport:
        """A declop Transport to this server (closed with the server); ``kw`` as for Transport."""

        class _Config:
            host = self.url
            ssl_ca_cert = cert_file = key_file = None
            verify_ssl = False

            @staticmethod
            def auth_settings() -> dict[str, Any]:
                return {}

        kw.setdefault("qps", 1000.0)
        kw.setdefault("burst", 1000)
        transport = Transport(_Config(), **kw)
        self._transports.append(transport)
        return transport

    # -- the data -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        return str(self._state.rv)

    def objects(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(json.dumps(v)) for k, v in self._state.objects.items()}

    def _change(self, etype: str, obj: dict[str, Any]) -> dict[str, Any]:
        st = self._state
        st.rv += 1
        obj["metadata"]["resourceVersion"] = str(st.rv)
        if etype == "DELETED":
            st.objects.pop(obj["metadata"]["name"], None)
        else:
            st.objects[obj["metadata"]["name"]] = obj
        st.history.append((st.rv, etype, json.loads(json.dumps(obj))))
        asyncio.get_running_loop().create_task(self._notify())
        return obj

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def add(self, name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}"},
            "data": dict(data or {}),
        }
        return self._change("ADDED", obj)

    def modify(self, name: str, data: dict[str, str]) -> dict[str, Any]:
        obj = json.loads(json.dumps(self._state.objects[name]))
        obj["data"] = dict(data)
        return self._change("MODIFIED", obj)

    def delete(self, name: str) -> dict[str, Any]:
        return self._change("DELETED", json.loads(json.dumps(self._state.objects[name])))

    def compact(self) -> None:
        """Forget the history: watches from an older resourceVersion get a 410, and so do the
        watches open now (an in-stream ERROR), as when etcd compacts past a lagging watcher."""
        self._state.compacted = self._state.rv
        self._state.history.clear()
        self._expired += 1
        asyncio.get_running_loop().create_task(self._notify())

    def cut(self) -> int:
        """Drop every open watch connection mid-stream (no terminating chunk); returns how many."""
        cut = list(self._open)
        for transport in cut:
            transport.abort()
        return len(cut)

    # -- scripts --------------------------------------------------------------------------------

    def script_list(self, *steps: Step) -> None:
        """The next LIST requests get these answers, one step each."""
        self._lists.extend(steps)

    def script_watch(self, *steps: Step, then_live: bool = False) -> None:
        """The next watch request (plain or streaming) plays these steps."""
        self._watches.append(_Script(tuple(steps), then_live))

    def count(self, verb: str) -> int:
        return sum(1 for r in self.requests if r.verb == verb)

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        watch = query.get("watch") in ("1", "true")
        verb = ("stream" if query.get("sendInitialEvents") == "true" else "watch") if watch else "list"
        self.requests.append(Recorded(verb, query, time.monotonic()))
        if self.failing is not None:
            return _status(self.failing, "InternalError", "scripted outage")
        if not watch:
            return self._list(query, self._lists.popleft() if self._lists else None)
        if verb == "stream" and not self.streaming:
            return _status(422, "Invalid", "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled")
        script = self._watches.popleft() if self._watches else None
        if script is not None and script.steps and script.steps[0].kind == "status":
            step = script.steps[0]
            return _status(step.code, step.payload or "", step.message, step.retry_after)
        assert request.transport is not None
        self._open.add(request.transport)
        try:
            return await self._watch(request, query, script)
        finally:
            self._open.discard(request.transport)

    def _list(self, query: dict[str, str], step: Step | None) -> web.Response:
        if step is not None and step.kind == "status":
            return _status(step.code, step.payload or "", step.message, step.retry_after)
        if step is not None and step.kind == "expire_continue" and query.get("continue"):
            return _status(410, "Expired", "The provided continue parameter is too old")
        items = sorted(self._state.objects.values(), key=lambda o: o["metadata"]["name"])
        items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": self.resource_version}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
            items = items[start : start + limit]
        else:
            items = items[start:]
        body = {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": items}
        return web.json_response(body)

    async def _watch(self, request: web.Request, query: dict[str, str], script: _Script | None) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        streaming = query.get("sendInitialEvents") == "true"
        expired = self._expired
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1e9)
        since = int(query.get("resourceVersion") or 0) if not streaming else self._state.rv
        if script is None:
            steps: tuple[Step, ...] = (
                (Step.initial_events(), Step.bookmark(initial_end=True)) if streaming else (Step.history(),)
            )
            script = _Script(steps, then_live=True)
        if not streaming and since and since < self._state.compacted:
            script = _Script((Step.error(410, "Expired"),))
        for step in script.steps:
            if step.kind == "history":
                since = await self._send_history(resp, since)
            elif step.kind == "initial":
                for obj in sorted(self._state.objects.values(), key=lambda o: o["metadata"]["name"]):
                    await _send(resp, {"type": "ADDED", "object": obj})
                since = self._state.rv
            elif step.kind == "bookmark":
                meta: dict[str, Any] = {"resourceVersion": self.resource_version}
                if step.payload:
                    meta["annotations"] = {_ANNOTATION: "true"}
                await _send(resp, {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}})
                since = max(since, self._state.rv)
            elif step.kind == "event":
                await _send(resp, step.payload)
            elif step.kind == "raw":
                await resp.write(step.payload + b"\n")
            elif step.kind == "error":
                status = _status_body(step.code, step.payload or "", "scripted error")
                if step.retry_after is not None:
                    status["details"] = {"retryAfterSeconds": step.retry_after}
                await _send(resp, {"type": "ERROR", "object": status})
                return await _finish(resp)
            elif step.kind == "idle":
                await asyncio.sleep(step.seconds)
            elif step.kind == "close":
                return await _finish(resp)
            elif step.kind == "abort":
                assert request.transport is not None
                request.transport.abort()
                return resp
        if not script.then_live:
            return await _finish(resp)
        while time.monotonic() < deadline:
            if self._state.rv <= since and self._state.compacted <= since and self._expired == expired:
                async with self._changed:  # woken by a change; a short timeout covers a missed wake-up
                    try:
                        await asyncio.wait_for(self._changed.wait(), timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    except asyncio.TimeoutError:
                        continue
            if self._state.compacted > since or self._expired != expired:
                await _send(resp, {"type": "ERROR", "object": _status_body(410, "Expired", "too old resource version")})
                return await _finish(resp)
            since = await self._send_history(resp, since)
        return await _finish(resp)

    async def _send_history(self, resp: web.StreamResponse, since: int) -> int:
        for rv, etype, obj in list(self._state.history):
            if rv > since:
                await _send(resp, {"type": etype, "object": obj})
                since = rv
        return since


async def _send(resp: web.StreamResponse, event: Any) -> None:
    await resp.write(json.dumps(event).encode() + b"\n")


async def _finish(resp: web.StreamResponse) -> web.StreamResponse:
    await resp.write_eof()
    return resp


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _status(code: int, reason: str, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else None
    return web.json_response(_status_body(code, reason, message), status=code, headers=headers)
