"""One operator process: options, pre-flight checks, wiring, runnables, Leases and the stop order.

The public names users import from ``declop.manager`` (``Manager``, ``Options``,
``LOST_CLEANUP_SECONDS``, ``Operator``, ``LeaseLost``) are re-exported here from the modules that own them: this package took
the place of the ``declop/manager.py`` module, and its import path is part of the API.

May import everything below it: ``kube``, ``leases``, ``cache``, ``reconcile``, ``lifecycle``,
``serving``, ``webhooks`` and ``registry``.
"""

from declop.manager.embedded import LeaseLost, Operator
from declop.manager.loss import LOST_CLEANUP_SECONDS
from declop.manager.options import Options
from declop.manager.process import Manager

__all__ = ["LOST_CLEANUP_SECONDS", "LeaseLost", "Manager", "Operator", "Options"]
