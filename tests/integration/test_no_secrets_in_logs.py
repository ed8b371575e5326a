"""No object contents in any log line: a handler returning a Secret (``return client.patch(...)``)
, an invalid Result or a Kopf-style dict (Kopf stores it in the status) is a terminal error,
logged once, naming the type and key, never the data — by default and at ``-v``."""

from __future__ import annotations

import base64
import textwrap

import kubernetes.client
import pytest

from declop.testing.cluster.faults import ConnectProxy
from declop.testing.cluster.runner import OperatorProcess

pytestmark = pytest.mark.integration

PASSWORD = "hunter2-s3cr3t-value"
ENCODED = base64.b64encode(PASSWORD.encode()).decode()

HANDLERS = """
import declop

@declop.reconciler("secrets", labels="leak-test=yes")
def leaky(request, client, **_):
    # the classic slip: returning what client.patch returned — the whole Secret
    # (an empty merge patch changes nothing, so no new event: one call, one line)
    return client.patch("secrets", request, {"metadata": {}})

@declop.reconciler("configmaps", labels="leak-test=yes")
def bad_result(request, **_):
    return declop.Result(requeue_after="5")

@declop.reconciler("configmaps", labels="kopf-test=yes")
def kopf_style(request, **_):
    return {"message": "hunter2-" + "s3cr3t-value"}  # Kopf would store this in status.kopf_style

@declop.reconciler("configmaps", labels="sentinel=yes")
def sentinel(logger, **_):
    logger.info("Sentinel reconciled")
"""


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_a_handler_returning_a_secret_never_logs_its_data(control_plane, namespace, tmp_path, verbose):
    handlers = tmp_path / "handlers.py"
    handlers.write_text(textwrap.dedent(HANDLERS))
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "db", "labels": {"leak-test": "yes"}}, "data": {"password": ENCODED}},
    )
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm", "labels": {"leak-test": "yes"}}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "kopf", "labels": {"kopf-test": "yes"}}})
    args = [str(handlers), "-n", namespace, "--grace-period", "1", *(["-v"] if verbose else [])]
    with OperatorProcess(args, env=control_plane.env()) as op:
        secret_lines = op.wait_for_line("returned a Secret object %s/db (contents not shown)" % namespace)
        result_lines = op.wait_for_line("requeue_after must be a number of seconds or None, got '5'")
        dict_lines = op.wait_for_line(f"returned a dict (contents not shown) for {namespace}/kopf")
        # terminal, not retried: a retry would follow within milliseconds (5 ms base backoff);
        # a sentinel object's whole round trip through the apiserver comes after that
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "zz", "labels": {"sentinel": "yes"}}})
        op.wait_for_line("Sentinel reconciled")
    everything = op.lines + op.stderr
    assert len([line for line in op.lines if line.startswith("ERROR")]) == 3, "\n".join(op.lines)
    assert "return None or declop.Result(requeue_after=seconds)" in secret_lines[0]
    assert "e.g. Result(requeue_after=30)" in result_lines[0]
    assert "client.patch_status(request, {'status': {...}}) and return None" in dict_lines[0]
    for line in everything:
        assert PASSWORD not in line and ENCODED not in line, line


PROXY_PASSWORD = "pr0xy-s3cret-pass"
TOKEN_NAME = "leak-token"

LISTING_HANDLERS = """
import declop

@declop.reconciler("secrets", labels="leak-test=yes")
def leaky(request, client, logger, **_):
    listed = client.list("secrets", namespace=request.namespace, labels="leak-test=yes")
    logger.info("Listed secrets", secrets=listed)            # a list of Secrets as a pair
    logger.info("One secret %s", listed[0])                  # and as a % argument
    return client.patch("secrets", request, {"metadata": {}})
"""


def test_no_credential_of_any_kind_in_any_output(control_plane, namespace, tmp_path):
    """An operator with a proxy-url holding a password, a bearer token, a client key and a handler
    that logs and returns Secrets, at -v; its proxy then fails so every error path that names the
    proxy runs. None of the four secrets, nor the Secret's value, appears anywhere in its output."""
    import json
    from pathlib import Path
    from urllib.parse import urlparse

    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": TOKEN_NAME}})
    binding = f"{namespace}-{TOKEN_NAME}"
    rbac.create_cluster_role_binding({
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": TOKEN_NAME, "namespace": namespace}],
    })
    token = control_plane.service_account_token(namespace, TOKEN_NAME)
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "db", "labels": {"leak-test": "yes"}}, "data": {"password": ENCODED}},
    )
    config = json.loads(Path(control_plane.kubeconfig_path).read_text())
    user = config["users"][0]["user"]
    key_pem = base64.b64decode(user["client-key-data"]).decode() if "client-key-data" in user else Path(user["client-key"]).read_text()
    key_lines = [l for l in key_pem.splitlines() if l and not l.startswith("-----")]
    proxy = ConnectProxy(credentials=("declop", PROXY_PASSWORD))
    port = urlparse(control_plane.host).port
    cluster = config["clusters"][0]["cluster"]
    cluster.update({
        "server": f"https://apiserver.declop.test:{port}", "tls-server-name": "localhost",
        "proxy-url": f"http://declop:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}",
    })
    user["token"] = token  # beside the client certificate and key: all sent, none printed
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    handlers = tmp_path / "handlers.py"
    handlers.write_text(textwrap.dedent(LISTING_HANDLERS))
    args = [str(handlers), "--kubeconfig", str(kubeconfig), "-n", namespace, "--grace-period", "1", "-v"]
    try:
        with OperatorProcess(args, env={**control_plane.env(), "KUBERNETES_SERVICE_HOST": ""}) as op:
            op.wait_for_line("returned a Secret object %s/db (contents not shown)" % namespace)
            op.wait_for_line("Listed secrets")
            op.wait_for_line("One secret")
            assert proxy.tunnels > 0, "everything went through the authenticating proxy"
            proxy.cut_all()
            failed = op.wait_for_line("through the proxy http://declop:xxxxx@127.0.0.1", timeout=60)
    finally:
        proxy.close()
        rbac.delete_cluster_role_binding(binding)
        api.close()
    everything = op.lines + op.stderr
    assert failed
    for secret in (PROXY_PASSWORD, token, PASSWORD, ENCODED, *key_lines):
        leaks = [line for line in everything if secret in line]
        assert not leaks, (secret[:12], leaks[:3])
