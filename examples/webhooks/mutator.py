"""A mutating webhook: Widgets get a default color and size, and a label saying so.

    kubectl apply -f examples/webhooks/widget-crd.yaml
    declop dev examples/webhooks/mutator.py
    kubectl apply -f - <<< '{"apiVersion": "webhooks.example.com/v1", "kind": "Widget",
                            "metadata": {"name": "plain"}, "spec": {}}'
    kubectl get widget.webhooks.example.com plain -o jsonpath='{.spec}'
    # {"color":"blue","size":1}

``obj`` is a copy: change it in place (or return a new one) and declop answers with the JSON
Patch between what the apiserver sent and what the function left — no patch at all when
nothing changed, so a Widget that already has both fields is stored as sent.
"""

import declop


@declop.mutator("widgets.webhooks.example.com", operations=("CREATE",))
def defaults(obj, logger):
    spec = obj.setdefault("spec", {})
    if "color" in spec and "size" in spec:
        return  # nothing to default: no patch
    spec.setdefault("color", "blue")
    spec.setdefault("size", 1)
    obj["metadata"].setdefault("labels", {})["webhooks.example.com/defaulted"] = "true"
    logger.info("Defaulted", color=spec["color"], size=spec["size"])
