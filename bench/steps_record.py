"""What the progress record of ``steps`` costs per step (issue 40: "the progress record's cost per step").

A step that is done costs a decision and no write; a step that runs costs two guarded JSON
patches (the claim, the outcome). Measured here, per step, each as the median of ``--repeats``
timings (CPU time of the process) of ``--number`` iterations:

- ``done, 1 step`` / ``done, 20 steps``: a handler's call whose steps are all done — building the
  ``Steps`` (the record parsed once) and ``run`` deciding to skip, per step;
- ``run, declop's side``: claim + outcome of one step whose ``fn`` does nothing, against a client
  that answers at once (the record's JSON, the decision, the patch encoded as Go writes JSON, the
  memory of our writes): what declop adds on top of the two requests;
- ``run, fake apiserver``: the same through the real sync client and ``declop.testing``'s fake
  apiserver (which applies the JSON patch and its ``test``): the whole in-process path;

and the record's size (the annotation's bytes) with 1, 20 and 100 done steps (an annotation
counts against the object's 256 KiB of annotations).

    python bench/steps_record.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import timeit
from typing import Any

from declop.handlers.steps import Memory, Steps, Writer, dump
from declop.kube.keys import Request
from declop.testing import FakeClient

KEY = Request("bench", "obj-1")


def obj(record: Any = None, rv: str = "10") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "obj-1", "namespace": "bench", "uid": "u-1", "generation": 3, "resourceVersion": rv}
    if record is not None:
        meta["annotations"] = {"steps.declop.dev/bench": record}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}}


def done_record(n: int) -> str:
    return str(dump({f"step-{i}": {"generation": 3, "attempts": 1, "done": True} for i in range(n)}, "annotation"))


class Instant:
    """A client whose patch answers at once with a new resourceVersion (no apiserver)."""

    def __init__(self) -> None:
        self.rv = 10

    def patch(self, key: Request, body: bytes, *, type: str, subresource: str | None) -> dict[str, Any]:
        self.rv += 1
        ops = json.loads(body)
        return obj(ops[-1]["value"], str(self.rv))


def per_step_us(fn: Any, steps: int, number: int, repeats: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeats, timer=time.process_time)
    return statistics.median(times) / number / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    writer, memory = Writer("bench"), Memory()
    rows: list[tuple[str, float]] = []

    for n in (1, 20):
        cached = obj(done_record(n))
        names = [f"step-{i}" for i in range(n)]

        def done_call(cached: dict[str, Any] = cached, names: list[str] = names) -> None:
            steps = Steps(writer, memory, KEY, cached, None)
            for name in names:
                steps.run(name, _nothing)

        rows.append((f"done, {n} step{'s' if n > 1 else ''}: decide, no write", per_step_us(done_call, n, args.number, args.repeats)))

    instant = Instant()

    def run_instant() -> None:
        Steps(writer, Memory(), KEY, obj(), instant).run("step-0", _nothing)

    rows.append(("run, declop's side (claim + outcome, instant client)", per_step_us(run_instant, 1, args.number, args.repeats)))

    def run_fake() -> None:
        client = FakeClient([obj()], request=KEY, primary="configmaps")
        Steps(writer, Memory(), KEY, client.get("configmaps", KEY), client).run("step-0", _nothing)

    def fake_setup_only() -> None:
        client = FakeClient([obj()], request=KEY, primary="configmaps")
        client.get("configmaps", KEY)

    fake = per_step_us(run_fake, 1, args.number // 4, args.repeats)
    setup = per_step_us(fake_setup_only, 1, args.number // 4, args.repeats)
    rows.append(("run, fake apiserver (claim + outcome, in process)", fake - setup))

    print(f"µs per step, median of {args.repeats} runs (CPU time)")
    for label, us in rows:
        print(f"  {label:<58} {us:8.1f}")
    print("record size (annotation bytes)")
    for n in (1, 20, 100):
        print(f"  {n:>3} done steps {len(done_record(n).encode()):>8}")


def _nothing() -> None:
    return None


if __name__ == "__main__":
    main()
