"""pytest plugin (entry point ``declop``): fixtures for tests against a real control plane.

Fixtures:

- ``control_plane`` (session): one :class:`~declop.testing.ControlPlane` for the whole run, with
  kube-controller-manager unless ``DECLOP_TEST_NO_CONTROLLER_MANAGER=1``. Missing binaries make
  the fixture *fail* with the ``ConfigError`` that says how to build them; it never skips.
  ``DECLOP_TEST_FEATURE_GATES="Name=true,Other=false"`` turns apiserver feature gates on or off
  for it (a malformed value fails the fixture with one line saying the expected form).
- ``sharded_control_plane`` (session): a control plane with the ``ShardedListAndWatch`` gate on
  (server-side sharded list and watch, Kubernetes v1.36 alpha): ``control_plane`` itself when
  ``DECLOP_TEST_FEATURE_GATES`` already turns it on, else a second one, started on first use,
  without kube-controller-manager.
- ``kubeconfig`` (session): path of the admin kubeconfig.
- ``k8s_api`` (session): a ``kubernetes.client.ApiClient`` on the admin configuration.
- ``namespace`` (function): a fresh namespace ``t-<test name>-<random>`` created before the test
  and deleted after it (without waiting for it to disappear).

Every test that uses one of these fixtures is marked ``integration``.

This module is imported by every pytest run wherever declop is installed, so it imports nothing
heavy (kubernetes, cryptography) until a fixture is actually used.
"""

from __future__ import annotations

import os
import re
import secrets
import string
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import kubernetes.client

    from declop.testing.cluster.controlplane import ControlPlane

__all__ = [
    "control_plane",
    "feature_gates_from_env",
    "k8s_api",
    "kubeconfig",
    "namespace",
    "namespace_name",
    "sharded_control_plane",
]

INTEGRATION_FIXTURES = frozenset({"control_plane", "kubeconfig", "k8s_api", "namespace", "sharded_control_plane"})
SHARDING_GATE = "ShardedListAndWatch"
_DNS_LABEL_MAX = 63
_SUFFIX_LEN = 5


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: needs a real kube-apiserver + etcd (declop.testing.ControlPlane)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a control-plane fixture as ``integration``."""
    for item in items:
        if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """One running control plane shared by the whole test session."""
    from declop.testing.cluster.controlplane import ControlPlane

    with_kcm = os.environ.get("DECLOP_TEST_NO_CONTROLLER_MANAGER", "") not in ("1", "true", "yes")
    gates = feature_gates_from_env(os.environ.get("DECLOP_TEST_FEATURE_GATES", ""))
    with ControlPlane(controller_manager=with_kcm, feature_gates=gates) as plane:
        yield plane


@pytest.fixture(scope="session")
def sharded_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane with the ``ShardedListAndWatch`` feature gate on (see the module doc)."""
    from declop.testing.cluster.controlplane import ControlPlane

    gates = feature_gates_from_env(os.environ.get("DECLOP_TEST_FEATURE_GATES", ""))
    if gates.get(SHARDING_GATE):
        yield request.getfixturevalue("control_plane")
        return
    with ControlPlane(controller_manager=False, feature_gates={**gates, SHARDING_GATE: True}) as plane:
        yield plane


def feature_gates_from_env(value: str) -> dict[str, bool]:
    """``"A=true,B=false"`` (the apiserver's ``--feature-gates`` syntax) as a dict; "" is none."""
    gates: dict[str, bool] = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, sep, on = part.partition("=")
        if not sep or not name.strip() or on.strip().lower() not in ("true", "false"):
            raise pytest.UsageError(
                f"DECLOP_TEST_FEATURE_GATES: {part!r} is not Name=true or Name=false "
                "(e.g. DECLOP_TEST_FEATURE_GATES=ShardedListAndWatch=true)"
            )
        gates[name.strip()] = on.strip().lower() == "true"
    return gates


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> str:
    """Path of the control plane's admin kubeconfig."""
    return control_plane.kubeconfig_path


@pytest.fixture(scope="session")
def k8s_api(control_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    """An admin ``ApiClient``, closed at the end of the session."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, k8s_api: kubernetes.client.ApiClient
) -> Iterator[str]:
    """A new namespace for this test; deleted afterwards (deletion is not awaited)."""
    import kubernetes.client

    core = kubernetes.client.CoreV1Api(k8s_api)
    name = namespace_name(request.node.name)
    core.create_namespace(
        kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name))
    )
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


def namespace_name(test_name: str) -> str:
    """``t-<sanitised test name>-<5 random chars>``: always a valid DNS label (≤ 63 chars)."""
    suffix = "".join(
        secrets.choice(string.ascii_lowercase + string.digits) for _ in range(_SUFFIX_LEN)
    )
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
    stem = stem[: _DNS_LABEL_MAX - len("t--") - _SUFFIX_LEN].strip("-")
    return f"t-{stem}-{suffix}" if stem else f"t-{suffix}"
