"""A validating webhook: Widgets larger than 10 are refused, the old spelling gets a warning.

    kubectl apply -f examples/webhooks/widget-crd.yaml
    declop dev examples/webhooks/validator.py      # or: declop run ... (serves https://127.0.0.1:9443)
    kubectl apply -f - <<< '{"apiVersion": "webhooks.example.com/v1", "kind": "Widget",
                            "metadata": {"name": "big"}, "spec": {"size": 11}}'
    # Error from server (Forbidden): error when creating "STDIN": admission webhook
    #   "check-size.widgets.webhooks.example.com" denied the request: spec.size: must be at most 10
    kubectl apply -f - <<< '{... "spec": {"size": 3, "colour": "red"}}'
    # Warning: spec.colour is deprecated; use spec.color
    # widget.webhooks.example.com/... created

A validator must be fast and free of side effects: it runs on every write of a Widget, dry runs
(``kubectl apply --dry-run=server``) included — ``dry_run`` says which.
"""

import declop


@declop.validator("widgets.webhooks.example.com", operations=("CREATE", "UPDATE"))
def check_size(obj, dry_run, logger, warnings):
    spec = obj.get("spec", {})
    if spec.get("size", 0) > 10:
        logger.info("Refused", size=spec["size"], dryRun=dry_run)
        raise declop.Rejected("must be at most 10", field="spec.size")
    if "colour" in spec:
        warnings.append("spec.colour is deprecated; use spec.color")
