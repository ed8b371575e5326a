"""@declop.on_probe against a real kube-apiserver: the values on /probes on the health port,
cached per probe, a probe that raises named (503) without its error's text, /healthz untouched."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import declop
from declop.manager import Options
from declop.testing.cluster.process import free_ports


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_probe_values_are_served_cached_and_a_failure_is_only_named(kubeconfig, namespace):
    registry = declop.registry.Registry()
    counted: list[int] = []

    @registry.reconciler("configmaps")
    def noop(**_):
        pass

    @declop.on_probe(name="count", cache=60, registry=registry)
    def count():
        counted.append(1)
        return len(counted)

    @declop.on_probe(registry=registry)
    async def cached_objects(client):
        return len(client.list("configmaps", namespace=namespace))  # a cache read

    @declop.on_probe(registry=registry)
    def broken():
        raise RuntimeError("password=hunter2 refused")

    (port,) = free_ports(1)
    options = Options(namespaces=(namespace,), grace_period=5, health_port=port, bind_address="127.0.0.1")
    with declop.Operator(registry, kubeconfig=kubeconfig, options=options):
        status, text = get(f"http://127.0.0.1:{port}/probes")
        body = json.loads(text)
        assert status == 503
        assert body == {"probes": {"count": 1, "cached_objects": body["probes"]["cached_objects"]}, "failed": ["broken"]}
        assert isinstance(body["probes"]["cached_objects"], int)
        assert "hunter2" not in text and "RuntimeError" not in text

        status, text = get(f"http://127.0.0.1:{port}/probes")
        assert json.loads(text)["probes"]["count"] == 1 and counted == [1]  # within its 60 s cache

        assert get(f"http://127.0.0.1:{port}/healthz") == (200, "ok")  # liveness runs no user code
