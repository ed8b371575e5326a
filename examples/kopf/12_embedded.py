# Port of Kopf's examples/12-embedded/example.py. Lines of code (non-blank, non-comment):
# Kopf's example.py 80, this port 25. The operator runs in a thread of the application
# (declop.Operator, docs/embedding.md) while the application creates and deletes objects.
import time

import kubernetes

import declop


@declop.reconciler("kopfexamples.kopf.dev")
def handle(name, obj, **_):
    print(f"Reconciled {name}: {'exists' if obj else 'gone'}", flush=True)


def main(steps=3):
    # Start the operator and let it initialise (returns once its caches synced).
    print("Starting the main app.", flush=True)
    with declop.Operator():
        # The operator is active: run the app's activity.
        api = kubernetes.client.CustomObjectsApi(kubernetes.config.new_client_from_config())
        for step in range(steps):
            print(f"Do the main app activity here. Step {step + 1}/{steps}.", flush=True)
            _call(api.create_namespaced_custom_object, 409, body={"apiVersion": "kopf.dev/v1", "kind": "KopfExample", "metadata": {"name": f"kopf-example-{step}"}})
            time.sleep(1.0)
            _call(api.delete_namespaced_custom_object, 404, name=f"kopf-example-{step}")
            time.sleep(1.0)
        # Leaving the block stops the operator gracefully (as SIGTERM stops `declop run`).
        print("Exiting the main app.", flush=True)


def _call(method, ignored, **kwargs):
    try:
        method(group="kopf.dev", version="v1", plural="kopfexamples", namespace="default", **kwargs)
    except kubernetes.client.rest.ApiException as e:
        if e.status != ignored:
            raise


if __name__ == "__main__":
    main()
