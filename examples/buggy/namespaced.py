"""Correct, and watching one namespace: only objects in ``default`` are its business.

    declop sim examples/buggy/namespaced.py --seeds 5     # 0 failed

The simulated workload is derived from the registrations: objects outside the namespaces a
handler watches (or its label and field selectors) are still created, and never reported as
"not reconciled".
"""

import declop


@declop.reconciler("configmaps", namespaces=["default"])
def note(request, client, obj, **_):
    if obj is None:
        return
    if (obj.get("metadata", {}).get("labels") or {}).get("example.com/seen") != "yes":
        client.patch("configmaps", request, {"metadata": {"labels": {"example.com/seen": "yes"}}})
