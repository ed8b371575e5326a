"""Talking to a Kubernetes apiserver: configuration, HTTP, discovery and the object vocabulary.

Owns kubeconfig and in-cluster loading, the asyncio HTTP transport (retries, client-side rate
limit, streaming decode), API discovery (plural ↔ kind, scope, verbs), label selectors, resource
names with their cache options, an object's key (``Request``: namespace/name), and the write
fence the transport checks for a reconcile call under a Lease (``fencing``). Holds no
objects and runs no loops of its own. May import the base modules and ``declop.queue`` (for the
client-side token bucket).
"""
