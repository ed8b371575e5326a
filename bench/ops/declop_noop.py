"""declop under test: a no-op reconciler with defaults (plain ``def``, max_concurrent=1).

Run as ``python -m declop run bench/ops/declop_noop.py -n <ns> --kubeconfig <kc>``.
It reads the object from the cache with ``client.get(request)`` (a deep copy, no API call).
"""

import os
import sys
import time

import declop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import record, record_missing  # noqa: E402

RESOURCE = os.environ.get("BENCH_RESOURCE", "configmaps")


if not os.environ.get("BENCH_DECLOP_ASYNC"):

    @declop.reconciler(RESOURCE)
    def noop(request, client, **_):
        started = time.time_ns()
        try:
            obj = client.get(request)
        except declop.NotFound:
            record_missing(started, request.namespace, request.name)
            return None
        record(started, request.namespace, request.name, obj["metadata"].get("annotations"))
        return None

else:  # experiment only (bench/profile_a2.py --experiments async): the same handler as `async def`

    @declop.reconciler(RESOURCE)
    async def noop(request, client, **_):
        started = time.time_ns()
        try:
            obj = client.get(request)
        except declop.NotFound:
            record_missing(started, request.namespace, request.name)
            return None
        record(started, request.namespace, request.name, obj["metadata"].get("annotations"))
        return None
