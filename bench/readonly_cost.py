"""What guarding the cache from predicates and map functions costs per event (issue 10, item 8).

Compares, per event (old + new object), a user predicate and a user map function called with
the cache's objects (unsafe), with read-only views (declop.cache.store.readonly, what declop does) and
with deep copies (declop.clone). Objects: the benchmark's 6 KB ConfigMap and a Deployment as
kube-apiserver returns it (managedFields stripped, like the cache).

    python bench/readonly_cost.py
"""

from __future__ import annotations

import os
import timeit
from typing import Any

from declop.cache.store import clone, readonly

CONFIGMAP = {
    "apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "obj-1", "namespace": "bench", "uid": "0b7b0b7b-0b7b-0b7b-0b7b-0b7b0b7b0b7b",
                 "resourceVersion": "123456", "creationTimestamp": "2026-11-30T00:00:00Z",
                 "labels": {"app": "bench"}, "annotations": {"bench/seq": "1", "bench/ts": "123"}},
    "data": {f"k{i}": os.urandom(500).hex() for i in range(6)},
}

CONTAINER = {
    "name": "web", "image": "registry.k8s.io/nginx:1.27", "imagePullPolicy": "IfNotPresent",
    "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
    "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(8)],
    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 80, "scheme": "HTTP"}, "periodSeconds": 10,
                       "failureThreshold": 3, "successThreshold": 1, "timeoutSeconds": 1},
    "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
}
DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "default", "uid": "6f1c2a9e-0000-4000-8000-000000000001",
                 "resourceVersion": "98765", "generation": 4, "creationTimestamp": "2026-11-30T00:00:00Z",
                 "labels": {"app": "web", "tier": "frontend"},
                 "annotations": {"deployment.kubernetes.io/revision": "3"}},
    "spec": {"replicas": 3, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
             "selector": {"matchLabels": {"app": "web"}},
             "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
             "template": {"metadata": {"labels": {"app": "web", "tier": "frontend"}},
                          "spec": {"containers": [CONTAINER, {**CONTAINER, "name": "sidecar"}],
                                   "volumes": [{"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}}],
                                   "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
                                   "terminationGracePeriodSeconds": 30, "securityContext": {}}}},
    "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3,
               "conditions": [{"type": t, "status": "True", "reason": "R", "message": "m" * 60,
                               "lastUpdateTime": "2026-11-30T00:00:00Z", "lastTransitionTime": "2026-11-30T00:00:00Z"}
                              for t in ("Available", "Progressing")]},
}


def replicas_changed(old: Any, new: Any) -> bool:  # the predicate of docs/predicates.md
    return old is None or new is None or old["spec"].get("replicas") != new["spec"].get("replicas")


def config_of(obj: Any) -> list[str]:  # a typical map function: names from the pod template
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [f"{obj['metadata']['namespace']}/{v['configMap']['name']}" for v in spec.get("volumes", ()) if "configMap" in v]


def per_event(guard: Any, obj: Any, number: int) -> float:
    def event() -> None:
        o, n = guard(obj), guard(obj)
        replicas_changed(o, n) if "spec" in obj else None
        config_of(o)
        config_of(n)

    return timeit.timeit(event, number=number) / number * 1e6


def main() -> None:
    print("µs per event (old + new): one user predicate + one user map function on both objects")
    print(f"{'object':<12}{'size':>8}{'unsafe':>10}{'readonly':>10}{'clone':>10}")
    for name, obj in (("ConfigMap", CONFIGMAP), ("Deployment", DEPLOYMENT)):
        import json

        size = len(json.dumps(obj))
        row = [min(per_event(g, obj, 50_000) for _ in range(5)) for g in (lambda o: o, readonly, clone)]
        print(f"{name:<12}{size:>8}{row[0]:>10.2f}{row[1]:>10.2f}{row[2]:>10.2f}")


if __name__ == "__main__":
    main()
