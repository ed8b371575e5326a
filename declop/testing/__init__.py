"""declop's public test kit, in three parts:

- :mod:`declop.testing.cluster`, the real-cluster kit: :class:`ControlPlane` (a real etcd +
  kube-apiserver, and a real node), the pytest plugin (entry point ``declop``) with the
  ``control_plane``, ``kubeconfig``, ``k8s_api`` and ``namespace`` fixtures,
  :class:`OperatorRunner` / :class:`OperatorProcess` (an operator in a thread or as ``declop run``),
  :class:`Replicas` (several ``declop run`` processes of one operator), :func:`wait_for`, network
  faults (``cluster.faults``) and container images from a Dockerfile with no Docker daemon and no
  registry (:class:`BuildKit`, :func:`build_image`, :func:`declop_image`, :func:`base_image`,
  :func:`pause_image`, :func:`wheelhouse`; :class:`BuiltImage` is an OCI archive for
  ``ctr images import`` and an OCI layout).
- :mod:`declop.testing.fakes`, no cluster at all: :func:`run_reconcile` and :class:`FakeClient`
  unit-test a reconciler against an in-memory apiserver (``fakes.apiserver``), and
  :class:`ListWatchServer` is a scriptable list/watch endpoint (plain HTTP) for informer tests.
- :mod:`declop.testing.simulation`, real declop code on virtual time under seeded faults:
  ``python -m declop.testing.simulation.leases`` (replicas of the real Lease code) and
  ``python -m declop.testing.simulation.world`` (real managers in a simulated cluster), with
  invariants checked as they run (docs/simulation.md); :func:`simulate` (:class:`Simulation`)
  is ``declop sim`` from a project's own tests — ``simulate("handlers.py", seeds=20).check()``.

Everything listed in ``__all__`` is importable from here; the rest by its module.
"""

from __future__ import annotations

from declop.testing.cluster.controlplane import ControlPlane, find_assets
from declop.testing.fakes.client import FakeClient, ReconcileOutcome, run_reconcile
from declop.testing.cluster.image import (
    BuildKit,
    BuiltImage,
    ImageBuildError,
    base_image,
    build_image,
    declop_image,
    pause_image,
    wheelhouse,
)
from declop.testing.fakes.listwatch import ListWatchServer
from declop.testing.cluster.runner import OperatorProcess, OperatorRunner, Replicas, wait_for
from declop.testing.simulation.simulate import Simulation, simulate

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
