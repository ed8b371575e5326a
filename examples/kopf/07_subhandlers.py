# A port of Kopf's examples/07-subhandlers (nolar/kopf): 5 lines of code here, 7 in Kopf's.
# Each item of spec.items is a step of its own, run once for the object's life and recorded on
# it (docs/steps.md). Unlike Kopf's on.create, an item added later is handled too.
import declop


@declop.reconciler("kopfexamples.kopf.dev")
def create_fn(obj, steps, **_):
    for item in (obj or {}).get("spec", {}).get("items", []):
        steps.run(item, lambda item=item: print(f"=== Handling creation for {item}. ===", flush=True), once="object")
