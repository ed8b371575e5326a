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
``declop.CustomResource`` (the base of a typed custom resource, docs/typed.md) and
``declop.Condition`` (a typed status condition) are loaded on first use: ``import declop`` does
not import pydantic.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

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
from declop.errors import TemporaryError as TemporaryError
from declop.errors import TerminalError as TerminalError
from declop.handlers.steps import Steps as Steps
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
from declop.registry import daemon as daemon
from declop.registry import index as index
from declop.registry import mutator as mutator
from declop.registry import on_login as on_login
from declop.registry import on_probe as on_probe
from declop.registry import on_shutdown as on_shutdown
from declop.registry import on_startup as on_startup
from declop.registry import reconciler as reconciler
from declop.registry import timer as timer
from declop.registry import transform as transform
from declop.registry import validator as validator
from declop.webhooks.declaration import Rejected as Rejected

if TYPE_CHECKING:
    from declop.typed.condition import Condition as Condition
    from declop.manager.embedded import Operator as Operator
    from declop.typed.model import CustomResource as CustomResource

__all__ = [
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
]

#: front-door names loaded on first use (they import pydantic; ``Operator``, the manager)
LAZY_NAMES = {"Condition": "declop.typed.condition", "CustomResource": "declop.typed.model", "Operator": "declop.manager.embedded"}

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

#: ``import declop.predicates`` (and ``from declop.predicates import …``): its short public path
sys.modules[f"{__name__}.predicates"] = predicates


def __getattr__(name: str) -> Any:
    """Lazy names, and submodules on first use (``declop.manager.Options``)."""
    lazy = LAZY_NAMES.get(name)
    if lazy is not None:
        value = getattr(importlib.import_module(lazy), name)
        globals()[name] = value
        return value
    module = f"{__name__}.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
    raise AttributeError(f"module 'declop' has no attribute {name!r}")
