"""A Widget operator: each Widget owns a ConfigMap holding its message, and reports status.

    kubectl apply -f examples/crd/widget-crd.yaml
    declop run examples/crd/handlers.py
    kubectl apply -f examples/crd/widget.yaml
    kubectl get widgets,configmaps

The ConfigMap carries a controller ownerReference, so deleting the Widget deletes it (garbage
collection), and editing or deleting the ConfigMap by hand wakes the Widget's reconciler
(``owns=``), which puts it back.
"""

import declop


def desired_configmap(widget):
    meta = widget["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{meta['name']}-widget",
            "namespace": meta["namespace"],
            "labels": {"app.kubernetes.io/managed-by": "declop", "example.com/widget": meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": widget["apiVersion"],
                    "kind": widget["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"message": widget["spec"].get("message", "")},
    }


@declop.reconciler("widgets.example.com", owns=["configmaps"])
def widget(request, client, logger, obj, **_):
    if obj is None:
        logger.info("Widget deleted; its ConfigMap is garbage-collected")
        return None
    want = desired_configmap(obj)
    name = want["metadata"]["name"]
    try:
        have = client.get("configmaps", name)
    except declop.NotFound:
        client.create(want)
        logger.info("Created ConfigMap", configmap=name)
    else:
        if have.get("data") != want["data"]:
            client.patch("configmaps", name, {"data": want["data"]})
            logger.info("Repaired ConfigMap", configmap=name)
    status = {"observedGeneration": obj["metadata"].get("generation"), "configMap": name}
    if {k: (obj.get("status") or {}).get(k) for k in status} != status:
        client.patch_status(request, {"status": status})
    return None
