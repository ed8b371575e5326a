"""The reconcile contract and the controller that runs it.

Owns what a handler sees and returns (``Result``, ``Phase``, the trigger that says why a key was
queued), the client handlers read and write with and the write helpers (create-or-update,
conflict retry, owner references, finalizers, Events), predicates and key mappings, the
declaration of one reconciler (``Registration``), and the controller: fence, prepare, call and
settle each key taken from the queue. May import the base modules, ``declop.queue``,
``declop.kube``, ``declop.leases`` and ``declop.cache``.
"""
