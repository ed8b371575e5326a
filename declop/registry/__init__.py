"""The registry: what the decorators declare, held until a manager runs it.

``@declop.reconciler`` records reconcilers and ``@declop.timer`` timers (a runner as a
reconciler, :mod:`declop.handlers.timers`); ``declop.index`` and ``declop.transform`` the cache's
indexes and transforms; ``@declop.on_startup``, ``@declop.on_shutdown`` and
``@declop.background`` lifecycle hooks, ``@declop.on_probe`` values, ``@declop.on_login`` credentials; ``@declop.daemon`` per-object daemons; ``@declop.validator``, ``@declop.mutator`` and
``@declop.converter`` webhooks. The manager reads them at start.

Owns: the reconciler options, named, defaulted and checked once (``options``); a decorator
call's forwarding and its refused mistakes (``calls``); what a handler's signature declares
(``signatures``); the :class:`Registry` (``registry``); the module-level decorators bound to
:data:`default_registry` (``decorators``).

This package replaced the module ``declop/registry.py``: its ``__init__`` re-exports the names
users import from ``declop.registry`` (``Registry``, ``default_registry``, the decorators …) and
holds nothing else. ``declop.registry.default_registry`` is the attribute ``declop dev`` and tests
swap; the decorators read it here when called.

May import: the base, ``queue``, ``kube``, ``leases``, ``reconcile``, ``lifecycle``, ``handlers``, ``webhooks``.
"""

from declop.registry.decorators import RECONCILER_OPTIONS as RECONCILER_OPTIONS
from declop.registry.decorators import background as background
from declop.registry.decorators import converter as converter
from declop.registry.decorators import daemon as daemon
from declop.registry.decorators import default_registry as default_registry
from declop.registry.decorators import index as index
from declop.registry.decorators import mutator as mutator
from declop.registry.decorators import on_login as on_login
from declop.registry.decorators import on_probe as on_probe
from declop.registry.decorators import on_shutdown as on_shutdown
from declop.registry.decorators import on_startup as on_startup
from declop.registry.decorators import reconciler as reconciler
from declop.registry.decorators import timer as timer
from declop.registry.decorators import transform as transform
from declop.registry.decorators import validator as validator
from declop.registry.options import ReconcilerOptions as ReconcilerOptions
from declop.registry.registry import IndexRegistration as IndexRegistration
from declop.registry.registry import Registration as Registration
from declop.registry.registry import Registry as Registry
from declop.registry.signatures import INJECTABLE as INJECTABLE

__all__ = [
    "INJECTABLE",
    "RECONCILER_OPTIONS",
    "IndexRegistration",
    "ReconcilerOptions",
    "Registration",
    "Registry",
    "background",
    "converter",
    "daemon",
    "default_registry",
    "index",
    "mutator",
    "on_login",
    "on_probe",
    "on_shutdown",
    "on_startup",
    "reconciler",
    "timer",
    "transform",
    "validator",
]
