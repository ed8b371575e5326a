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
"""

from __future__ import annotations

from .version import __version__ as __version__

from . import conditions as conditions
from . import predicates as predicates
from .cache import clone as clone
from .client import AsyncClient as AsyncClient
from .client import Client as Client
from .errors import ApiError as ApiError
from .errors import CacheNotSyncedError as CacheNotSyncedError
from .errors import ConfigError as ConfigError
from .errors import Conflict as Conflict
from .errors import DeclopError as DeclopError
from .errors import Forbidden as Forbidden
from .errors import InvalidResult as InvalidResult
from .errors import NotFound as NotFound
from .errors import RegistrationError as RegistrationError
from .errors import TerminalError as TerminalError
from .finalizers import add_finalizer as add_finalizer
from .finalizers import contains_finalizer as contains_finalizer
from .finalizers import remove_finalizer as remove_finalizer
from .keys import Request as Request
from .logs import ReconcileLogger as ReconcileLogger
from .manager import Manager as Manager
from .manager import Options as Options
from .ownership import AlreadyOwnedError as AlreadyOwnedError
from .ownership import acreate_or_update as acreate_or_update
from .ownership import aretry_on_conflict as aretry_on_conflict
from .ownership import create_or_update as create_or_update
from .ownership import retry_on_conflict as retry_on_conflict
from .ownership import set_controller_reference as set_controller_reference
from .priorityqueue import Priority as Priority
from .ratelimit import RateLimit as RateLimit
from .registry import Registry as Registry
from .registry import background as background
from .registry import converter as converter
from .registry import index as index
from .registry import mutator as mutator
from .registry import on_shutdown as on_shutdown
from .registry import on_startup as on_startup
from .registry import reconciler as reconciler
from .registry import transform as transform
from .registry import validator as validator
from .resource import Resource as Resource
from .result import Phase as Phase
from .result import Result as Result
from .trigger import Trigger as Trigger
from .webhook import Rejected as Rejected

__all__ = [
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
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("declop.") and _name not in ("conditions", "predicates"):
        try:
            _obj.__module__ = "declop"
        except (AttributeError, TypeError):
            pass
del _name, _obj
