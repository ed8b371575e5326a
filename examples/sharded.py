"""Sharded mode: several replicas, each reconciling the ConfigMaps of its hash ranges.

    declop run examples/sharded.py --shards 4 --log-format json &   # replica 1
    declop run examples/sharded.py --shards 4 --log-format json &   # replica 2
    kubectl create configmap demo --from-literal=colour=blue
    kubectl label configmap demo sharded=yes                        # one of the two logs it

Each replica holds about half of the 4 range Leases (``kubectl get leases``: ``declop-member-*``
and ``declop-sharded-shard-<i>-of-4``) and logs ``ConfigMap seen`` only for ConfigMaps whose uid
hashes into one of its ranges; every line carries ``"shard": "<i>/4"``. Stop one replica and the
other takes its ranges and reconciles every ConfigMap in them again (docs/sharding.md).
"""

import declop


@declop.reconciler("configmaps", labels="sharded=yes", shard_by="uid")
def sharded(obj, logger, **_):
    if obj is None:
        logger.info("ConfigMap gone")
        return None
    logger.info("ConfigMap seen", keys=sorted((obj.get("data") or {})))
    return None
