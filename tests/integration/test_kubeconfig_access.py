"""kubeconfig as kubectl reads it, proven with real ``declop run`` processes on the real apiserver:
an HTTP CONNECT proxy with tls-server-name, insecure-skip-tls-verify, an exec plugin handing out
a client certificate, one clear line (and exit 2) for malformed kubeconfigs, TLS verification
failures named as such, 401 messages that fit the credentials' source, and no credential file
in TMPDIR on any exit path (lease loss with a forced exit: test_leader_election.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from declop.testing.cluster.faults import ConnectProxy
from declop.testing.cluster.runner import OperatorProcess

pytestmark = pytest.mark.integration

HANDLER = """
import declop

@declop.reconciler("namespaces")
def seen(name, logger, **_):
    logger.info("Seen namespace")
"""


def admin_config(control_plane: Any) -> dict[str, Any]:
    return json.loads(Path(control_plane.kubeconfig_path).read_text())


def write(path: Path, config: dict[str, Any]) -> str:
    path.write_text(json.dumps(config))
    return str(path)


def cluster(config: dict[str, Any]) -> dict[str, Any]:
    return config["clusters"][0]["cluster"]


def user(config: dict[str, Any]) -> dict[str, Any]:
    return config["users"][0]["user"]


def handlers(tmp_path: Path) -> str:
    path = tmp_path / "handlers.py"
    path.write_text(textwrap.dedent(HANDLER))
    return str(path)


def declop_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "declop", "run", *args], capture_output=True, text=True,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": "", **(env or {})}, timeout=60, check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("declop: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def reconciles(tmp_path: Path, kubeconfig: str, **env: str) -> None:
    with OperatorProcess([handlers(tmp_path), "--kubeconfig", kubeconfig], env={**os.environ, **env}) as op:
        op.wait_for_line("Seen namespace")


def test_proxy_url_with_tls_server_name(control_plane, tmp_path):
    port = urlparse(control_plane.host).port
    proxy = ConnectProxy()
    try:
        config = admin_config(control_plane)
        cluster(config).update({"server": f"https://apiserver.declop.test:{port}", "proxy-url": proxy.url})
        # the serving certificate is for localhost: without tls-server-name verification fails…
        one_line(declop_run(handlers(tmp_path), "--kubeconfig", write(tmp_path / "no-name", config)), 1,
                 "TLS verification of the apiserver at https://apiserver.declop.test", "Hostname mismatch")
        # …with it, everything goes through the proxy's CONNECT tunnel
        cluster(config)["tls-server-name"] = "localhost"
        reconciles(tmp_path, write(tmp_path / "named", config))
        assert set(proxy.targets) == {f"apiserver.declop.test:{port}"}
    finally:
        proxy.close()


def test_insecure_skip_tls_verify(control_plane, tmp_path):
    config = admin_config(control_plane)
    del cluster(config)["certificate-authority-data"]
    cluster(config)["insecure-skip-tls-verify"] = True
    reconciles(tmp_path, write(tmp_path / "insecure", config))


def test_a_wrong_ca_names_the_verification_error(control_plane, tmp_path):
    from declop.testing.cluster.certs import generate

    other = generate(tmp_path / "other-pki")
    config = admin_config(control_plane)
    cluster(config)["certificate-authority-data"] = base64.b64encode(Path(other.serving_ca.cert).read_bytes()).decode()
    line = one_line(declop_run(handlers(tmp_path), "--kubeconfig", write(tmp_path / "wrong-ca", config)), 1,
                    "TLS verification of the apiserver", "certificate")
    assert "cannot reach" not in line and "is the cluster running" not in line


def test_exec_plugin_client_certificate(control_plane, tmp_path):
    config = admin_config(control_plane)
    pem = {k: base64.b64decode(user(config)[f"client-{k}-data"]).decode() for k in ("certificate", "key")}
    plugin = tmp_path / "plugin.py"
    plugin.write_text(textwrap.dedent(f"""\
        import json
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {{"clientCertificateData": {pem['certificate']!r}, "clientKeyData": {pem['key']!r}}}}}))
        """))
    config["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin)]}}
    reconciles(tmp_path, write(tmp_path / "exec", config))


@pytest.mark.parametrize("kind", ["bad-yaml", "directory", "list"])
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(tmp_path, kind):
    path = tmp_path / "kubeconfig"
    if kind == "directory":
        path.mkdir()
        problem = "is a directory, not a file"
    elif kind == "list":
        path.write_text("- name: a\n- name: b\n")
        problem = "holds a YAML list"
    else:
        path.write_text("clusters:\n  - name: a\n   cluster: {}\n")
        problem = "is not valid YAML at line"
    one_line(declop_run(handlers(tmp_path), "--kubeconfig", str(path)), 2, f"kubeconfig {path}", problem)


def test_401_says_which_credentials_were_rejected(control_plane, tmp_path):
    config = admin_config(control_plane)
    config["users"][0]["user"] = {"token": "not-a-valid-token"}
    one_line(declop_run(handlers(tmp_path), "--kubeconfig", write(tmp_path / "bad-token", config)), 1,
             "rejected the token of user 'admin' in kubeconfig", "log in again")
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("not-a-valid-token")
    (sa / "ca.crt").write_bytes(base64.b64decode(cluster(config)["certificate-authority-data"]))
    port = str(urlparse(control_plane.host).port)
    env = {"KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port,
           "DECLOP_SERVICE_ACCOUNT_DIR": str(sa)}
    one_line(declop_run(handlers(tmp_path), env=env), 1, "rejected the service account token (401)", str(sa / "token"))


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "error exit"])
def test_no_credential_file_on_any_exit(control_plane, tmp_path, how):
    """The admin kubeconfig embeds its certificate and key (``*-data``): nothing of it reaches
    TMPDIR while running or after the exit. (Lease loss with a forced exit: test_leader_election.)"""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**control_plane.env(), "TMPDIR": str(scratch)}
    if how == "error exit":
        bad = tmp_path / "bad.py"
        bad.write_text("import declop\n\n@declop.reconciler('nosuchthings')\ndef h(**_):\n    pass\n")
        result = declop_run(str(bad), env=env)
        assert result.returncode == 1 and "unknown resource" in result.stderr
    else:
        op = OperatorProcess([handlers(tmp_path)], env=env)
        op.start()
        try:
            op.wait_for_line("Seen namespace")
            assert list(scratch.iterdir()) == []
            op.proc.send_signal(getattr(signal, how))
            assert op.proc.wait(30) == 0  # both drain and exit cleanly
        finally:
            op.stop()
    assert list(scratch.iterdir()) == []
