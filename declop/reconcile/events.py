"""Events: a rate-limited recorder of Kubernetes Events (``events.k8s.io/v1``) for handlers.

``client.event(obj, "Scaled", "Scaled to 3 replicas")`` records an Event about ``obj`` — the
object as read: a dict, or a typed model (``obj: Widget``), named by its JSON identity
(:func:`declop.typed.dump.as_json`).

The unit-test kit's fake apiserver (:mod:`declop.testing.fakes.apiserver`) records Events through
this same recorder, so what is sent, folded, dropped or only logged is the same in a unit test
as in a cluster.

Invariants:
- recording never fails a reconcile: API errors are logged as warnings and dropped — except
  :class:`~declop.errors.Fenced` (the Event was not sent because the call's Lease is not known
  valid, :mod:`declop.kube.fencing`), which ends the call like any of its writes;
- a hot loop cannot flood the apiserver: each object has a token bucket (burst 25, one token
  every 5 minutes — client-go's spam filter); past it, Events are dropped and counted;
- repeats of the same (object, type, reason, note) within 10 minutes update the existing
  Event's ``series`` (count, lastObservedTime) instead of creating new ones — at most one such
  update every 10 seconds per Event, the rest are folded into the next update's count;
- ``reportingController`` is ``declop.io/<controller>`` made a qualified name (what the
  apiserver requires: at most 63 characters, starting and ending with a letter or digit).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from declop.clock import MONOTONIC, Clock
from declop.errors import Fenced, NotFound
from declop.typed.dump import as_json

__all__ = ["EventRecorder", "reporting_controller"]

log = logging.getLogger("declop.events")

SERIES_WINDOW = 600.0
SERIES_MIN_INTERVAL = 10.0
PATH = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"


def reporting_controller(controller: str) -> str:
    """``declop.io/<controller>`` as a qualified name: characters other than letters, digits,
    ``-``, ``_`` and ``.`` become ``-``, the name is cut to 63 and trimmed to start and end with
    a letter or digit (``declop.io/declop`` when nothing is left)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", controller)[:63]
    name = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", name)
    return f"declop.io/{name or 'declop'}"


def _micro_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(slots=True)
class _Seen:
    name: str
    namespace: str
    first: float
    last_sent: float
    count: int = 1
    pending: int = 0
    series: bool = field(default=False)


class EventRecorder:
    """Records Events for one manager; ``controller`` names the reporter."""

    def __init__(self, transport: Any, *, reporter: str = "declop", burst: int = 25, refill_seconds: float = 300.0, clock: Clock = MONOTONIC) -> None:
        self.transport = transport
        self.reporter = reporter
        self.instance = f"{reporter}-{os.environ.get('HOSTNAME') or socket.gethostname()}"[:128]
        self._burst, self._qps = burst, 1.0 / refill_seconds
        self._buckets: dict[str, tuple[float, float]] = {}
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}
        self.clock = clock
        self.dropped = 0

    def _allow(self, uid: str) -> bool:
        """Take a token from ``uid``'s bucket if one is there (a denied call takes nothing)."""
        now = self.clock()
        tokens, last = self._buckets.get(uid, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - last) * self._qps)
        if len(self._buckets) > 4096 and uid not in self._buckets:
            self._buckets.clear()
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - 1.0, now)
        return True

    async def record(
        self, obj: Mapping[str, Any] | Any, reason: str, message: str, type: str = "Normal", *, controller: str = ""
    ) -> None:
        """Record (or count a repeat of) an Event about ``obj`` (a dict or a typed model). Never
        raises, but :class:`~declop.errors.Fenced` for a call whose Lease is not known valid and
        ``ValueError`` for a ``type`` Kubernetes refuses (a mistake in the code, not a failure to
        record: the handler is told, in unit tests too)."""
        if type not in ("Normal", "Warning"):
            raise ValueError(f"event type must be 'Normal' or 'Warning', got {type!r}")
        try:
            await self._record(obj, reason, message, type, controller)
        except Fenced:
            raise  # the call's Lease is gone: the call ends, like any of its writes
        except Exception as exc:  # noqa: BLE001 - events are best effort
            log.warning("Could not record event", extra={"kv": {"reason": reason, "error": str(exc)}})

    async def _record(self, obj: Any, reason: str, message: str, type: str, controller: str) -> None:
        obj = as_json(obj, "identity")
        meta = obj.get("metadata") or {}
        uid = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
        namespace = meta.get("namespace") or "default"
        note = message[:1024]
        key = (uid, type, reason, note)
        now, wall = self.clock(), time.time()
        seen = self._seen.get(key)
        if seen is not None and now - seen.first < SERIES_WINDOW:
            seen.pending += 1
            if now - seen.last_sent < SERIES_MIN_INTERVAL:
                return
            seen.count += seen.pending
            seen.pending = 0
            seen.last_sent = now
            patch = {"series": {"count": seen.count, "lastObservedTime": _micro_time(wall)}}
            try:
                await self.transport.request(
                    "PATCH",
                    PATH.format(namespace=seen.namespace) + "/" + seen.name,
                    body=patch,
                    content_type="application/merge-patch+json",
                )
                return
            except NotFound:
                del self._seen[key]  # expired on the server: record anew
        if not self._allow(uid):
            self.dropped += 1
            return
        name = f"{meta.get('name', 'object')}.{time.time_ns():x}"[:253]
        reporter = reporting_controller(controller or self.reporter)
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": _micro_time(wall),
            "reportingController": reporter,
            "reportingInstance": self.instance,
            "action": "Reconcile",
            "reason": reason[:128],
            "type": type,
            "note": note,
            "regarding": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
        }
        await self.transport.request("POST", PATH.format(namespace=namespace), body=body)
        if len(self._seen) > 4096:
            self._seen.clear()
        self._seen[key] = _Seen(name=name, namespace=namespace, first=now, last_sent=now)
