"""The operator's own HTTP endpoints, apart from webhooks: health probes and Prometheus metrics.

Owns the probe server (``/healthz``, ``/readyz``), the metrics collectors and their exposition,
authentication and authorization of metrics scrapes (TokenReview, SubjectAccessReview), and the
serving certificate those servers (and the webhook server) load and reload. May import the base
modules, ``declop.queue``, ``declop.kube``, ``declop.cache`` and ``declop.reconcile`` (the
controller's metric hooks).
"""
