"""Fakes that need no cluster: an in-memory apiserver that records every write
(``apiserver``, with the resources it knows in ``resources``), the clients and the
``run_reconcile`` harness of a reconciler's unit tests (``client``), and a scriptable list/watch
HTTP endpoint for informer tests (``listwatch``).

May import: ``declop`` itself and each other.
"""
