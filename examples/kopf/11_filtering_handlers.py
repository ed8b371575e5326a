# Kopf's 11-filtering-handlers: handlers that run only for objects with some labels, annotations
# or field values, or when a callback says so.
# Lines of code (non-blank, non-comment): Kopf's example.py 57, this port 46.
#
#   declop run examples/kopf/11_filtering_handlers.py
#   kubectl apply -f examples/kopf/obj.yaml
#   kubectl patch kex kopf-example-1 --type merge -p '{"spec": {"field": "changed"}}'
#
# Filters that the apiserver applies: labels= (a label selector: "k=v", "k" present, "!k"
# absent) and fields= (a field selector; spec.field is a selectable field of crd.yaml). Only
# matching objects reach the cache and the reconciler; one that stops matching looks deleted
# (obj is None). There is no annotation selector in Kubernetes: annotation and callback filters
# are conditions on the state, in the reconciler — declop's filter for these is your own `if`.
# A field *change* (Kopf's old=/new=) is an edge, not a state: a predicate sees each event's old
# and new object. It fires only for a change the operator saw happen (not one made while it was
# down). Kopf's daemon with a field filter is in 14_daemons.py.
import declop

KEX = "kopfexamples.kopf.dev"


def say_yes(value, spec):
    return value == "somevalue" and spec.get("field") is not None


def say_no(value, spec):
    return value == "somevalue" and spec.get("field") == "not-this-value-for-sure"


@declop.reconciler(KEX, labels="somelabel=somevalue")
def labels_matching(logger, obj, **_):
    if obj is not None:
        logger.info("Label is matching.")


@declop.reconciler(KEX, labels="somelabel")
def labels_present(logger, obj, **_):
    if obj is not None:
        logger.info("Label is present.")


@declop.reconciler(KEX, labels="!nonexistent")
def labels_absent(logger, obj, **_):
    if obj is not None:
        logger.info("Label is absent.")


@declop.reconciler(KEX, fields="spec.field=value")
def field_value(logger, obj, **_):
    if obj is not None:
        logger.info("Field value is satisfied.")


@declop.reconciler(KEX)
def state_filters(logger, obj, **_):
    if obj is None:
        return
    spec, meta = obj["spec"], obj["metadata"]
    annotations = meta.get("annotations") or {}
    matching = {
        "Label callback matching.": say_yes((meta.get("labels") or {}).get("somelabel"), spec),
        "Annotation is matching.": annotations.get("someannotation") == "somevalue",
        "Annotation is present.": "someannotation" in annotations,
        "Annotation is absent.": "nonexistent" not in annotations,
        "Annotation callback mismatch.": say_no(annotations.get("someannotation"), spec),
        "Field presence is satisfied.": "field" in spec,
        "Field presence is not satisfied.": "inexistent" in spec,
    }
    for message, ok in matching.items():
        if ok:
            logger.info(message)


def field_changed(old, new):
    before, after = (old or {}).get("spec", {}).get("field"), (new or {}).get("spec", {}).get("field")
    return before == "value" and after == "changed"


@declop.reconciler(KEX, predicates=[field_changed])
def update_with_field_change(logger, **_):
    logger.info("Field change is satisfied.")
