"""Kopf's validator under test (bench/admission.py), run with ``kopf run --standalone -A``
from bench/.venv-kopf: the same no-op as bench/ops/declop_validator.py.

Kopf's own webhook server (``kopf.WebhookServer``) on 127.0.0.1:``BENCH_WEBHOOK_PORT`` with the
certificate the harness wrote (``BENCH_WEBHOOK_CERT``/``BENCH_WEBHOOK_KEY``, self-signed: Kopf
then sends it as the caBundle), and Kopf's managed mode: it creates the
ValidatingWebhookConfiguration ``BENCH_WEBHOOK_NAME`` itself and removes it on exit. Everything
else is Kopf's defaults. ``ignore_failures=True`` is failurePolicy Ignore, as declop's.
"""

import os

import kopf

RESOURCE = os.environ.get("BENCH_RESOURCE", "configmaps")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.admission.server = kopf.WebhookServer(
        addr="127.0.0.1",
        port=int(os.environ["BENCH_WEBHOOK_PORT"]),
        certfile=os.environ["BENCH_WEBHOOK_CERT"],
        pkeyfile=os.environ["BENCH_WEBHOOK_KEY"],
    )
    settings.admission.managed = os.environ["BENCH_WEBHOOK_NAME"]


@kopf.on.validate(RESOURCE, id="allow", operations=["CREATE", "UPDATE"], ignore_failures=True)
def allow(body, **_):
    body.get("metadata", {}).get("annotations")
