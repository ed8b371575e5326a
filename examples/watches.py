"""Watching another resource: Widgets that name a Secret are reconciled when that Secret changes.

    declop crd examples/crd/handlers.py | kubectl apply -f -     # the Widget CRD, from its model
    declop run examples/watches.py
    kubectl create secret generic db --from-literal=password=s3cret
    kubectl apply -f - <<'EOF'
    apiVersion: example.com/v1
    kind: Widget
    metadata: {name: app}
    spec: {secretName: db}
    EOF
    kubectl create secret generic db --from-literal=password=changed --dry-run=client -o yaml | kubectl apply -f -
    # INFO Secret checksum recorded {"controller": "secret_checksum", ..., "name": "app", "secret": "db", ...}

A Secret carries no reference to the Widgets that use it, so ``owns=`` cannot help: the map function
given to ``watches=`` answers "which Widgets name this Secret?". It asks a cache **index**
(``declop.index``) rather than scanning every Widget: the index maps ``"namespace/secret"`` to the
Widgets whose ``spec.secretName`` says so, and is kept current as Widgets are created, edited
and deleted. A map function that declares a ``client`` parameter gets a cache reader (it runs on
the event loop: read only). Exactly the referencing Widgets are enqueued; the others never hear
of the change.

The reconciler is an ``async def``: it gets an ``AsyncClient`` whose writes are awaited.
"""

import hashlib
import json

import declop


def secret_of(widget):
    """The index function: the Secret a Widget names, as ``namespace/name`` (none if unset)."""
    name = (widget.get("spec") or {}).get("secretName")
    return [f"{widget['metadata']['namespace']}/{name}"] if name else []


declop.index("widgets.example.com", "by_secret", secret_of)


def widgets_for_secret(secret, client):
    """The map function of ``watches=``: a Secret → the Widgets that reference it, via the index."""
    meta = secret["metadata"]
    return client.list("widgets.example.com", index=("by_secret", f"{meta['namespace']}/{meta['name']}"))


def checksum(secret):
    data = json.dumps(secret.get("data") or {}, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]


@declop.reconciler("widgets.example.com", watches=[("secrets", widgets_for_secret)])
async def secret_checksum(request, client, logger, obj, **_):
    if obj is None:
        return None
    name = (obj.get("spec") or {}).get("secretName")
    if not name:
        return None
    try:
        value = checksum(client.get("secrets", name))  # the cache; never the API
    except declop.NotFound:
        value = ""
        logger.info("Waiting for the Secret", secret=name)
    if (obj.get("status") or {}).get("secretChecksum") != value:
        await client.patch_status(request, {"status": {"secretChecksum": value}})
        logger.info("Secret checksum recorded", secret=name, checksum=value)
    return None
