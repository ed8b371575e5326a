# Kopf's 08-events: raw-event handlers, one that always fails and one that prints what it gets.
# Lines of code (non-blank, non-comment): Kopf's example.py 8 (without its 2 lines of E2E_ test
# marks), this port 7.
#
#   declop run examples/kopf/08_events.py
#   kubectl apply -f examples/kopf/obj.yaml    # Seen: default/kopf-example-1 at resourceVersion ...
#   kubectl delete -f examples/kopf/obj.yaml   # Seen: default/kopf-example-1 gone
#
# declop hands no event to a handler: any event of the object wakes its reconciler, which reads
# the object as the cache has it now (None once it is gone). Kopf logs a failing on.event handler
# and does not retry it; declop.TerminalError says the same: logged, counted, not retried.
import declop


@declop.reconciler("kopfexamples.kopf.dev")
def event_fn_with_error(**_):
    raise declop.TerminalError("Oops!")


@declop.reconciler("kopfexamples.kopf.dev")
def normal_event_fn(request, obj, **_):
    print(f"Seen: {request} " + ("gone" if obj is None else f"at resourceVersion {obj['metadata']['resourceVersion']}"))
