"""declop's public test kit: a real control plane for integration tests, runners, and its pytest plugin.

``declop.testing.plugin`` is registered as a pytest plugin (entry point ``declop``) and provides
the ``control_plane``, ``kubeconfig``, ``k8s_api`` and ``namespace`` fixtures.
"""

from __future__ import annotations

from declop.testing.controlplane import ControlPlane, find_assets
from declop.testing.runner import OperatorProcess, OperatorRunner, wait_for

__all__ = [
    "ControlPlane",
    "OperatorProcess",
    "OperatorRunner",
    "find_assets",
    "wait_for",
]
