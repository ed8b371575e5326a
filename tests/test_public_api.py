"""The public surface of ``declop`` and ``declop.testing`` is deliberate: lock it."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import types
import warnings

import pytest

import declop

#: the public names of ``declop``: what a handler author uses every day; changing this set is an
#: API change. Everything else is imported from the package that owns it.
EXPECTED = {
    "AsyncClient",
    "Client",
    "Condition",
    "Conflict",
    "CustomResource",
    "Fenced",
    "NotFound",
    "Operator",
    "Phase",
    "Rejected",
    "Request",
    "Result",
    "Steps",
    "TemporaryError",
    "TerminalError",
    "acreate_or_update",
    "add_finalizer",
    "aretry_on_conflict",
    "background",
    "clone",
    "conditions",
    "contains_finalizer",
    "converter",
    "create_or_update",
    "daemon",
    "index",
    "mutator",
    "on_login",
    "on_probe",
    "on_shutdown",
    "on_startup",
    "predicates",
    "reconciler",
    "remove_finalizer",
    "retry_on_conflict",
    "set_controller_reference",
    "timer",
    "transform",
    "validator",
}

#: the public names of ``declop.testing``
EXPECTED_TESTING = {"BuildKit", "BuiltImage", "ControlPlane", "FakeClient", "ImageBuildError", "ListWatchServer", "OperatorProcess", "OperatorRunner", "ReconcileOutcome", "Replicas", "Simulation", "base_image", "build_image", "declop_image", "find_assets", "pause_image", "run_reconcile", "simulate", "wait_for", "wheelhouse"}


def test_all_is_sorted() -> None:
    assert declop.__all__ == sorted(declop.__all__)


def test_all_has_no_duplicates() -> None:
    assert len(declop.__all__) == len(set(declop.__all__))


def test_every_name_exists() -> None:
    missing = [name for name in declop.__all__ if not hasattr(declop, name)]
    assert missing == []


def test_the_surface_is_locked() -> None:
    assert set(declop.__all__) == EXPECTED


def test_the_front_door_is_small() -> None:
    # 31, not 30: declop.Fenced (issue 22) is raised by a handler's own writes once its Lease is
    # gone, so a handler that catches broadly must be able to name it from the front door.
    # 32: declop.Condition (issue 44), the typed entry declop.conditions works on, which every
    # typed status with conditions declares — as central to a typed status as declop.conditions.
    # 33: declop.timer (issue 40), the first of the handler kinds Kopf users reach for.
    # 34: declop.daemon (issue 40), Kopf's per-object daemons: a decorator as everyday as background.
    # 35, 36: declop.TemporaryError (Kopf's, a row of the outcome table any handler raises) and
    # declop.Steps (issue 40: the type of the `steps` argument handlers annotate).
    # 37: declop.Operator (issue 41), the one supported way to run the manager inside another
    # application (docs/embedding.md) — what Kopf users reach for as kopf.operator()/kopf.run().
    # 38: declop.on_probe (issue 41), Kopf's on.probe: a lifecycle decorator like on_startup.
    # 39: declop.on_login (issue 41), Kopf's on.login: credentials from a function, not a kubeconfig.
    assert len(declop.__all__) <= 39


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from declop import *", namespace)  # noqa: S102 - the star import is the subject
    assert set(namespace) - {"__builtins__"} == EXPECTED


def test_version() -> None:
    assert isinstance(declop.__version__, str)
    assert declop.__version__.count(".") >= 2


@pytest.mark.parametrize(("name", "home"), [("conditions", "declop.conditions"), ("predicates", "declop.reconcile.predicates")])
def test_module_namespaces_are_the_modules(name: str, home: str) -> None:
    module = getattr(declop, name)
    assert isinstance(module, types.ModuleType)
    assert module.__name__ == home
    assert module is importlib.import_module(home)


def test_predicates_keeps_its_short_import_path_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = importlib.import_module("declop.predicates")
    assert module is declop.predicates


def test_conditions_surface() -> None:
    assert declop.conditions.__all__ == ["get", "is_false", "is_status", "is_true", "remove", "set", "timestamp"]


@pytest.mark.parametrize("name", sorted(EXPECTED - {"conditions", "predicates", "CustomResource", "Condition", "Operator"}))
def test_public_objects_claim_the_package(name: str) -> None:
    """``__module__`` is rewritten so reprs, docs and pickles say ``declop.X`` — except for the
    lazy ``CustomResource`` and ``Condition``, whose homes are in ``declop.typed`` (pickles of
    their models name them), and the lazy ``Operator`` (``declop.manager``'s)."""
    assert getattr(declop, name).__module__ == "declop"


@pytest.mark.parametrize("name", sorted(EXPECTED - {"conditions", "predicates"}))
def test_public_objects_are_the_originals(name: str) -> None:
    """Re-exports are the defining module's objects, not copies."""
    obj = getattr(declop, name)
    defining = {
        "clone": "declop.cache.store",
        "AsyncClient": "declop.reconcile.client",
        "Client": "declop.reconcile.client",
        "index": "declop.registry",
        "reconciler": "declop.registry",
        "timer": "declop.registry",
        "transform": "declop.registry",
        "on_startup": "declop.registry",
        "on_shutdown": "declop.registry",
        "on_probe": "declop.registry",
        "on_login": "declop.registry",
        "background": "declop.registry",
        "validator": "declop.registry",
        "mutator": "declop.registry",
        "converter": "declop.registry",
        "daemon": "declop.registry",
        "Rejected": "declop.webhooks.declaration",
        "CustomResource": "declop.typed.model",
        "Operator": "declop.manager.embedded",
        "Condition": "declop.typed.condition",
        "Request": "declop.kube.keys",
        "Phase": "declop.reconcile.result",
        "Result": "declop.reconcile.result",
        "add_finalizer": "declop.reconcile.finalizers",
        "contains_finalizer": "declop.reconcile.finalizers",
        "remove_finalizer": "declop.reconcile.finalizers",
        "acreate_or_update": "declop.reconcile.ownership",
        "aretry_on_conflict": "declop.reconcile.ownership",
        "create_or_update": "declop.reconcile.ownership",
        "retry_on_conflict": "declop.reconcile.ownership",
        "set_controller_reference": "declop.reconcile.ownership",
        "Steps": "declop.handlers.steps",
    }.get(name, "declop.errors")
    assert getattr(importlib.import_module(defining), name) is obj


def test_reprs_use_the_package_name() -> None:
    assert repr(declop.Request) == "<class 'declop.Request'>"
    assert repr(declop.NotFound("x")) == "NotFound('x')"
    assert declop.reconciler.__module__ == "declop"
    assert declop.reconciler.__qualname__ == "reconciler"


# -- what left the front door a release ago is gone: a plain AttributeError / ModuleNotFoundError --

#: names that left ``declop``'s namespace, served from there with a DeprecationWarning for one
#: release and gone since
GONE_NAMES = [
    "AlreadyOwnedError", "ApiError", "CacheNotSyncedError", "ConfigError", "DeclopError", "Forbidden", "InvalidResult",
    "Manager", "Options", "Priority", "RateLimit", "ReconcileLogger", "RegistrationError", "Registry", "Resource", "Trigger",
]

#: modules that sat at the top of the package, likewise
GONE_MODULES = [
    "declop.admission", "declop.batches", "declop.client", "declop.controller", "declop.conversion", "declop.devloop",
    "declop.discovery", "declop.events", "declop.finalizers", "declop.informer", "declop.keys", "declop.kubeconfig",
    "declop.labels", "declop.leader", "declop.manifests", "declop.mapping", "declop.metrics", "declop.metricsauth",
    "declop.ownership", "declop.patch", "declop.priorityqueue", "declop.probes", "declop.ratelimit", "declop.resource",
    "declop.result", "declop.scaffold", "declop.servingcert", "declop.sharding", "declop.shardlease", "declop.transport",
    "declop.trigger", "declop.webhook", "declop.webhookcert", "declop.webhookconfig", "declop.webhookserver",
    "declop.workqueue",
]


@pytest.mark.parametrize("name", GONE_NAMES)
def test_a_name_that_left_is_gone(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match=rf"^module 'declop' has no attribute '{name}'$"):
            getattr(declop, name)
    assert name not in declop.__all__


@pytest.mark.parametrize("old", GONE_MODULES)
def test_an_old_module_path_is_gone(old: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModuleNotFoundError, match=rf"^No module named '{re.escape(old)}'$"):
            importlib.import_module(old)
    assert not hasattr(declop, "MOVED_NAMES") and not hasattr(declop, "MOVED_MODULES")


def test_predicates_short_path_imports_names_from_the_module() -> None:
    namespace: dict[str, object] = {}
    exec("from declop.predicates import generation_changed", namespace)  # noqa: S102
    assert namespace["generation_changed"] is importlib.import_module("declop.reconcile.predicates").generation_changed


def test_the_old_cache_module_names_are_gone_from_the_package() -> None:
    """``declop.cache`` was one module; its names live in ``declop.cache.store`` since, and the
    deprecated path went in the release its warning promised."""
    with pytest.raises(ImportError):
        from declop.cache import clone  # noqa: F401
    from declop.cache.store import clone as moved

    assert moved is declop.clone


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        declop.NoSuchThing  # noqa: B018


def test_a_package_is_reachable_as_an_attribute() -> None:
    """``import declop`` then ``declop.manager.Options``: submodules load on first use."""
    assert declop.manager.Options is importlib.import_module("declop.manager").Options
    assert declop.errors.ApiError.__module__ == "declop.errors"


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


def test_import_declop_does_not_import_pydantic() -> None:
    """``declop.CustomResource`` and ``declop.Condition`` are lazy: a handler file without typed
    models never pays for pydantic — nor does using ``declop.conditions`` on dicts."""
    for name in ("CustomResource", "Condition"):
        code = (
            "import sys, declop; declop.conditions.set([], 'Ready', True, reason='Ok'); "
            f"assert 'pydantic' not in sys.modules, 'pydantic'; declop.{name}; assert 'pydantic' in sys.modules"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_declop_does_not_import_the_manager() -> None:
    """``declop.Operator`` is lazy: a handler file pays for the manager only when it embeds one."""
    code = (
        "import sys, declop; assert 'declop.manager' not in sys.modules; "
        "declop.Operator; assert 'declop.manager.process' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
