"""Secure metrics on the real apiserver: HTTPS, bearer tokens checked with TokenReview and access
with SubjectAccessReview (nonResourceURL /metrics, verb get) — no token → 401, a token without
the RBAC → 403, with it → 200; decisions cached; probes stay plain HTTP and /readyz?verbose
names a failing check without its error text."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

import kubernetes.client
import pytest

import declop
from declop.manager import Options
from declop.testing.runner import OperatorRunner

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


INSECURE = ssl.create_default_context()
INSECURE.check_hostname = False
INSECURE.verify_mode = ssl.CERT_NONE  # the serving certificate is self-signed


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=INSECURE if url.startswith("https") else None) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_need_a_token_with_get_on_metrics(control_plane: Any, kubeconfig: str, namespace: str) -> None:
    api = control_plane.api_client()
    core, rbac = kubernetes.client.CoreV1Api(api), kubernetes.client.RbacAuthorizationV1Api(api)
    for sa in ("scraper", "nobody"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    role = f"{namespace}-metrics-reader"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
    })
    scraper = control_plane.service_account_token(namespace, "scraper")
    nobody = control_plane.service_account_token(namespace, "nobody")

    registry = declop.registry.Registry()

    @declop.reconciler("configmaps", registry=registry)
    def seen(**_: Any) -> None:
        pass

    health, metrics = free_port(), free_port()
    options = Options(namespaces=(namespace,), health_port=health, metrics_port=metrics, grace_period=1)
    try:
        with OperatorRunner(registry, kubeconfig=kubeconfig, options=options) as op:
            url = f"https://127.0.0.1:{metrics}/metrics"
            with pytest.raises((urllib.error.URLError, ConnectionError)):  # HTTPS only
                urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read()
            assert get(url) == (401, "Unauthorized\n")
            assert get(url, "not-a-token") == (401, "Unauthorized\n")
            status, body = get(url, nobody)
            assert status == 403 and body == f"Authorization denied for user system:serviceaccount:{namespace}:nobody\n"
            started = time.perf_counter()
            status, body = get(url, scraper)
            first = time.perf_counter() - started
            assert status == 200 and "controller_runtime_reconcile_total" in body
            auth = op.manager.probes.metrics_auth  # type: ignore[union-attr]
            reviews = auth.reviews
            started = time.perf_counter()
            assert get(url, scraper)[0] == 200
            cached = time.perf_counter() - started
            assert auth.reviews == reviews, "an allowed token is not reviewed again within its TTL"
            print(f"measured: first authorized scrape {first * 1000:.1f} ms, cached {cached * 1000:.1f} ms")
            # probes: plain HTTP, no authentication
            assert get(f"http://127.0.0.1:{health}/healthz") == (200, "ok")
            assert get(f"http://127.0.0.1:{health}/readyz?verbose")[0] == 200
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)
        api.close()
