"""Not crash-safe: the child's name is recorded in a second write, and a missing record means
"create one".

    declop sim examples/buggy/crash.py --seeds 5     # FAIL ... crash-safety, and the line below

The handler creates a child Secret with ``generateName`` and then records its name in an
annotation of the ConfigMap (retrying that write until it lands, so a 409 or a throttle does no
harm). It is idempotent and quiet, and its child is owned — until a replica dies between the
create and the record: the next reconcile finds no record and creates a second child, which
stays for as long as the ConfigMap does. ``crash_fixed.py`` names the child after its parent, so
the next reconcile finds the child an interrupted one created.
"""

import declop
from declop.errors import ApiError  # declop.Conflict (409) and every other refusal

ANNOTATION = "example.com/child"


@declop.reconciler("configmaps", owns=["secrets"])
def make_child(request, client, obj, **_):
    if obj is None:
        return  # gone: the garbage collector deletes the child (its ownerReference)
    if (obj["metadata"].get("annotations") or {}).get(ANNOTATION):
        return  # recorded: made already
    child = {"metadata": {"generateName": f"{request.name}-", "namespace": request.namespace}}
    declop.set_controller_reference(child, obj)
    made = client.create("secrets", child)
    record = {"metadata": {"annotations": {ANNOTATION: made["metadata"]["name"]}}}
    for attempt in range(5):  # the record must land: a conflict or a throttle is retried at once
        try:
            client.patch("configmaps", request, record)
            return
        except ApiError:
            if attempt == 4:
                raise
