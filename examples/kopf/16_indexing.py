# Kopf's 16-indexing: index pods by name and by label, and keep the names of the running ones in
# a KopfExample's status.
# Lines of code (non-blank, non-comment): Kopf's example.py 26 (without its line of E2E_ test
# marks), this port 17.
#
#   declop run examples/kopf/16_indexing.py -n default
#   kubectl apply -f examples/kopf/obj.yaml
#   kubectl run web --image nginx -l somelabel=somevalue
#   kubectl get kex kopf-example-1 -o jsonpath='{.status}'   # {"running-pods": [...], "labelled-pods": [...]}
#
# A declop index maps each cached object to the values it is found under; a lookup
# (client.list(..., index=(name, value))) is a dictionary access, with no API call. Kopf recomputes
# the status on a 5 s timer; here every change of a pod wakes the KopfExamples of its namespace
# (watches=), so the status follows the pods at once and nothing runs while nothing changes.
# Kopf's probes that report the index sizes: declop has no probe hook (/healthz and /metrics).
import declop

KEX = "kopfexamples.kopf.dev"
declop.index("pods", "phase", lambda pod: [(pod.get("status") or {}).get("phase")])
declop.index("pods", "by_label", lambda pod: [f"{k}={v}" for k, v in (pod["metadata"].get("labels") or {}).items()])


def examples_near(pod, client):
    return client.list(KEX, namespace=pod["metadata"]["namespace"])


@declop.reconciler(KEX, watches=[("pods", examples_near)])
def running_pods(request, client, obj, **_):
    if obj is None:
        return
    running = client.list("pods", index=("phase", "Running"), namespace=request.namespace)
    labels = [f"{k}={v}" for k, v in (obj["metadata"].get("labels") or {}).items()]
    labelled = {p["metadata"]["name"] for label in labels
                for p in client.list("pods", index=("by_label", label), namespace=request.namespace)}
    status = {"running-pods": sorted(p["metadata"]["name"] for p in running), "labelled-pods": sorted(labelled)}
    if {k: obj.get("status", {}).get(k) for k in status} != status:
        client.patch_status(request, {"status": status})
