"""Handler kinds beyond the plain reconciler: timers, daemons, per-step progress and field changes.

Each kind is a *runner* in a module of its own (``timers``, ``daemons``, ``steps``, ``changes``).
A runner turns what the user decorated into a :class:`~declop.reconcile.registration.Registration`
the ordinary :class:`~declop.reconcile.controller.Controller` runs, so every kind gets the
controller's filters, predicates, priorities, key ownership (leader or shard range), fencing and
retries without a line of its own; what a kind adds is derived from state (the object, a record
declop keeps on it, the clock), never from which event arrived. May import the base modules,
``declop.queue``, ``declop.kube``, ``declop.leases``, ``declop.cache``, ``declop.reconcile`` and
``declop.lifecycle``.
"""
