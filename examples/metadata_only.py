"""A metadata-only controller: keep an inventory of Secrets without caching what is in them.

    declop run examples/metadata_only.py
    kubectl create secret generic db --from-literal=password=s3cret
    # INFO Secret seen {"controller": "inventory", ..., "name": "db", "labels": 0}
    kubectl annotate secret db example.com/audit=true
    # INFO Secret audited {"controller": "inventory", ..., "name": "db", "keys": 1}

With ``metadata_only=True`` the informer lists and watches ``PartialObjectMetadata``: the cache
holds each Secret's ``metadata`` and nothing else, so a cluster's worth of certificates and
tokens is never held in this process's memory (nor needs decoding). ``obj`` and ``client.get``
hold metadata only — ``obj["data"]`` does not exist. When the body is needed, the handler reads
it **explicitly**, straight from the apiserver, with ``client.live.get(request)``: here only for
Secrets annotated ``example.com/audit=true``. Nothing in a Secret's data is ever logged: the
audit counts its keys.
"""

import declop

AUDIT = "example.com/audit"


@declop.reconciler("secrets", metadata_only=True)
def inventory(request, client, obj, logger, **_):
    if obj is None:
        logger.info("Secret gone")
        return None
    meta = obj["metadata"]  # obj is metadata only: kind PartialObjectMetadata, no "data"
    logger.info("Secret seen", labels=len(meta.get("labels") or {}))
    if (meta.get("annotations") or {}).get(AUDIT) == "true":
        secret = client.live.get(request)  # one GET to the apiserver: the whole Secret
        logger.info("Secret audited", keys=len(secret.get("data") or {}))
    return None
