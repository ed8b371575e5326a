"""Field selectors and cache transforms against a real kube-apiserver: only objects matching the
selector reach the cache and the handler; a selector the apiserver does not support for the
resource fails the start with one line; a transform replaces the default managedFields stripping."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorProcess, OperatorRunner, wait_for


def make_pod(api: Any, namespace: str, name: str, node: str) -> None:
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,  # bound already: nothing schedules it, and no node runs it
            "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "example.invalid/none:1"}],
        },
    }

    def create() -> bool | None:
        try:
            kubernetes.client.CoreV1Api(api).create_namespaced_pod(namespace, body)
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status == 403 and "serviceaccount" in str(exc.body).lower():
                return None  # the controller-manager has not made the namespace's default one yet
            raise

    wait_for(create, 30, what=f"pod {name} created")


def test_only_pods_on_the_selected_node_reach_the_cache_and_the_handler(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    calls: list[str] = []
    lock = threading.Lock()

    @registry.reconciler("pods", fields="spec.nodeName=node-a")
    def on_node(name, **_):
        with lock:
            calls.append(name)

    make_pod(k8s_api, namespace, "listed-a", "node-a")
    make_pod(k8s_api, namespace, "listed-b", "node-b")
    options = Options(namespaces=(namespace,), grace_period=5)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options) as op:
        make_pod(k8s_api, namespace, "watched-b", "node-b")
        make_pod(k8s_api, namespace, "watched-a", "node-a")
        wait_for(lambda: "watched-a" in calls, 10, what="the watched pod on node-a")
        (informer,) = op.manager.informers
        assert informer.field_selector == "spec.nodeName=node-a"
        assert sorted(o["metadata"]["name"] for o in informer.store) == ["listed-a", "watched-a"]
        # the pod on node-b was created before watched-a: had the watch sent it, it came first
        assert sorted(set(calls)) == ["listed-a", "watched-a"]


def test_an_unsupported_field_selector_fails_the_start_with_one_line(kubeconfig, namespace):
    registry = declop.registry.Registry()

    @registry.reconciler("configmaps", fields="data.colour=blue")
    def handle(**_):
        pass

    runner = OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,)))
    with pytest.raises(declop.errors.ConfigError) as err:
        runner.start()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("controller 'handle': field selector 'data.colour=blue' is not supported for configmaps (")
    # the apiserver's own words name the fields it supports
    assert '("data.colour" is not a known field selector: only "metadata.name", "metadata.namespace")' in message
    assert message.endswith("select on a field the apiserver supports for it, or drop fields= and filter with a predicate")
    assert runner.manager.informers is not None and not any(i._task for i in runner.manager.informers)


def test_the_cli_prints_the_unsupported_selector_and_exits_1(control_plane, namespace, tmp_path):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(
        "import declop\n\n"
        "@declop.reconciler('pods', fields='spec.colour=blue')\n"
        "def handle(**_):\n    pass\n"
    )
    op = OperatorProcess([str(handlers), "-n", namespace], env=control_plane.env())
    op.start()
    assert op.proc.wait(60) == 1
    wait_for(lambda: op.stderr, 5)
    assert op.stderr[-1].startswith(
        "declop: error: controller 'handle': field selector 'spec.colour=blue' is not supported for pods ("
    ), op.stderr
    assert not any("Traceback" in line for line in op.stderr)


def test_a_transform_replaces_the_default_before_the_cache(kubeconfig, k8s_api, namespace):
    registry = declop.registry.Registry()
    seen: dict[str, Any] = {}

    def keep_size_only(obj: dict) -> dict:
        data = obj.pop("data", None) or {}
        obj.setdefault("metadata", {}).setdefault("annotations", {})["example.com/data-bytes"] = str(
            sum(len(v) for v in data.values())
        )
        return obj  # managedFields kept: this transform replaces the default

    registry.transform("configmaps", keep_size_only)

    @registry.reconciler("configmaps")
    def handle(request, obj, **_):
        seen[request.name] = obj

    kubernetes.client.CoreV1Api(k8s_api).create_namespaced_config_map(
        namespace, {"metadata": {"name": "big"}, "data": {"a": "x" * 1000, "b": "y" * 24}}
    )
    options = Options(namespaces=(namespace,), grace_period=5)
    with OperatorRunner(registry, kubeconfig=kubeconfig, options=options):
        obj = wait_for(lambda: seen.get("big"), 10, what="the reconcile of big")
        assert "data" not in obj
        assert obj["metadata"]["annotations"]["example.com/data-bytes"] == "1024"
        assert obj["metadata"]["managedFields"], "the user's transform replaced the default stripping"
