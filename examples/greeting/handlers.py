"""Greeting: the inner loop of docs/dev.md.

    declop dev examples/greeting/handlers.py -f examples/greeting/crd.yaml
    # in another terminal, after the `export KUBECONFIG=...` line it prints:
    kubectl apply -f examples/greeting/greeting.yaml
    kubectl get greetings              # MESSAGE: Hello, World!

Change GREETING below and save: `declop dev` restarts the operator, which greets every
Greeting again — `kubectl get greetings` shows the new message within a second or so.
"""

import declop

GREETING = "Hello"


@declop.reconciler("greetings.hello.example.org")
def greet(request, obj, client, logger, **_):
    if obj is None:
        return None  # deleted: nothing of ours to clean up
    message = f"{GREETING}, {obj['spec']['name']}!"
    status = {"message": message, "observedGeneration": obj["metadata"]["generation"]}
    if obj.get("status") != status:
        client.patch_status(request, {"status": status})
        logger.info("Greeted", message=message)
    return None
