"""declop's public test kit.

- :class:`ControlPlane`, and the pytest plugin (entry point ``declop``) with the ``control_plane``,
  ``kubeconfig``, ``k8s_api`` and ``namespace`` fixtures: a real etcd + kube-apiserver.
- :class:`OperatorRunner` / :class:`OperatorProcess`: run an operator in a thread or as
  ``declop run``; :class:`Replicas`: several ``declop run`` processes of one operator (sharding,
  leader election, rollouts); :func:`wait_for` polls a condition.
- :func:`run_reconcile`, :class:`FakeClient`: unit-test a reconciler with no apiserver at all.
- :class:`ListWatchServer`: a scriptable fake list/watch endpoint (plain HTTP) for informer tests.
- :mod:`declop.testing.sim` (``python -m declop.testing.sim``): replicas of the real Lease code on
  virtual time (:mod:`declop.testing.simloop`) under seeded faults, with invariants checked as
  they run (docs/simulation.md). Not re-exported here: import it by its module.
- :func:`simulate` (:class:`Simulation`): ``declop sim`` from a project's own tests —
  ``simulate("handlers.py", seeds=20).check()``.
- :class:`BuildKit`, :func:`build_image`, :func:`declop_image`, :func:`base_image`,
  :func:`pause_image`, :func:`wheelhouse`: container images from a Dockerfile with no Docker
  daemon and no registry (:class:`BuiltImage`: an OCI archive for ``ctr images import`` and an
  OCI layout).
"""

from __future__ import annotations

from declop.testing.controlplane import ControlPlane, find_assets
from declop.testing.fake import FakeClient, ReconcileOutcome, run_reconcile
from declop.testing.image import (
    BuildKit,
    BuiltImage,
    ImageBuildError,
    base_image,
    build_image,
    declop_image,
    pause_image,
    wheelhouse,
)
from declop.testing.listwatch import ListWatchServer
from declop.testing.runner import OperatorProcess, OperatorRunner, Replicas, wait_for
from declop.testing.simulate import Simulation, simulate

__all__ = [
    "BuildKit",
    "BuiltImage",
    "ControlPlane",
    "FakeClient",
    "ImageBuildError",
    "ListWatchServer",
    "OperatorProcess",
    "OperatorRunner",
    "ReconcileOutcome",
    "Replicas",
    "Simulation",
    "base_image",
    "build_image",
    "declop_image",
    "find_assets",
    "pause_image",
    "run_reconcile",
    "simulate",
    "wait_for",
    "wheelhouse",
]
