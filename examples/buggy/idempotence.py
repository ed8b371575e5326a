"""Not idempotent: every reconcile creates one more child (``generateName``).

    declop sim examples/buggy/idempotence.py --seeds 5     # FAIL ... idempotence, and the line below

A reconcile must be safe to repeat: the same object, reconciled again with nothing changed, must
not change the world. ``generateName`` picks a new name on every create, so every call — a
resync, a restart, an update of the object — leaves one more Secret behind.
``idempotence_fixed.py`` names the child after its parent.
"""

import declop


@declop.reconciler("configmaps")
def make_child(request, client, obj, **_):
    if obj is None:
        return  # gone: the garbage collector deletes its children (their ownerReference)
    child = {"metadata": {"generateName": f"{request.name}-", "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)  # owned: this example's one bug is idempotence
    client.create("secrets", child)
