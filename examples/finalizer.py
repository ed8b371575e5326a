"""A managed finalizer: external cleanup that must run before a ConfigMap may disappear.

Label a ConfigMap ``declop.example/backup=true`` and this controller "registers" it with an
external system (here: a log line and an annotation). When the ConfigMap is deleted, the
apiserver keeps it (deletionTimestamp set) until the cleanup below has succeeded; declop then
removes the finalizer and the object goes away.

Every branch is idempotent: running it twice does no harm, and cleanup tolerates a
registration that never happened.
"""

import declop

FINALIZER = "declop.example/backup"


@declop.reconciler("configmaps", finalizer=FINALIZER, labels="declop.example/backup=true")
def backup(request, client, logger, phase, obj, **_):
    if phase is declop.Phase.DELETED:
        logger.info("Gone; nothing left to do")
        return None
    if phase is declop.Phase.DELETING:
        logger.info("Releasing the external copy", finalizers=obj["metadata"].get("finalizers"))
        return None  # the framework removes our finalizer after this returns
    registered = (obj["metadata"].get("annotations") or {}).get("declop.example/registered")
    if phase is declop.Phase.CREATED or registered != obj["metadata"]["uid"]:
        logger.info("Registering an external copy", phase=phase.value)
        client.patch(request, {"metadata": {"annotations": {"declop.example/registered": obj["metadata"]["uid"]}}})
        return None
    logger.info("Up to date", phase=phase.value)
    return None
