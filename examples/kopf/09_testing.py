# Kopf's 09-testing: an operator small enough to test; the test is test_09_testing.py next to it.
# Lines of code (non-blank, non-comment): Kopf's example.py 5, this port 5.
#
#   pytest examples/kopf/test_09_testing.py
#
# "On create" is the CREATED phase, which needs a finalizer of ours (see 04_events.py).
import declop


@declop.reconciler("kopfexamples.kopf.dev", finalizer="kopf.dev/testing-example")
def create_fn(phase, logger, **_):
    if phase is declop.Phase.CREATED:
        logger.info("Something was logged here.")
