"""The shared in-memory cache and the informers that keep it current.

Owns the store (one writer, many read-only readers, indexes) and the informer: list strategies
(streaming, paged, metadata-only), the watch loop with its resume, relist and backoff rules,
server- or client-side shard filtering, and the pool that shares one informer per (resource,
namespace, selector). Knows nothing of handlers or queues: subscribers are plain callables. May
import the base modules, ``declop.kube`` and ``declop.leases`` (the shard hash).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: what ``declop.cache`` held when it was one module; now in ``declop.cache.store``
_STORE_NAMES = frozenset(
    {"IndexFunc", "ReadOnlyDict", "ReadOnlyList", "Store", "Transform", "Writer", "clone", "guarded",
     "readonly", "strip_managed_fields"}
)


def __getattr__(name: str) -> Any:
    if name in _STORE_NAMES:
        warnings.warn(
            f"declop.cache.{name} moved to declop.cache.store.{name}; import it from there "
            "(the old path goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("declop.cache.store"), name)
    raise AttributeError(f"module 'declop.cache' has no attribute {name!r}")
