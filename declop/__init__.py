"""declop: level-triggered Kubernetes operators in plain Python.

A reconciler is told *which* object (a key), never *what happened*; it reads the present state
from a shared cache kept current by informers and acts until the world matches what it wants::

    import declop

    @declop.reconciler("pods")
    def example(request, client, logger, **_):
        try:
            client.get(request)
        except declop.NotFound:
            logger.info("The pod was deleted")
            return None
        logger.info("Pod created")

Run it with ``declop run handlers.py``. The contract is in ``docs/contract.md``.

This namespace holds what a handler author uses every day: the decorators, the key and the
result, the client, the write helpers and the errors a handler catches or raises. Everything
else lives in the package that owns it and is imported from there (``declop.errors``,
``declop.manager``, ``declop.webhooks``, ``declop.testing`` …; docs/architecture.md lists them).
``declop.CustomResource`` (the base of a typed custom resource, docs/typed.md) is loaded on first
use: ``import declop`` does not import pydantic. Names that used to be here, and modules that used to sit at the top, still import for one
release with a :class:`DeprecationWarning` naming their new home.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from declop.version import __version__ as __version__
from declop.kube import truststore as _truststore

# Before any module below imports aiohttp: its two default TLS contexts read the system trust
# store when first handed to a connection, not at import (kube/truststore.py).
_truststore.import_aiohttp()

from declop import conditions as conditions
from declop.cache.store import clone as clone
from declop.errors import Conflict as Conflict
from declop.errors import Fenced as Fenced
from declop.errors import NotFound as NotFound
from declop.errors import TerminalError as TerminalError
from declop.kube.keys import Request as Request
from declop.reconcile import predicates as predicates
from declop.reconcile.client import AsyncClient as AsyncClient
from declop.reconcile.client import Client as Client
from declop.reconcile.finalizers import add_finalizer as add_finalizer
from declop.reconcile.finalizers import contains_finalizer as contains_finalizer
from declop.reconcile.finalizers import remove_finalizer as remove_finalizer
from declop.reconcile.ownership import acreate_or_update as acreate_or_update
from declop.reconcile.ownership import aretry_on_conflict as aretry_on_conflict
from declop.reconcile.ownership import create_or_update as create_or_update
from declop.reconcile.ownership import retry_on_conflict as retry_on_conflict
from declop.reconcile.ownership import set_controller_reference as set_controller_reference
from declop.reconcile.result import Phase as Phase
from declop.reconcile.result import Result as Result
from declop.registry import background as background
from declop.registry import converter as converter
from declop.registry import index as index
from declop.registry import mutator as mutator
from declop.registry import on_shutdown as on_shutdown
from declop.registry import on_startup as on_startup
from declop.registry import reconciler as reconciler
from declop.registry import transform as transform
from declop.registry import validator as validator
from declop.webhooks.declaration import Rejected as Rejected

if TYPE_CHECKING:
    import importlib.abc

    from declop.typed.model import CustomResource as CustomResource

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "CustomResource",
    "Fenced",
    "NotFound",
    "Phase",
    "Rejected",
    "Request",
    "Result",
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
]

#: front-door names loaded on first use (``declop.CustomResource`` imports pydantic)
LAZY_NAMES = {"CustomResource": "declop.typed.model"}

for _name in __all__:
    if _name in LAZY_NAMES:
        continue
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("declop.") and _name not in ("conditions", "predicates"):
        try:
            _obj.__module__ = "declop"
        except (AttributeError, TypeError):
            pass
del _name, _obj

#: names that left this namespace → the module that holds them now (importable, with a warning)
MOVED_NAMES = {
    "AlreadyOwnedError": "declop.reconcile.ownership",
    "ApiError": "declop.errors",
    "CacheNotSyncedError": "declop.errors",
    "ConfigError": "declop.errors",
    "DeclopError": "declop.errors",
    "Forbidden": "declop.errors",
    "InvalidResult": "declop.errors",
    "Manager": "declop.manager",
    "Options": "declop.manager",
    "Priority": "declop.queue.priority",
    "RateLimit": "declop.queue.ratelimit",
    "ReconcileLogger": "declop.logs",
    "RegistrationError": "declop.errors",
    "Registry": "declop.registry",
    "Resource": "declop.kube.resource",
    "Trigger": "declop.reconcile.trigger",
}

#: modules that used to sit at the top of the package → where they live now
MOVED_MODULES = {
    "declop.admission": "declop.webhooks.admission",
    "declop.batches": "declop.queue.batches",
    "declop.client": "declop.reconcile.client",
    "declop.controller": "declop.reconcile.controller",
    "declop.conversion": "declop.webhooks.conversion",
    "declop.devloop": "declop.dev.loop",
    "declop.discovery": "declop.kube.discovery",
    "declop.events": "declop.reconcile.events",
    "declop.finalizers": "declop.reconcile.finalizers",
    "declop.informer": "declop.cache.informer",
    "declop.keys": "declop.kube.keys",
    "declop.kubeconfig": "declop.kube.kubeconfig",
    "declop.labels": "declop.kube.labels",
    "declop.leader": "declop.leases.leader",
    "declop.manifests": "declop.dev.manifests",
    "declop.mapping": "declop.reconcile.mapping",
    "declop.metrics": "declop.serving.metrics",
    "declop.metricsauth": "declop.serving.metricsauth",
    "declop.ownership": "declop.reconcile.ownership",
    "declop.patch": "declop.webhooks.patch",
    "declop.predicates": "declop.reconcile.predicates",
    "declop.priorityqueue": "declop.queue.priority",
    "declop.probes": "declop.serving.probes",
    "declop.ratelimit": "declop.queue.ratelimit",
    "declop.resource": "declop.kube.resource",
    "declop.result": "declop.reconcile.result",
    "declop.scaffold": "declop.dev.scaffold",
    "declop.servingcert": "declop.serving.cert",
    "declop.sharding": "declop.leases.hashing",
    "declop.shardlease": "declop.leases.shards",
    "declop.transport": "declop.kube.transport",
    "declop.trigger": "declop.reconcile.trigger",
    "declop.webhook": "declop.webhooks.declaration",
    "declop.webhookcert": "declop.webhooks.certs",
    "declop.webhookconfig": "declop.webhooks.configuration",
    "declop.webhookserver": "declop.webhooks.server",
    "declop.workqueue": "declop.queue.workqueue",
}

#: old module paths that stay valid without a warning: ``declop.predicates`` is in ``__all__``
_SILENT = frozenset({"declop.predicates"})


def __getattr__(name: str) -> Any:
    """Lazy names, old names with a warning; submodules on first use (``declop.manager.Options``)."""
    lazy = LAZY_NAMES.get(name)
    if lazy is not None:
        value = getattr(importlib.import_module(lazy), name)
        globals()[name] = value
        return value
    home = MOVED_NAMES.get(name)
    if home is not None:
        warnings.warn(
            f"declop.{name} moved to {home}.{name}; import it from there (the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    old = f"{__name__}.{name}"
    if old in MOVED_MODULES:
        return importlib.import_module(old)  # through the finder below: warns unless silent
    try:
        return importlib.import_module(old)
    except ModuleNotFoundError as e:
        if e.name != old:
            raise
    raise AttributeError(f"module 'declop' has no attribute {name!r}")


class _MovedModuleFinder:
    """``import declop.workqueue`` gives ``declop.queue.workqueue`` itself (same module object,
    so state and ``isinstance`` are shared) and warns that the path is old.

    A finder and loader by protocol, not by the ``importlib.abc`` classes: importing those
    brings ``importlib.resources`` and ``tempfile`` (~10 ms of every start)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("importlib.abc.Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        new = MOVED_MODULES[old]
        if old not in _SILENT:
            warnings.warn(
                f"{old} moved to {new}; import it from there (the old path goes in the next release)",
                DeprecationWarning,
                stacklevel=2,
            )
        # the import statement returns sys.modules[old] after this: the real module
        sys.modules[old] = importlib.import_module(new)


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
