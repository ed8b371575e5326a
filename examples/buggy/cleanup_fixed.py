"""``cleanup.py`` fixed: a cleanup that finds no record has nothing left to release.

    declop sim examples/buggy/cleanup_fixed.py --seeds 5     # 0 failed

The cleanup may run again after an attempt whose delete landed (its answer lost, the replica
crashed), or for an object whose record was never made: a NotFound of the record means done.
Transient errors (a timeout, 409, 429, 5xx) propagate, and the call is retried.
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
        try:
            record = client.get("secrets", name)
        except declop.NotFound:
            return  # released and deleted by an earlier attempt, or never made: done
        logger.info("Releasing the external lease", lease=record["metadata"]["annotations"][LEASE])
        client.delete("secrets", name)  # NotFound is success
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
