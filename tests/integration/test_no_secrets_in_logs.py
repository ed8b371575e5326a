"""No object contents in any log line: a handler returning a Secret (``return client.patch(...)``)
, an invalid Result or a Kopf-style dict (Kopf stores it in the status) is a terminal error,
logged once, naming the type and key, never the data — by default and at ``-v``."""

from __future__ import annotations

import base64
import textwrap

import kubernetes.client
import pytest

from declop.testing.runner import OperatorProcess

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
