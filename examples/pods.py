"""The seed's controller: log when a pod exists and when it is gone.

    declop run examples/pods.py
    kubectl run nginx --image nginx      # INFO Pod created {...}
    kubectl label pod nginx env=prod     # INFO Pod created {...} again, with a new reconcileID
    kubectl delete pod nginx             # INFO Pod created {...}, then INFO The pod was deleted {...}

The handler never learns which event woke it: it reads the pod from the cache and decides
from what it finds. A delete first records ``deletionTimestamp`` (an update: the pod is still
there, "Pod created"), then the pod is gone ("The pod was deleted") — README.md tells the story.
"""

import declop


@declop.reconciler("pods")
def example(request, client, logger, **_):
    try:
        client.get(request)          # served by the cache, never by the apiserver
    except declop.NotFound:
        logger.info("The pod was deleted")
        return None
    logger.info("Pod created")
    return None
