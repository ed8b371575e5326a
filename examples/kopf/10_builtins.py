# Kopf's 10-builtins: handle a built-in resource. Every pod outside kube-* is deleted 30 s after
# its creation, unless it is gone before.
# Lines of code (non-blank, non-comment): Kopf's example.py 34, this port 15.
#
#   POD_LIFETIME=30 declop run examples/kopf/10_builtins.py
#   kubectl run doomed --image busybox -- sleep 3600    # === Pod killing happens in 30s. ... NOW!
#
# Kopf starts an asyncio task per pod, keeps them in a dict and cancels one on the pod's
# deletion; a restart forgets them all and resumes with a fresh 30 s. Here the deadline is
# derived from the pod itself (creationTimestamp + lifetime): the reconciler asks to be called
# again when it is due (Result(requeue_after=...), an in-process timer, no API write), and a
# pod that is gone is simply not found. It survives restarts and failover: nothing to remember.
import datetime
import os

import declop

LIFETIME = float(os.environ.get("POD_LIFETIME", "30"))


@declop.reconciler("pods")
def pod_killer(request, client, logger, obj, **_):
    if obj is None or request.namespace.startswith("kube-") or obj["metadata"].get("deletionTimestamp"):
        return None
    born = datetime.datetime.fromisoformat(obj["metadata"]["creationTimestamp"])
    left = LIFETIME - (datetime.datetime.now(datetime.timezone.utc) - born).total_seconds()
    if left > 0:
        logger.info(f"=== Pod killing happens in {left:.0f}s.")
        return declop.Result(requeue_after=left)
    logger.info("=== Pod killing happens NOW!")
    client.delete("pods", request)
