"""Kopf's 09-testing/test_example_09.py, ported: the operator of 09_testing.py tested twice.

    pytest examples/kopf/test_09_testing.py

Kopf's test runs the operator (KopfRunner) against a cluster you bring, sleeps and reads the
output. declop's test kit gives two levels: ``run_reconcile`` calls the handler against a fake
apiserver in about a millisecond, and ``OperatorProcess`` runs ``declop run`` as a real process
against the real etcd + kube-apiserver the pytest plugin starts (``control_plane``, ``namespace``),
waiting for output lines instead of sleeping.
Lines of code (non-blank, non-comment): Kopf's test_example_09.py 37, this one 34 (with this docstring).
"""

import subprocess
from pathlib import Path

import yaml

from declop.loader import load
from declop.testing import OperatorProcess, run_reconcile

HERE = Path(__file__).parent
CRD, OBJ, EXAMPLE = HERE / "crd.yaml", HERE / "obj.yaml", HERE / "09_testing.py"


def test_a_new_object_is_logged_once_and_an_old_one_not():
    (example,) = load([str(EXAMPLE)])  # registers its reconciler in the default registry
    obj = yaml.safe_load(OBJ.read_text()) | {"metadata": {"name": "kopf-example-1", "namespace": "default"}}
    first = run_reconcile(example.create_fn, obj, [obj], resources=[yaml.safe_load(CRD.read_text())])
    assert first.messages == ("Something was logged here.",)
    again = run_reconcile(example.create_fn, obj, client=first.client)  # the finalizer is on it now
    assert again.messages == ()


def test_resource_lifecycle(control_plane, namespace):
    env = control_plane.env()
    subprocess.run(["kubectl", "apply", "-f", str(CRD)], env=env, check=True, timeout=30)
    subprocess.run(["kubectl", "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev"], env=env, check=True, timeout=30)
    with OperatorProcess([str(EXAMPLE), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        subprocess.run(["kubectl", "create", "-n", namespace, "-f", str(OBJ)], env=env, check=True, timeout=30)
        line = op.wait_for_line("Something was logged here.")[0]
        assert f'"namespace": "{namespace}", "name": "kopf-example-1"' in line
        # the finalizer holds the object until the operator has seen the deletion
        subprocess.run(["kubectl", "delete", "-n", namespace, "-f", str(OBJ)], env=env, check=True, timeout=30)
    assert op.returncode == 0
