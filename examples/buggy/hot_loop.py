"""A hot loop: every reconcile patches an annotation of its own object, which wakes it again.

    declop sim examples/buggy/hot_loop.py --seeds 5     # FAIL ... quiescence, and the line below

The patch changes the object (a counter, one more each time), the change is an event of the
watched resource, the event queues the same object: the handler wakes itself for ever.
``hot_loop_fixed.py`` writes only when the value it wants differs from the one there.
"""

import declop


@declop.reconciler("configmaps")
def count(request, client, obj, **_):
    if obj is None:
        return
    seen = int((obj["metadata"].get("annotations") or {}).get("example.com/reconciles", "0"))
    client.patch("configmaps", request, {"metadata": {"annotations": {"example.com/reconciles": str(seen + 1)}}})
