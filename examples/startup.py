"""Lifecycle hooks: check a setting before anything starts, greet ConfigMaps, say goodbye.

    declop run examples/startup.py
    # declop: error: startup hook 'load_settings' failed: LookupError: ConfigMap default/greeter-settings
    #   is missing; create it with data.greeting ...; the operator did not start      (exit 1)
    kubectl create configmap greeter-settings --from-literal=greeting=Hello
    declop run examples/startup.py
    # INFO Settings loaded {"hook": "load_settings", "greeting": "Hello"}
    kubectl create configmap world && kubectl label configmap world greet=yes
    # INFO Hello, world {"controller": "greeter", ...}
    # (Ctrl-C)  INFO Goodbye {"hook": "goodbye", "greeted": 1}

``@declop.on_startup`` runs once, before any informer starts: the caches are empty, so it reads
with ``client.live``. Raising fails the start with one line and exit code 1 — better than
reconciling with a half-configured operator. ``@declop.on_shutdown`` runs after the in-flight
reconciles drained. The settings namespace is ``$GREETER_NAMESPACE`` (default ``default``).
"""

import os

import declop

NAMESPACE = os.environ.get("GREETER_NAMESPACE", "default")
settings = {}
greeted = set()


@declop.on_startup
def load_settings(client, logger):
    try:
        cm = client.live.get("configmaps", f"{NAMESPACE}/greeter-settings")
    except declop.NotFound:
        raise LookupError(
            f"ConfigMap {NAMESPACE}/greeter-settings is missing; create it with data.greeting "
            f"(kubectl create configmap greeter-settings -n {NAMESPACE} --from-literal=greeting=Hello)"
        ) from None
    settings["greeting"] = (cm.get("data") or {}).get("greeting", "Hello")
    logger.info("Settings loaded", greeting=settings["greeting"])


@declop.reconciler("configmaps", labels="greet=yes")
def greeter(name, obj, logger, **_):
    if obj is not None and name not in greeted:
        greeted.add(name)
        logger.info(f"{settings['greeting']}, {name}")


@declop.on_shutdown
def goodbye(logger):
    logger.info("Goodbye", greeted=len(greeted))
