"""declop's public test kit.

- :class:`ControlPlane`, and the pytest plugin (entry point ``declop``) with the ``control_plane``,
  ``kubeconfig``, ``k8s_api`` and ``namespace`` fixtures: a real etcd + kube-apiserver.
- :class:`OperatorRunner` / :class:`OperatorProcess`: run an operator in a thread or as
  ``declop run``; :func:`wait_for` polls a condition.
- :func:`run_reconcile`, :class:`FakeClient`: unit-test a reconciler with no apiserver at all.
- :class:`ListWatchServer`: a scriptable fake list/watch endpoint (plain HTTP) for informer tests.
"""

from __future__ import annotations

from declop.testing.controlplane import ControlPlane, find_assets
from declop.testing.fake import FakeClient, ReconcileOutcome, run_reconcile
from declop.testing.listwatch import ListWatchServer
from declop.testing.runner import OperatorProcess, OperatorRunner, wait_for

__all__ = [
    "ControlPlane",
    "FakeClient",
    "ListWatchServer",
    "OperatorProcess",
    "OperatorRunner",
    "ReconcileOutcome",
    "find_assets",
    "run_reconcile",
    "wait_for",
]
