# Kopf's examples/05-handlers, ported: 25 lines of code there, 25 here (non-blank, non-comment).
#   kubectl apply -f examples/kopf/crd.yaml && declop run examples/kopf/05_handlers.py
#
# declop has no create/update/delete causes: each Kopf handler is a reconciler told when to run by
# what changed since *it* last succeeded (field=, old=, new=; docs/changes.md). spec's last handled
# value is None before the first success (create) and after the object is deleted (delete: new=None,
# seen thanks to a finalizer). Kopf's on.resume: declop calls every reconciler for every object when
# it starts, and first_seen is True until a call on the object succeeds in this process.
import declop


@declop.reconciler("kopfexamples.kopf.dev")
def resume_fn_1(first_seen):
    print("RESUMED 1st") if first_seen else None


@declop.reconciler("kopfexamples.kopf.dev", field="spec", old=None)
def create_fn_1():
    print("CREATED 1st")


@declop.reconciler("kopfexamples.kopf.dev")
def resume_fn_2(first_seen):
    print("RESUMED 2nd") if first_seen else None


@declop.reconciler("kopfexamples.kopf.dev", field="spec", old=None)
def create_fn_2():
    print("CREATED 2nd")


@declop.reconciler("kopfexamples.kopf.dev", field="spec", old=lambda v: v is not None, new=lambda v: v is not None)
def update_fn(old, new, diff):
    print("UPDATED")


@declop.reconciler("kopfexamples.kopf.dev", field="spec", new=None, finalizer="kopf.dev/delete-fn-1")
def delete_fn_1():
    print("DELETED 1st")


@declop.reconciler("kopfexamples.kopf.dev", field="spec", new=None, finalizer="kopf.dev/delete-fn-2")
def delete_fn_2():
    print("DELETED 2nd")


@declop.reconciler("kopfexamples.kopf.dev", field="spec.field")
def field_fn(old, new):
    print(f"FIELD CHANGED: {old} -> {new}")
