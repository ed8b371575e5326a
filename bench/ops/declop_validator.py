"""declop's validator under test (bench/admission.py): allows everything, with declop's defaults.

Run as ``python -m declop run bench/ops/declop_validator.py --webhook-port P --webhook-name N
--webhook-namespace NS --kubeconfig KC``: the webhook server, its CA in a Secret of NS, and the
ValidatingWebhookConfiguration N with the local URL form (the apiserver runs on this host).
A plain ``def``, as Kopf's (both run it in a thread pool); it reads the object, as a real
validator would, and returns ``None`` (allow). ``failure_policy="Ignore"`` so that a stopped
process never blocks the harness's next writes.
"""

import os

import declop

RESOURCE = os.environ.get("BENCH_RESOURCE", "configmaps")


@declop.validator(RESOURCE, operations=("CREATE", "UPDATE"), failure_policy="Ignore")
def allow(obj, **_):
    (obj.get("metadata") or {}).get("annotations")
    return None
