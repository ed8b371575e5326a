"""return_to= on a real apiserver (issue 41, Kopf's "return value to status"): the returned value
lands at its path of the status through the status subresource, only when it differs, beside the
status fields a handler writes itself, and a converged object costs no further write."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.cluster.runner import OperatorRunner, wait_for

pytestmark = pytest.mark.integration

CRD = Path(__file__).resolve().parents[2] / "examples" / "kopf" / "crd.yaml"
GROUP, VERSION, PLURAL = "kopf.dev", "v1", "kopfexamples"


@pytest.fixture(scope="module")
def kopf_crd(control_plane: Any) -> None:
    env = control_plane.env()
    subprocess.run(["kubectl", "apply", "-f", str(CRD)], env=env, check=True, capture_output=True)
    subprocess.run(["kubectl", "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev"], env=env, check=True, capture_output=True)


def test_the_return_value_goes_to_the_status_beside_the_handlers_own_status_and_converges(
    control_plane: Any, kopf_crd: None, kubeconfig: str, namespace: str
) -> None:
    registry = declop.registry.Registry()
    calls: list[tuple[Any, Any]] = []  # (labels, the summary the call read)

    @declop.reconciler("kopfexamples.kopf.dev", registry=registry, return_to=True)
    def summarize(request: declop.Request, obj: Any, client: declop.Client, **_: Any) -> dict[str, Any]:
        calls.append((obj["metadata"].get("labels"), (obj.get("status") or {}).get("summarize")))
        if (obj.get("status") or {}).get("seen") != "yes":  # a status field of the handler's own
            client.patch_status("kopfexamples.kopf.dev", request, {"status": {"seen": "yes"}})
        return {"size": obj["spec"]["size"], "double": 2 * obj["spec"]["size"]}

    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())

    def status() -> dict[str, Any]:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "one").get("status") or {}

    with OperatorRunner(registry, kubeconfig=kubeconfig, options=Options(namespaces=(namespace,), grace_period=5)) as op:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, {"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": "one"}, "spec": {"size": 2}}
        )
        wait_for(lambda: status() == {"seen": "yes", "summarize": {"size": 2, "double": 4}}, 20, what="both status fields")
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "one", {"spec": {"size": 3}})
        wait_for(lambda: status().get("summarize") == {"size": 3, "double": 6}, 20, what="the new summary")
        assert status()["seen"] == "yes"  # never clobbered by the return value's write
        final = {"size": 3, "double": 6}
        wait_for(lambda: calls[-1][1] == final, 20, what="a call that read the summary it returns")
        patches = op.statistics().by_verb.get("patch", 0)  # from here on every call reads it
        assert patches >= 3  # seen, the first summary, the second (the counter counts them)
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "one", {"metadata": {"labels": {"touched": "yes"}}})
        wait_for(lambda: calls[-1][0] == {"touched": "yes"}, 20, what="a call for the label change")
        assert calls[-1][1] == final
        assert op.statistics().by_verb.get("patch", 0) == patches  # the same summary: no write
