# Kopf's 04-events: post Kubernetes Events about the object being handled.
# Lines of code (non-blank, non-comment): Kopf's example.py 14, this port 11.
#
#   declop run examples/kopf/04_events.py
#   kubectl apply -f examples/kopf/obj.yaml
#   kubectl describe kex kopf-example-1        # Normal and Warning events, reason SomeReason
#
# kopf.event / kopf.info / kopf.warn / kopf.exception are all client.event(obj, reason, message,
# type=...). Kubernetes takes only the types "Normal" and "Warning": Kopf's type="SomeType" is
# refused by the apiserver, and declop's client refuses it before sending (ValueError).
# "On create" is the CREATED phase: it needs a finalizer of ours, which declop adds before the
# first call and removes on deletion; CREATED is repeated until a call succeeds.
import declop


@declop.reconciler("kopfexamples.kopf.dev", finalizer="kopf.dev/events-example")
def create_fn(client, phase, obj, **_):
    if phase is not declop.Phase.CREATED:
        return
    client.event(obj, "SomeReason", "Some message")  # kopf.event(), kopf.info()
    client.event(obj, "SomeReason", "Some message", type="Warning")  # kopf.warn()
    try:
        raise RuntimeError("Exception text.")
    except Exception as e:
        client.event(obj, "SomeReason", f"Some exception: {e!r}", type="Warning")  # kopf.exception()
