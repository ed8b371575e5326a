# Kopf's 01-minimal: print the spec of a new KopfExample and give it a status.
# Lines of code (non-blank, non-comment): Kopf's example.py 6, this port 6.
#
#   kubectl apply -f examples/kopf/crd.yaml
#   declop run examples/kopf/01_minimal.py
#   kubectl apply -f examples/kopf/obj.yaml     # And here we are! Creating: {...}
#
# Kopf stores what on.create returns in status.create_fn and remembers in an annotation that
# the create was handled. Here the status is both: it is written once, and an object that has it
# is done, whatever woke the reconciler (a restart, a resync, a later edit).
import declop


@declop.reconciler("kopfexamples.kopf.dev")
def create_fn(request, client, obj, **_):
    if obj is not None and "create_fn" not in obj.get("status", {}):
        print(f"And here we are! Creating: {obj['spec']}")
        client.patch_status(request, {"status": {"create_fn": {"message": "hello world"}}})
