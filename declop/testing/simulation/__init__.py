"""Real declop code on virtual time under seeded faults: one process, a deterministic schedule
per seed, invariants checked as the run goes.

- ``loop``: the virtual-time event loop every run is driven by.
- ``leases``: the Lease families (replicas of the real Lease code and fences against one fake
  apiserver), ``python -m declop.testing.simulation.leases``.
- ``world``: real managers of several replicas against the fake apiserver and a simulated
  network, ``python -m declop.testing.simulation.world`` and ``declop sim``; its workload
  (``objects``, ``workload``, ``specs``), the checks of users' handlers (``props``,
  ``conflicts``, ``crash``, ``finalizers``, ``gc``), reports (``history``, ``shrink``,
  ``allow``) and :func:`declop.testing.simulate` (``simulate``).

May import: ``declop`` itself and :mod:`declop.testing.fakes` (never the real-cluster kit).
"""
