"""Kopf under test (run with ``kopf run --standalone -n <ns>`` from bench/.venv-kopf).

``BENCH_KOPF_MODE=event``: one no-op ``@kopf.on.event`` handler (every watch event, no state).
``BENCH_KOPF_MODE=cu``: no-op ``@kopf.on.create`` + ``@kopf.on.update`` (diff-base and progress
annotations, i.e. Kopf's own PATCHes, as shipped).
``BENCH_KOPF_POSTING=0`` sets ``settings.posting.enabled = False`` (the fairness variant).
``BENCH_STALL_OUT`` starts the 10 ms event-loop stall probe at startup.
Everything else is Kopf's defaults. Plain ``def`` handlers, as declop's (both run them in threads).
"""

import asyncio
import os
import sys
import time

import kopf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import record, stall_probe  # noqa: E402

RESOURCE = os.environ.get("BENCH_RESOURCE", "configmaps")
MODE = os.environ.get("BENCH_KOPF_MODE", "event")
_tasks = []


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    if os.environ.get("BENCH_KOPF_POSTING") == "0":
        settings.posting.enabled = False


if os.environ.get("BENCH_STALL_OUT"):

    @kopf.on.startup()
    async def start_probe(**_):
        _tasks.append(asyncio.get_running_loop().create_task(stall_probe(os.environ["BENCH_STALL_OUT"])))


def _handle(body, namespace, name):
    started = time.time_ns()
    record(started, namespace, name, body.get("metadata", {}).get("annotations"))


if MODE == "event":

    @kopf.on.event(RESOURCE)
    def noop(body, namespace, name, type, **_):
        if type == "DELETED":
            return
        _handle(body, namespace, name)

else:

    @kopf.on.create(RESOURCE)
    def noop_create(body, namespace, name, **_):
        _handle(body, namespace, name)

    @kopf.on.update(RESOURCE)
    def noop_update(body, namespace, name, **_):
        _handle(body, namespace, name)
