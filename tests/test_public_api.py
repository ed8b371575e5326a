"""The public surface of ``declop`` and ``declop.testing`` is deliberate: lock it."""

from __future__ import annotations

import importlib
import types

import pytest

import declop

#: the public names of ``declop``; changing this set is an API change
EXPECTED = {
    "AlreadyOwnedError",
    "ApiError",
    "AsyncClient",
    "CacheNotSyncedError",
    "Client",
    "ConfigError",
    "Conflict",
    "DeclopError",
    "Forbidden",
    "InvalidResult",
    "Manager",
    "NotFound",
    "Options",
    "Phase",
    "Priority",
    "RateLimit",
    "ReconcileLogger",
    "RegistrationError",
    "Registry",
    "Rejected",
    "Request",
    "Resource",
    "Result",
    "TerminalError",
    "Trigger",
    "acreate_or_update",
    "add_finalizer",
    "aretry_on_conflict",
    "background",
    "clone",
    "conditions",
    "contains_finalizer",
    "converter",
    "create_or_update",
    "index",
    "mutator",
    "on_shutdown",
    "on_startup",
    "predicates",
    "reconciler",
    "remove_finalizer",
    "retry_on_conflict",
    "set_controller_reference",
    "transform",
    "validator",
}

#: the public names of ``declop.testing``
EXPECTED_TESTING = {"BuildKit", "BuiltImage", "ControlPlane", "FakeClient", "ImageBuildError", "ListWatchServer", "OperatorProcess", "OperatorRunner", "ReconcileOutcome", "Replicas", "base_image", "build_image", "declop_image", "find_assets", "pause_image", "run_reconcile", "wait_for", "wheelhouse"}


def test_all_is_sorted() -> None:
    assert declop.__all__ == sorted(declop.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(declop.__all__) == len(set(declop.__all__))


def test_every_name_exists() -> None:
    missing = [name for name in declop.__all__ if not hasattr(declop, name)]
    assert missing == []


def test_the_surface_is_locked() -> None:
    assert set(declop.__all__) == EXPECTED


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from declop import *", namespace)  # noqa: S102 - the star import is the subject
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_version() -> None:
    assert isinstance(declop.__version__, str)
    assert declop.__version__.count(".") >= 2


@pytest.mark.parametrize("name", ["conditions", "predicates"])
def test_module_namespaces_are_the_modules(name: str) -> None:
    module = getattr(declop, name)
    assert isinstance(module, types.ModuleType)
    assert module.__name__ == f"declop.{name}"
    assert module is importlib.import_module(f"declop.{name}")


def test_conditions_surface() -> None:
    assert declop.conditions.__all__ == ["get", "is_false", "is_status", "is_true", "remove", "set", "timestamp"]


@pytest.mark.parametrize("name", sorted(EXPECTED - {"conditions", "predicates"}))
def test_public_objects_claim_the_package(name: str) -> None:
    """``__module__`` is rewritten so reprs, docs and pickles say ``declop.X``."""
    assert getattr(declop, name).__module__ == "declop"


@pytest.mark.parametrize("name", sorted(EXPECTED - {"conditions", "predicates"}))
def test_public_objects_are_the_originals(name: str) -> None:
    """Re-exports are the defining module's objects, not copies."""
    obj = getattr(declop, name)
    defining = {
        "clone": "declop.cache",
        "AsyncClient": "declop.client",
        "Client": "declop.client",
        "ReconcileLogger": "declop.logs",
        "Manager": "declop.manager",
        "Options": "declop.manager",
        "Registry": "declop.registry",
        "index": "declop.registry",
        "reconciler": "declop.registry",
        "transform": "declop.registry",
        "on_startup": "declop.registry",
        "on_shutdown": "declop.registry",
        "background": "declop.registry",
        "validator": "declop.registry",
        "mutator": "declop.registry",
        "converter": "declop.registry",
        "Rejected": "declop.webhook",
        "Resource": "declop.resource",
        "Request": "declop.keys",
        "Phase": "declop.result",
        "Result": "declop.result",
        "add_finalizer": "declop.finalizers",
        "contains_finalizer": "declop.finalizers",
        "remove_finalizer": "declop.finalizers",
        "AlreadyOwnedError": "declop.ownership",
        "acreate_or_update": "declop.ownership",
        "aretry_on_conflict": "declop.ownership",
        "create_or_update": "declop.ownership",
        "retry_on_conflict": "declop.ownership",
        "set_controller_reference": "declop.ownership",
        "Priority": "declop.priorityqueue",
        "RateLimit": "declop.ratelimit",
        "Trigger": "declop.trigger",
    }.get(name, "declop.errors")
    assert getattr(importlib.import_module(defining), name) is obj


def test_reprs_use_the_package_name() -> None:
    assert repr(declop.Request) == "<class 'declop.Request'>"
    assert repr(declop.NotFound("x")) == "NotFound('x')"
    assert declop.reconciler.__module__ == "declop"
    assert declop.reconciler.__qualname__ == "reconciler"


# -- declop.testing -----------------------------------------------------------------------


def test_testing_all_is_sorted_and_importable() -> None:
    testing = importlib.import_module("declop.testing")
    assert testing.__all__ == sorted(testing.__all__)
    assert set(testing.__all__) == EXPECTED_TESTING
    for name in testing.__all__:
        assert getattr(testing, name) is not None


def test_testing_star_import() -> None:
    namespace: dict[str, object] = {}
    exec("from declop.testing import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == EXPECTED_TESTING
