"""``crash.py`` fixed: the child is named after its parent, so a reconcile finds what an
interrupted one created.

    declop sim examples/buggy/crash_fixed.py --seeds 5     # 0 failed

Whatever a replica did before it died is in the cluster, not in a record it meant to write
next: look the child up by a name derived from the parent (or by a label, or an ownerReference)
and treat 409 AlreadyExists as "it is there". The annotation is kept, as a note for people; the
handler never decides from it.
"""

import declop
from declop.errors import ApiError  # declop.Conflict (409) and every other refusal

ANNOTATION = "example.com/child"


@declop.reconciler("configmaps", owns=["secrets"])
def make_child(request, client, obj, **_):
    if obj is None:
        return  # gone: the garbage collector deletes the child (its ownerReference)
    name = f"{request.name}-child"
    try:
        client.get("secrets", declop.Request(request.namespace, name))
    except declop.NotFound:
        child = {"metadata": {"name": name, "namespace": request.namespace}}
        declop.set_controller_reference(child, obj)
        try:
            client.create("secrets", child)
        except declop.Conflict:
            pass  # created meanwhile (409 AlreadyExists): what we wanted
    if (obj["metadata"].get("annotations") or {}).get(ANNOTATION) == name:
        return
    for attempt in range(5):  # the note: a conflict or a throttle is retried at once
        try:
            client.patch("configmaps", request, {"metadata": {"annotations": {ANNOTATION: name}}})
            return
        except ApiError:
            if attempt == 4:
                raise
