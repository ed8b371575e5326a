"""What the webhook filters cost per admission request (issue 41: field=, value=, when=).

A validator with ``field=``, ``value=`` or ``when=`` is asked :meth:`Webhook.selects` on every
request (declop/webhooks/server.py, ``_admit_review``); a request it excludes is answered at once,
without the thread hop of a plain handler. Measured here, each as the median of ``--repeats``
timings of ``--number`` iterations (wall time, one process):

- ``selects``: the check alone — no filters; ``field=`` present / absent; ``field=`` with a
  ``value=``; ``when=`` of one argument;
- ``review``: the server's whole answer to one parsed review of a ~6 KB object (copies, filters,
  handler, the response dict) — a request the filter skips, next to one that calls a plain
  ``def`` validator (in the thread pool) and one that calls an ``async def`` one.

    python bench/admission_filters.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any, Callable

import declop
from declop.registry import Registry
from declop.webhooks.admission import AdmissionRequest
from declop.webhooks.server import WebhookServer

OBJ: dict[str, Any] = {
    "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "bench", "labels": {"a": "b"}},
    "spec": {"size": 3, "data": {f"k{i}": "x" * 60 for i in range(90)}},
}


def hook(**options: Any) -> Any:
    reg = Registry()

    def check(obj: Any) -> None:
        return None

    declop.validator("widgets.example.com", registry=reg, **options)(check)
    return reg.webhooks[0]


def median_ns(fn: Callable[[], Any], number: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter_ns() - started) / number)
    return statistics.median(runs)


async def review_ns(h: Any, obj: dict[str, Any], number: int, repeats: int) -> float:
    server = WebhookServer([h], port=0, ssl_context=None)
    review = AdmissionRequest(uid="u", operation="UPDATE", obj=obj, old_obj=obj, namespace="bench", name="w")
    runs = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(number):
            await server._admit_review(h, review, False, [])
        runs.append((time.perf_counter_ns() - started) / number)
    await server.stop()
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    available = {"obj": OBJ, "old_obj": OBJ, "operation": "UPDATE"}
    rows = {
        "selects: no filters": hook(),
        "selects: field= present": hook(field="spec.size"),
        "selects: field= absent": hook(field="spec.replicas"),
        "selects: field= + value=": hook(field="spec.size", value=3),
        "selects: when=(operation)": hook(when=lambda operation: operation == "UPDATE"),
    }
    for label, h in rows.items():
        print(f"{label:34} {median_ns(lambda: h.selects(available), args.number, args.repeats) / 1000:8.2f} µs")

    async def asynchronous(obj: Any) -> None:
        return None

    reg = Registry()
    declop.validator("widgets.example.com", registry=reg)(asynchronous)
    number = max(args.number // 10, 50)
    for label, h in (
        ("review: skipped by field=", hook(field="spec.replicas")),
        ("review: calls a def validator", hook()),
        ("review: calls an async validator", reg.webhooks[0]),
    ):
        print(f"{label:34} {asyncio.run(review_ns(h, OBJ, number, args.repeats)) / 1000:8.2f} µs")


if __name__ == "__main__":
    main()
