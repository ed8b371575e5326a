# Kopf's 02-children: a KopfExample gets a Pod of its own, whose uid goes to the status.
# Lines of code (non-blank, non-comment): Kopf's example.py 28, this port 22.
#
#   declop run examples/kopf/02_children.py
#   kubectl apply -f examples/kopf/obj.yaml
#   kubectl get pod kopf-example-1 -o yaml      # owned by the KopfExample; gone with it
#
# Level-triggered: the Pod is named after its owner, so "is it there?" is a cache read and a
# repeated create fails with AlreadyExists (retried: by then the cache has it) instead of making a
# second Pod. A Pod deleted by hand comes back; Kopf's on.create would not notice. owns= wakes
# the reconciler on every change of its Pod. The status is written only when it differs.
import declop


@declop.reconciler("kopfexamples.kopf.dev", owns=["pods"])
def create_fn(request, client, obj, **_):
    if obj is None:
        return  # the Pod goes with its owner (ownerReference)
    spec = obj["spec"]
    container = {
        "name": "the-only-one",
        "image": "busybox",
        "command": ["sh", "-x", "-c"],
        "args": [f'echo "FIELD=$FIELD"\nsleep {spec.get("duration", 0)}\n'],
        "env": [{"name": "FIELD", "value": str(spec.get("field", "default-value"))}],
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": request.name, "namespace": request.namespace}}
    pod["spec"] = {"containers": [container]}
    declop.set_controller_reference(pod, obj)  # kopf.adopt()
    try:
        uid = client.get("pods", request)["metadata"]["uid"]
    except declop.NotFound:
        uid = client.create("pods", pod)["metadata"]["uid"]
    if obj.get("status", {}).get("create_fn") != {"children": [uid]}:
        client.patch_status(request, {"status": {"create_fn": {"children": [uid]}}})
