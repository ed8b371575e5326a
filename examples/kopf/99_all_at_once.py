# A port of Kopf's examples/99-all-at-once (nolar/kopf): 27 lines of code here, 33 in Kopf's.
# Kopf's create handlers become reconcilers that run for a spec never handled (field="spec",
# old=None) or as a step recorded on the object (steps: "Whoops!" once, then done for good, even
# across restarts); what they return is written to status.<name> (return_to=True). Kopf's empty
# _create_children() makes no child, so there is no Event about children to record.
import pprint
import time

import declop

KEX = "kopfexamples.kopf.dev"


@declop.reconciler(KEX, field="spec", old=None, return_to=True)
def create_1(obj, client):
    client.event(obj, "AnyReason", "Handled on creation")
    client.event(obj, "SomeReason", "Cannot do something", type="Warning")
    return {"job1-status": 100}


@declop.reconciler(KEX, return_to=True)
def create_2(steps):
    def job2():
        time.sleep(1)  # specific for job2, e.g. an external API poller
        if steps.attempt("job2") == 1:
            raise Exception("Whoops!")  # retried by the framework, even if it has been restarted
        return {"job2-status": 100}
    return steps.run("job2", job2, once="object")


@declop.reconciler(KEX, field="spec", old=lambda v: v is not None, new=lambda v: v is not None)
def update(diff):
    print("Handling the diff")
    pprint.pprint(list(diff))


@declop.reconciler(KEX, field="spec.lst")
def update_lst(old, new):
    print(f"Handling the FIELD = {old} -> {new}")


@declop.reconciler(KEX, finalizer="kopf.dev/delete")
def delete():
    pass
