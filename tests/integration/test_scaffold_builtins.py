"""``declop new``'s offline list of built-in resource names (declop.dev.scaffold.BUILTIN_RESOURCES)
holds every name the real apiserver serves for its built-in groups — plural, singular and short
names — so a Kubernetes upgrade that adds a resource fails here instead of letting the scaffold
make a kind kubectl cannot reach; and kubectl does pick the built-in for a clashing plural."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from declop.dev.scaffold import BUILTIN_RESOURCES

pytestmark = pytest.mark.integration


def served(control_plane: Any) -> dict[str, tuple[str, tuple[str, ...]]]:
    """group-resource → (singular, short names), from the apiserver's discovery (every version)."""
    kubectl, env = control_plane.binary("kubectl"), control_plane.env()

    def get(path: str) -> Any:
        return json.loads(subprocess.run([kubectl, "get", "--raw", path], env=env, check=True, capture_output=True, text=True).stdout)

    paths = ["/api/v1"]
    for group in get("/apis")["groups"]:
        paths += [f"/apis/{v['groupVersion']}" for v in group["versions"]]
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for path in paths:
        listing = get(path)
        group = listing["groupVersion"].rpartition("/")[0]
        for r in listing["resources"]:
            if "/" in r["name"]:
                continue  # a subresource
            out[f"{r['name']}.{group}" if group else r["name"]] = (r.get("singularName") or r["kind"].lower(), tuple(r.get("shortNames") or ()))
    return out


def test_every_built_in_resource_name_is_in_the_offline_list(control_plane: Any) -> None:
    builtin = {gr: names for gr, names in served(control_plane).items() if "." not in gr or gr.endswith(
        (".k8s.io", ".apps", ".batch", ".autoscaling", ".policy"))}  # fmt: skip
    assert len(builtin) > 50 and {"pods", "cronjobs.batch", "deployments.apps"} <= set(builtin)
    missing = {gr: names for gr, names in builtin.items() if BUILTIN_RESOURCES.get(gr) != names}
    assert missing == {}, f"add to declop/dev/scaffold.py BUILTIN_RESOURCES: {missing}"


def test_kubectl_lists_the_built_in_for_a_custom_resource_with_a_built_in_plural(control_plane: Any, namespace: str) -> None:
    """Why declop new refuses such a plural: with a CRD serving cronjobs.example.com, `kubectl
    get cronjobs` still answers for batch's CronJobs."""
    kubectl, env = control_plane.binary("kubectl"), control_plane.env()
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "cronjobs.clash.example.com"},
        "spec": {"group": "clash.example.com", "scope": "Namespaced",
                 "names": {"plural": "cronjobs", "singular": "cronjob", "kind": "CronJob", "listKind": "CronJobList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }  # fmt: skip
    try:
        subprocess.run([kubectl, "apply", "-f", "-"], input=yaml.safe_dump(crd), text=True, env=env, check=True, capture_output=True)
        subprocess.run([kubectl, "wait", "--for=condition=Established", "crd/cronjobs.clash.example.com", "--timeout=30s"],
                       env=env, check=True, capture_output=True)  # fmt: skip
        mine = {"apiVersion": "clash.example.com/v1", "kind": "CronJob", "metadata": {"name": "mine", "namespace": namespace}}
        subprocess.run([kubectl, "apply", "-f", "-"], input=yaml.safe_dump(mine), text=True, env=env, check=True, capture_output=True)
        short = subprocess.run([kubectl, "get", "cronjobs", "-n", namespace, "-o", "name"], env=env, check=True, capture_output=True, text=True)
        full = subprocess.run([kubectl, "get", "cronjobs.clash.example.com", "-n", namespace, "-o", "name"],
                              env=env, check=True, capture_output=True, text=True)  # fmt: skip
        assert short.stdout.strip() == ""  # batch's CronJobs: none in this namespace
        assert full.stdout.strip() == "cronjob.clash.example.com/mine"
    finally:
        subprocess.run([kubectl, "delete", "crd", "cronjobs.clash.example.com", "--ignore-not-found"], env=env, capture_output=True)
