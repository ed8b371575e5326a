# A port of Kopf's examples/03-exceptions (nolar/kopf): 16 lines of code here, 17 in Kopf's.
# One step, tried until it fails for good: a TemporaryError waits its delay, another exception
# the step's backoff, a TerminalError (Kopf's PermanentError) ends it. The attempts, the time of
# the next try and the failure are recorded on the object (docs/steps.md): a restart neither
# repeats nor forgets them.
import time

import declop


class MyException(Exception):
    pass


@declop.reconciler("kopfexamples.kopf.dev")
def create_fn(steps, **_):
    def create():
        time.sleep(0.1)  # for different timestamps of the events
        retry = steps.attempt("create_fn") - 1
        if not retry:
            raise declop.TemporaryError("First failure.", delay=1)
        elif retry == 1:
            raise MyException("Second failure.")
        else:
            raise declop.TerminalError("Third failure, the final one.")

    steps.run("create_fn", create, once="object", backoff=1)
