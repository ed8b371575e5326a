"""The work queue: which keys wait, in what order, and how fast failures come back.

Owns the deduplicating workqueue (client-go's semantics: fair, stingy, re-add while processing,
shutdown), the priority queue on top of it, the retry rate limiters and token buckets, and the
batching of keys a worker takes at once. Knows keys as opaque hashable values; knows nothing of
Kubernetes. May import only the top-level base modules (``errors``, ``clock``).
"""
