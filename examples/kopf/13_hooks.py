# Kopf's 13-hooks: startup and cleanup hooks, and a task per pod that serves it every few seconds
# until the operator stops.
# Lines of code (non-blank, non-comment): Kopf's example.py 65 (without its 3 lines of E2E_ test
# marks), this port 14.
#
#   declop run examples/kopf/13_hooks.py
#   kubectl run sleepy --image busybox -- sleep 3600    # Served by the periodic reconcile. (every 1-10 s)
#   ^C                                                  # Cleaning up...
#
# What is not here, and why:
# - Kopf's lock made at startup guards its dict of per-pod tasks: there is no such dict here. A
#   pod is "served" by its reconciler asking to be called again in 1-10 s (Result(requeue_after=)):
#   in-process, no API write, nothing to stop at cleanup, gone with the pod.
# - A startup hook that raises kopf.TemporaryError is retried by Kopf. A declop startup hook that
#   raises fails the start (exit 1, one line naming the hook): retry inside it if you must, or let
#   the Deployment restart the pod.
# - @kopf.on.login: declop finds credentials as client-go does (--kubeconfig, $KUBECONFIG,
#   in-cluster, exec plugins, rotating tokens). @kopf.on.probe: `--health-port` serves /healthz and
#   /readyz, `--metrics-port` Prometheus metrics (the number of reconciles per controller).
import random

import declop


@declop.on_startup
def startup_fn(logger, **_):
    # before any cache runs: read with client.live.get / client.live.list if you must
    logger.info("Starting up...")


@declop.on_shutdown
def cleanup_fn(logger, **_):
    logger.info("Cleaning up...")


@declop.reconciler("pods")
def pod_task(logger, obj, **_):
    if obj is None:
        return None
    logger.info("Served by the periodic reconcile.")
    return declop.Result(requeue_after=random.randint(1, 10))
