"""The shared in-memory cache and the informers that keep it current.

Owns the store (one writer, many read-only readers, indexes) and the informer: list strategies
(streaming, paged, metadata-only), the watch loop with its resume, relist and backoff rules,
server- or client-side shard filtering, and the pool that shares one informer per (resource,
namespace, selector). Knows nothing of handlers or queues: subscribers are plain callables. May
import the base modules, ``declop.kube`` and ``declop.leases`` (the shard hash).
"""
