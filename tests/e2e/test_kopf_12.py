"""examples/kopf/12_embedded.py on a real control plane: the application starts the embedded
operator, creates and deletes three KopfExamples while it reconciles them, and exits 0 after a
graceful stop — what Kopf's examples/12-embedded does with kopf.operator() in a thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kopf" / "12_embedded.py"

CRD = EXAMPLE.parent / "crd.yaml"  # the KopfExample CRD every port shares (kopfexamples.kopf.dev)


def ensure_crd(env: dict[str, str]) -> None:
    subprocess.run(["kubectl", "apply", "-f", str(CRD)], env=env, check=True, capture_output=True, timeout=60)
    subprocess.run(["kubectl", "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s"],
                   env=env, check=True, capture_output=True, timeout=60)  # fmt: skip


def test_the_embedded_operator_reconciles_while_the_app_works_and_stops_gracefully(control_plane):
    ensure_crd(control_plane.env())
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=control_plane.env(), capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0] == "Starting the main app." and lines[-1] == "Exiting the main app."
    assert [line for line in lines if line.startswith("Do the main app")] == [f"Do the main app activity here. Step {i}/3." for i in (1, 2, 3)]
    for step in range(3):  # each object reconciled while it existed, and once it was gone
        assert f"Reconciled kopf-example-{step}: exists" in lines, done.stdout
        assert f"Reconciled kopf-example-{step}: gone" in lines, done.stdout
