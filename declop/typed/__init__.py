"""Typed custom resources: a pydantic model per kind, and the CRD generated from it.

A custom resource is a :class:`CustomResource` subclass whose class keywords name the kind
(``group``, ``version``, ``kind`` …) and whose ``spec`` and ``status`` fields are pydantic models.
The same class gives a handler a validated, typed view of the cached object (``obj: Widget``), the
CRD that ``declop crd`` prints, and the resource name a decorator takes (``@declop.reconciler(Widget)``).
docs/typed.md is the guide.

May import: the base (``errors``, ``logs`` …) and pydantic; every layer below may
import it. ``declop.typed.model`` is the public home of the names (``from declop.typed.model
import CustomResource``).
"""

