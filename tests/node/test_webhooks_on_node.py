"""The chart with ``webhooks.enabled`` on a real node: admission through the chart's Service.

What only a running Pod shows, and what ``tests/integration/test_chart.py`` (no kubelet, no
kube-proxy) cannot: the kube-apiserver calls the operator's validator at the Service's ClusterIP
(``clientConfig.service``, routed by the node's kube-proxy rules to a Ready Pod), trusts it
through the CA the operator generated and keeps in its Secret, gets the validator's message
back, and keeps being answered when either replica goes away. The seed's example runs in the
same Pods, so webhooks and reconcilers share one process as in production.

Marked ``node`` (tests/node/conftest.py): run by ``make node``, never by ``make test-fast``.
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

from declop.testing import ControlPlane, wait_for
from declop.testing.cluster.image import BuiltImage
from test_chart_on_node import (  # tests/node is on sys.path (pytest's rootdir-relative import)
    PODS,
    assert_seed_lines,
    helm,
    image_values,
    kubectl_json,
    pods_of,
    release_namespace,  # noqa: F401 (the fixture)
    seed_scenario,
    sh,
)

#: the objects under test carry this label; the validator's objectSelector matches only them,
#: so that nothing else in the cluster waits on this webhook
LABEL = "webhook-test=yes"

VALIDATOR = '''
import declop


@declop.validator("configmaps", operations=("CREATE", "UPDATE"), labels="webhook-test=yes", timeout=5)
def size_limit(obj, dry_run, logger, **_):
    size = int((obj.get("data") or {}).get("size", "0"))
    logger.info("checked", configmap=obj["metadata"].get("name"), size=size, dry_run=dry_run)
    if size > 10:
        raise declop.Rejected("must be at most 10", field="data.size")
'''


def values_for(image: BuiltImage, replicas: int) -> dict[str, Any]:
    return {
        **image_values(image),
        "replicaCount": replicas,
        "handlers": {"files": {"pods.py": PODS.read_text(), "validator.py": VALIDATOR}},
        "rbac": {"watch": [{"group": "", "resource": "pods"}]},
        "webhooks": {"enabled": True},
    }


def create_configmap(cp: ControlPlane, namespace: str, name: str, size: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create configmap`` with the test label, through admission; never raises."""
    manifest = (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        f"  labels: {{webhook-test: \"yes\"}}\ndata:\n  size: \"{size}\"\n"
    )
    return subprocess.run(
        ["kubectl", "create", "-f", "-", *extra], input=manifest, env=cp.env(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def registered(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    """The ValidatingWebhookConfiguration once the operator has registered it with a caBundle."""
    found = subprocess.run(
        ["kubectl", "get", "validatingwebhookconfiguration", name, "-o", "json"],
        env=cp.env(), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if found.returncode != 0:
        return None
    config: dict[str, Any] = json.loads(found.stdout)
    hooks = config.get("webhooks") or []
    return config if hooks and hooks[0]["clientConfig"].get("caBundle") else None


def all_logs(cp: ControlPlane, namespace: str, release: str) -> str:
    return sh(cp, "kubectl", "logs", "-n", namespace, "-l", f"app.kubernetes.io/instance={release}",
              "--prefix", "--tail=-1")  # fmt: skip


def test_admission_through_the_charts_service_beside_the_seed_example(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str  # noqa: F811
) -> None:
    namespace, release = release_namespace, "guard"
    helm(cluster, "install", release, namespace, values_for(declop_image_built, replicas=1))
    name = f"{namespace}-{release}-declop"  # <namespace>-<fullname>: the chart's DECLOP_WEBHOOK_NAME
    config = wait_for(lambda: registered(cluster, name), timeout=60, what=f"the operator to register {name}")
    (hook,) = config["webhooks"]
    # the service form of the client config, the chart's Service and port
    service = hook["clientConfig"]["service"]
    assert (service["namespace"], service["name"], service["port"]) == (namespace, f"{release}-declop-webhook", 443)
    assert "url" not in hook["clientConfig"]
    assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 5
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    # the operator's own namespace and the system namespaces are never sent for admission
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "kube-public", "kube-node-lease", namespace]} in (
        hook["namespaceSelector"]["matchExpressions"]
    )
    # the caBundle is the CA the operator keeps in its Secret (what every replica signs with)
    secret = kubectl_json(cluster, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == base64.b64decode(secret["data"]["ca.crt"])

    # through the Service: kube-apiserver → ClusterIP → kube-proxy → the Pod's webhook port
    sh(cluster, "kubectl", "create", "namespace", f"{namespace}-objs")
    objs = f"{namespace}-objs"
    try:
        # registered is not reachable yet: the Service has an endpoint once the Pod is Ready and
        # kube-proxy has synced (until then the apiserver gets "connection refused" and, with
        # failurePolicy Fail, refuses the write — the first-install window of any webhook)
        sh(cluster, "kubectl", "rollout", "status", f"deployment/{release}-declop", "-n", namespace, "--timeout=120s")
        probes = iter(range(1000))
        wait_for(
            lambda: "denied the request" in create_configmap(cluster, objs, f"probe-{next(probes)}", 11).stderr,
            timeout=60, interval=0.5, what="the validator to answer through the Service",
        )  # fmt: skip
        denied = create_configmap(cluster, objs, "big", 11)
        assert denied.returncode != 0
        assert 'admission webhook "' in denied.stderr and "denied the request: data.size: must be at most 10" in denied.stderr, denied.stderr
        admitted = create_configmap(cluster, objs, "small", 3)
        assert admitted.returncode == 0, admitted.stderr
        dry = create_configmap(cluster, objs, "dry", 4, "--dry-run=server")
        assert dry.returncode == 0, dry.stderr
        logs = all_logs(cluster, namespace, release)
        assert '"configmap": "dry"' in logs and '"dry_run": true' in logs, logs[-3000:]
        assert '"configmap": "small"' in logs and '"dry_run": false' in logs, logs[-3000:]
        # a ConfigMap without the label is not sent at all (objectSelector)
        sh(cluster, "kubectl", "create", "configmap", "unlabelled", "-n", objs, "--from-literal=size=99")
        assert "unlabelled" not in all_logs(cluster, namespace, release)
        # and the operator's own namespace is admitted without asking
        assert create_configmap(cluster, namespace, "own", 99).returncode == 0
    finally:
        sh(cluster, "kubectl", "delete", "namespace", objs, "--wait=false", check=False)

    # the reconciler of the same process still does the seed's job
    assert_seed_lines(seed_scenario(cluster, namespace, release))


def test_either_replica_answers_through_the_service(
    cluster: ControlPlane, declop_image_built: BuiltImage, release_namespace: str  # noqa: F811
) -> None:
    """Two replicas, one CA (the Secret): whichever Pod the Service picks, the apiserver trusts it.
    Each Pod in turn is deleted; admission keeps working through the other (and the replacement,
    which loads the same CA instead of making one)."""
    namespace, release = release_namespace, "pair"
    helm(cluster, "install", release, namespace, values_for(declop_image_built, replicas=2))
    name = f"{namespace}-{release}-declop"
    wait_for(lambda: registered(cluster, name), timeout=60, what=f"the operator to register {name}")
    objs = f"{namespace}-objs"
    sh(cluster, "kubectl", "create", "namespace", objs)
    try:
        first = {p["metadata"]["name"] for p in pods_of(cluster, namespace, release)}
        assert len(first) == 2
        ca_uid = kubectl_json(cluster, "get", "secret", f"{name}-webhook-ca", "-n", namespace)["metadata"]["uid"]
        counter = iter(range(1000))

        answers: list[str] = []

        def denied_by_the_validator() -> bool:
            result = create_configmap(cluster, objs, f"big-{next(counter)}", 11)
            answers.append(result.stderr or result.stdout)
            return result.returncode != 0 and "data.size: must be at most 10" in result.stderr

        sh(cluster, "kubectl", "rollout", "status", f"deployment/{release}-declop", "-n", namespace, "--timeout=120s")
        # the first-install window: Ready Pods, then endpoints, then kube-proxy's rules
        wait_for(denied_by_the_validator, timeout=60, interval=0.5, what="the validator to answer through the Service")
        for pod in sorted(first):
            sh(cluster, "kubectl", "delete", "pod", pod, "-n", namespace, "--wait=false")
            # the other replica answers; the apiserver may need a moment to drop the endpoint
            wait_for(denied_by_the_validator, timeout=30, interval=0.5, what=f"a denial with {pod} gone")
            sh(cluster, "kubectl", "rollout", "status", f"deployment/{release}-declop", "-n", namespace, "--timeout=120s")
        # one CA all along: the Secret was created once, and the caBundle still matches it
        secret = kubectl_json(cluster, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
        config = registered(cluster, name)
        assert config is not None
        assert base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]) == base64.b64decode(secret["data"]["ca.crt"])
        assert secret["metadata"]["uid"] == ca_uid, "the replacements made a CA of their own"
        assert not first & {p["metadata"]["name"] for p in pods_of(cluster, namespace, release)}
    finally:
        sh(cluster, "kubectl", "delete", "namespace", objs, "--wait=false", check=False)
