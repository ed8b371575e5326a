"""`declop dev --node` from an installed wheel, in a project `declop new` made outside the checkout.

The wheel is built from this checkout (sdist, then the wheel from it) and installed with its
``dev`` extra (what ``declop dev`` needs) into a fresh virtualenv outside it; nothing of the checkout is on the path. The scaffolded project runs as
the chart's Pod on a real local node, in its own image built from its Dockerfile `FROM` the
declop image, which is itself built from the installed package: the chart, the Dockerfile and
the node build all come from the wheel. The handlers print a marker that only the project's
image sets (an `ENV` added to its Dockerfile), so the Pod is shown to run that image.

Nothing more than what `declop new` wrote is given: no `-f crd.yaml` (the CRD comes from the
typed model in handlers.py) and no RBAC typed by hand — the chart is installed with the
project's `rbac-values.yaml` (what `declop rbac handlers.py --values` writes), and the Pod runs
under exactly those rules: its ClusterRole holds them and nothing else (no `*`), the start-up
permission check passes, no request is refused (no 403 in its log), and the Widget gets Ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from declop.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
MARKER = "built-from-the-widget-dockerfile"

pytestmark = pytest.mark.timeout(1800)


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """This environment without anything pointing into the checkout or its virtualenv."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "DECLOP_ASSETS_DIR", "KUBEBUILDER_ASSETS", "DECLOP_NODE_ASSETS_DIR"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    env.update(extra)
    return env


def run(args: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def test_a_scaffolded_project_runs_in_its_own_image_from_the_installed_wheel(
    tmp_path: Path, host_snapshot: Callable[[], dict[str, object]]
) -> None:
    dist, home = tmp_path / "dist", tmp_path / "user"
    built = run([sys.executable, "-m", "build", "--quiet", "--outdir", dist, ROOT], timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = dist.glob("declop-*.whl")
    venv = home / "venv"
    assert run([sys.executable, "-m", "venv", venv], timeout=300).returncode == 0
    env = clean_env(venv)
    installed = run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[dev]"], cwd=home, env=env, timeout=900)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    project = home / "widget-operator"
    made = run([venv / "bin" / "declop", "new", "Widget", "--group", "example.com", "--dir", project], cwd=home, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    with (project / "Dockerfile").open("a") as dockerfile:
        dockerfile.write(f"ENV WIDGET_IMAGE_MARKER={MARKER}\n")
    handlers = project / "handlers.py"
    handlers.write_text(handlers.read_text() + '\nprint("image marker:", __import__("os").environ.get("WIDGET_IMAGE_MARKER"), flush=True)\n')

    before = host_snapshot()
    out = project / ".declop" / "kubeconfig"
    proc = subprocess.Popen(
        [venv / "bin" / "declop", "dev", "--node", "handlers.py", "--kubeconfig-out", out],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("Operator running in-cluster" in l for l in lines) or proc.poll() is not None,
                 timeout=1200, what="the operator Pod to be Ready")  # fmt: skip
        assert proc.poll() is None, "\n".join(lines[-40:])
        assert any(f"Building widget-operator:dev from {project / 'Dockerfile'} FROM declop:0.1.0" in l for l in lines), "\n".join(lines)
        assets = next(l.split("export PATH=", 1)[1].split(":", 1)[0] for l in lines if "export PATH=" in l)
        kube_env = {**env, "KUBECONFIG": str(out), "PATH": f"{assets}:{env['PATH']}"}

        def kubectl(*args: str) -> str:
            done = run(["kubectl", *args], env=kube_env, timeout=120)
            assert done.returncode == 0, done.stderr
            return done.stdout

        image = kubectl("get", "deploy", "-n", "declop-system", "declop", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
        assert image == "widget-operator:dev"
        wait_for(lambda: any(f"image marker: {MARKER}" in l for l in lines), timeout=60,
                 what="the marker only the project's image sets, in the operator's log:\n" + "\n".join(lines[-30:]))  # fmt: skip

        # the chart's RBAC is the generated file's, and only that: no wildcard from the dev path
        rbac_file = project / "rbac-values.yaml"
        assert any(f"RBAC from {rbac_file}" in l for l in lines), "\n".join(lines)
        generated = yaml.safe_load(rbac_file.read_text())["rbac"]["generated"]
        role = yaml.safe_load(kubectl("get", "clusterrole", "declop-system-declop", "-o", "yaml"))
        assert role["rules"] == generated
        sa = "system:serviceaccount:declop-system:declop"
        assert kubectl("auth", "can-i", "patch", "widgets.example.com/status", "--as", sa).strip() == "yes"
        denied = run(["kubectl", "auth", "can-i", "get", "secrets", "--as", sa, "-n", "declop-system"], env=kube_env, timeout=120)
        assert (denied.returncode, denied.stdout.strip()) == (1, "no"), denied.stderr  # can-i exits 1 for "no"

        kubectl("apply", "-f", str(project / "example.yaml"))
        ready = 'jsonpath={.status.conditions[?(@.type=="Ready")].status}'
        wait_for(lambda: kubectl("get", "widget", "hello", "-o", ready) == "True", timeout=60, what="the Widget to be Ready")
        assert kubectl("get", "configmap", "hello", "-o", "jsonpath={.data.message}") == "Hello from a Widget"
        wait_for(lambda: any("ConfigMap created" in l for l in lines), timeout=30, what="the reconcile's log line")
        refused = [l for l in lines if "forbidden" in l.lower() or "missing permission" in l or " 403" in l]
        assert refused == [], "\n".join(refused)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=90) == 0, "\n".join(lines[-30:])
    finally:
        if proc.poll() is None:  # an assertion failed: stop as Ctrl-C does, so the node undoes its host changes
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(10)
    assert "Control plane stopped." in lines
    assert host_snapshot() == before
