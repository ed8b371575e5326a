"""``idempotence.py`` fixed: the child is named after its parent, so a repeated reconcile finds it.

    declop sim examples/buggy/idempotence_fixed.py --seeds 5     # 0 failed

A reconcile decides from what is there, not from what happened: the Secret has a name derived
from the ConfigMap's, the create is skipped when the cache already has it, and a create that
races another (409 AlreadyExists) is the same success.
"""

import declop


@declop.reconciler("configmaps", owns=["secrets"])
def make_child(request, client, obj, **_):
    if obj is None:
        return  # gone: the garbage collector deletes the child (its ownerReference)
    name = f"{request.name}-child"
    try:
        client.get("secrets", name)
        return
    except declop.NotFound:
        pass
    child = {"metadata": {"name": name, "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)
    try:
        client.create("secrets", child)
    except declop.Conflict:
        pass  # created meanwhile (by us, before a crash): what we wanted
