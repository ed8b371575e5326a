"""A cleanup that cannot run twice: on deletion it reads the object's record (which external lease
to release), releases it, then deletes the record — and raises NotFound when the record is no
longer there. A cleanup retried after its delete had landed therefore fails for ever, and the
object stays in Terminating, its finalizer never released.

    declop sim examples/buggy/cleanup.py --seeds 5     # fails: finalizers, naming the get line

A cleanup runs again whenever the one before did not return: its delete landed but the answer
was lost (a timeout), a later write of the call was refused, the replica crashed — or the record
was never made, because the object was deleted before a reconcile created it.
"""

import declop

FINALIZER = "example.com/release-lease"
LEASE = "example.com/lease"


@declop.reconciler("configmaps", finalizer=FINALIZER)
def lease(request, client, logger, obj, phase, **_):
    if obj is None:
        return
    name = declop.Request(request.namespace, f"{request.name}-record")
    if phase is declop.Phase.DELETING:
        record = client.get("secrets", name)  # NotFound once an earlier attempt deleted it
        logger.info("Releasing the external lease", lease=record["metadata"]["annotations"][LEASE])
        client.delete("secrets", name)
        return
    try:
        client.get("secrets", name)
        return
    except declop.NotFound:
        pass
    record = {"metadata": {"name": name.name, "namespace": name.namespace, "annotations": {LEASE: obj["metadata"]["uid"]}}}
    try:
        client.create("secrets", record)
    except declop.Conflict:
        pass  # created meanwhile: what we wanted
