"""declop's example handler, run when the chart is given no handlers: it logs pods.

Replace it with yours: see `helm get notes RELEASE` or docs/deploy.md.
"""

import declop


@declop.reconciler("pods")
def example(request, client, logger, **_):
    try:
        client.get(request)  # served by the cache, never by the apiserver
    except declop.NotFound:
        logger.info("The pod was deleted")
        return None
    logger.info("Pod created")
    return None
