"""The operator of tests/integration/test_steps_record.py's restart test (run with `declop run`).

One step that fails its first attempt with backoff=6: the time of its next try is recorded on
the object, so an operator killed and started again must still wait for it.
"""

import time

import declop


@declop.reconciler("kopfexamples.kopf.dev")
def delayed(obj, steps, **_):
    if obj is None:
        return None

    def flaky():
        print(f"ATTEMPT {steps.attempt('flaky')} {time.time():.3f}", flush=True)
        if steps.attempt("flaky") == 1:
            raise RuntimeError("not yet")

    steps.run("flaky", flaky, once="object", backoff=6)
    print(f"DONE {time.time():.3f}", flush=True)
    return None
