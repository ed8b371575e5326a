"""``orphan.py`` fixed: the child Secret names its ConfigMap as its controller owner.

    declop sim examples/buggy/orphan_fixed.py --seeds 5     # 0 failed

With an ownerReference (``declop.set_controller_reference``), the garbage collector deletes the
Secret once the ConfigMap is gone: the handler has nothing to do on deletion. A child meant to
outlive its parent says so instead, with the annotation ``sim.declop.dev/outlives-parent: "true"``.
"""

import declop


@declop.reconciler("configmaps", owns=["secrets"])
def make_child(request, client, obj, **_):
    if obj is None:
        return  # gone: the garbage collector deletes the child (its ownerReference)
    name = f"{request.name}-child"
    try:
        client.get("secrets", declop.Request(request.namespace, name))
        return
    except declop.NotFound:
        pass
    child = {"metadata": {"name": name, "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)
    try:
        client.create("secrets", child)
    except declop.Conflict:
        pass  # created meanwhile: what we wanted
