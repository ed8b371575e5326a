"""The real-cluster kit: a real etcd + kube-apiserver (+ controller-manager) and a real node
(containerd, kubelet) built from upstream sources, operators run against them as threads or
``declop run`` processes, faults between them (TCP and CONNECT proxies), and container images
built with BuildKit. Everything here starts real processes or touches the host; what it changes on
the host is recorded and undone (``runrecord``, ``recovery``).

May import: ``declop`` itself and :mod:`declop.testing.fakes` (never the simulation).
"""
