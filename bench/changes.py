"""What field changes cost per call (issue 40 item 4): the wrapper around a handler that declares
``old``/``new``/``diff`` or has ``field=`` (declop/handlers/changes.py), without the API call.

Per call, each the median of ``--repeats`` timings (CPU time of the process) of ``--number`` calls,
on a Deployment-sized object (a spec of ~40 values, labels, annotations, a status):

- ``plain``: a handler that asks for none of it: not wrapped, so this is the handler alone;
- ``field, unchanged``: ``field="spec.replicas"``, the snapshot equal to the state — the wrapper
  decides not to call (every resync and every change elsewhere in the object);
- ``field, changed``: the field differs — the handler is called with old/new/diff and the
  snapshot patch is sent (to a stub that answers at once: the API round trip is not counted);
- ``whole, unchanged`` / ``whole, changed``: no ``field=``, old/new/diff of the whole essence.

    python bench/changes.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Any

from declop.kube.keys import Request
from declop.reconcile.result import Phase
from declop.registry import Registry

KEY = Request("bench", "obj-1")


def obj(replicas: int, snapshot: str | None, name: str) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": f"registry.example/app:{i}", "ports": [{"containerPort": 8080 + i}],
                   "env": [{"name": "MODE", "value": "fast"}], "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
                  for i in range(3)]  # fmt: skip
    annotations = {"team": "core", "deployment.kubernetes.io/revision": "3"}
    if snapshot is not None:
        annotations[f"last-handled.declop.dev/{name}"] = snapshot
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "obj-1", "namespace": "bench", "uid": "u-1", "resourceVersion": "100",
                     "labels": {"app": "a", "tier": "web"}, "annotations": annotations},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "a"}},
                 "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": containers}}},
        "status": {"replicas": replicas, "readyReplicas": replicas},
    }  # fmt: skip


class Stub:
    """A client whose patch answers at once."""

    def patch(self, resource: str, key: Any, body: Any) -> Any:
        return {"metadata": {"resourceVersion": "1"}}  # not newer than the copy: no stale-copy memo kept


def per_call_us(fn: Any, number: int, repeats: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeats, timer=time.process_time)
    return statistics.median(times) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=11)
    args = ap.parse_args()
    reg = Registry()

    @reg.reconciler("deployments.apps", name="plain")
    def plain(obj: Any) -> None: ...

    @reg.reconciler("deployments.apps", name="field", field="spec.replicas")
    def field(old: Any, new: Any, diff: Any) -> None: ...

    @reg.reconciler("deployments.apps", name="whole")
    def whole(old: Any, new: Any, diff: Any) -> None: ...

    runs = {r.name: r.fn for r in reg.registrations}
    assert runs["plain"] is plain
    from declop.handlers.changes import essence

    whole_snapshot = json.dumps(essence(obj(3, None, "whole")), separators=(",", ":"), sort_keys=True)
    cases = {
        "plain": (runs["plain"], obj(3, None, "plain"), False),
        "field, unchanged": (runs["field"], obj(3, '{"spec":{"replicas":3}}', "field"), False),
        "field, changed": (runs["field"], obj(4, '{"spec":{"replicas":3}}', "field"), True),
        "whole, unchanged": (runs["whole"], obj(3, whole_snapshot, "whole"), False),
        "whole, changed": (runs["whole"], obj(4, whole_snapshot, "whole"), True),
    }
    client = Stub()
    print(f"{'case':<18} {'µs per call':>12}")
    for label, (fn, o, _) in cases.items():
        kwargs = {"obj": o} if fn is plain else {"request": KEY, "obj": o, "client": client, "phase": Phase.UPDATED}
        # a new request each call would grow the stale-copy memo; this key's entry is replaced each time
        print(f"{label:<18} {per_call_us(lambda: fn(**kwargs), args.number, args.repeats):>12.2f}")


if __name__ == "__main__":
    main()
