# A port of Kopf's examples/17-admission (nolar/kopf): 21 lines of code here, 49 in Kopf's (at 60d02ae).
# Kopf's startup handler picks a server or a tunnel (k3d, minikube, ngrok) for its webhooks: declop
# serves them itself and keeps their configurations (--webhook-port, --webhook-url, --webhook-service).
# Kopf's authhook reads the HTTP headers and the TLS peer; declop passes who asks, `user_info`.
import declop


@declop.validator("kopfexamples.kopf.dev")
def authhook(user_info, warnings):
    warnings.append(f"Accessing as user: {user_info.get('username', '(unidentified)')}")


@declop.validator("kopfexamples.kopf.dev")
def validate1(obj, dry_run):
    if not dry_run and obj.get("spec", {}).get("field") == "wrong":
        raise declop.Rejected("Meh! I don't like it. Change the field.")


@declop.validator("kopfexamples.kopf.dev", field="spec.field", value="not-allowed")
def validate2():
    raise declop.Rejected("I'm too lazy anyway. Go away!", code=555)


@declop.validator("kopfexamples.kopf.dev", subresource="*")  # the main resource and every subresource
def validate_subresources(obj, subresource, warnings):
    spec, status = obj.get("spec", {}), obj.get("status", {})
    if subresource == "status" and status.get("field") != spec.get("field"):
        raise declop.Rejected("status.field MUST be equal to spec.field!")
    elif subresource == "" and status.get("field") != spec.get("field"):
        warnings.append(f"Also update status.field to match spec.field: {spec.get('field')!r} != {status.get('field')!r}")


@declop.mutator("kopfexamples.kopf.dev", labels={"somelabel": "somevalue"})
def mutate1(obj):
    obj.setdefault("spec", {})["injected"] = 123
