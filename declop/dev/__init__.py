"""The developer's loop: ``declop dev``, ``declop manifests`` and ``declop new``.

Owns the reload loop that runs handlers against a local control plane and restarts them on a
saved file, the RBAC/CRD/chart manifests generated from a handlers module, and the project
scaffold with its templates. Nothing in the running operator imports it. May import anything
except ``declop.cli`` and ``declop.testing``.
"""
