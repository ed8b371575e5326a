"""A conversion webhook: Gadgets stored as v1alpha1 are read and written as v1 too.

    kubectl apply -f examples/webhooks/gadget-crd.yaml
    declop dev examples/webhooks/converter.py       # sets the CRD's spec.conversion at start
    kubectl apply -f - <<< '{"apiVersion": "webhooks.example.com/v1", "kind": "Gadget",
                            "metadata": {"name": "g"}, "spec": {"replicas": 3, "appearance": {"color": "red"}}}'
    kubectl get gadgets.v1alpha1.webhooks.example.com g -o jsonpath='{.spec}'
    # {"color":"red","size":3}
    kubectl get gadgets.v1.webhooks.example.com g -o jsonpath='{.spec}'
    # {"appearance":{"color":"red"},"replicas":3}

One function converts both ways: ``desired_api_version`` says to which. declop sets
``apiVersion``, keeps ``metadata`` (only labels and annotations may change) and answers the
apiserver's batch; a conversion must lose nothing, or a round trip would.
"""

import declop

V1 = "webhooks.example.com/v1"


@declop.converter("gadgets.webhooks.example.com")
def convert(obj, desired_api_version):
    spec = obj.get("spec", {})
    if desired_api_version == V1:  # v1alpha1 -> v1
        new = {"replicas": spec.get("size"), "appearance": {"color": spec.get("color")}}
    else:  # v1 -> v1alpha1
        new = {"size": spec.get("replicas"), "color": spec.get("appearance", {}).get("color")}
    obj["spec"] = _without_none(new)


def _without_none(d):
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            value = _without_none(value)
        if value not in (None, {}):
            out[key] = value
    return out
