"""An orphan: every ConfigMap gets a child Secret, with no ownerReference.

    declop sim examples/buggy/orphan.py --seeds 5     # FAIL ... ownership, and the line below

The handler is idempotent (create if missing) and quiet, but when the ConfigMap is deleted its
Secret stays for ever: nothing says it belongs to the ConfigMap, so the garbage collector never
deletes it. ``orphan_fixed.py`` sets the ConfigMap as the child's controller owner.
"""

import declop


@declop.reconciler("configmaps", owns=["secrets"])
def make_child(request, client, obj, **_):
    if obj is None:
        return
    name = f"{request.name}-child"
    try:
        client.get("secrets", declop.Request(request.namespace, name))
        return
    except declop.NotFound:
        pass
    try:
        client.create("secrets", {"metadata": {"name": name, "namespace": request.namespace}})
    except declop.Conflict:
        pass  # created meanwhile: what we wanted
