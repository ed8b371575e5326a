"""examples/kopf/15_timers.py, Kopf's 15-timers, as a user runs it: `declop run` as a process,
kubectl against the real control plane. What Kopf's example shows: each timer pings with the
object's field every `interval` seconds once the object has been left alone for `idle` seconds,
and picks up a changed field after another idle wait."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

KOPF = Path(__file__).resolve().parents[2] / "examples" / "kopf"
SYNC, ASYNC = "Ping from a sync timer", "Ping from an async timer"


def kubectl(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def pings(op: OperatorProcess, text: str) -> list[tuple[float, str]]:
    """(time, message) of each ping line with ``text``."""
    out = []
    for line in list(op.lines):
        if line.startswith("{") and text in line:
            record = json.loads(line)
            out.append((datetime.datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp(), record["msg"]))
    return out


def test_kopf_15_timers(control_plane, namespace):
    env = control_plane.env()
    kubectl(env, "apply", "-f", str(KOPF / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev")
    with OperatorProcess([str(KOPF / "15_timers.py"), "-n", namespace, "--log-format", "json"], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", str(KOPF / "obj.yaml"))
        seen = datetime.datetime.now(datetime.timezone.utc).timestamp()
        wait_for(lambda: len(pings(op, SYNC)) >= 3 and pings(op, ASYNC), timeout=40, what="both timers' pings")
        sync, asyncs = pings(op, SYNC), pings(op, ASYNC)
        assert all(msg == f"{SYNC}: field='value'" for _, msg in sync)
        assert asyncs[0][1] == f"{ASYNC}: field='value'"
        assert sync[0][0] >= seen + 5 - 0.5, "idle=5: the first sync ping only after 5 s unchanged"
        assert asyncs[0][0] >= seen + 10 - 0.5, "idle=10: the first async ping only after 10 s unchanged"
        gaps = [b - a for (a, _), (b, _) in zip(sync, sync[1:])]
        # the tick the idle wait held fires when the wait ends, the next one on the grid again
        assert 0 < gaps[0] <= 2.5 and all(1.5 <= g <= 2.5 for g in gaps[1:]), f"interval=2 between sync pings: {gaps}"

        kubectl(env, "patch", "-n", namespace, "kopfexample", "kopf-example-1", "--type", "merge", "-p", '{"spec": {"field": "changed"}}')
        changed = datetime.datetime.now(datetime.timezone.utc).timestamp()
        wait_for(lambda: any("changed" in m for _, m in pings(op, SYNC)), timeout=30, what="a ping with the new field")
        first_new = min(t for t, m in pings(op, SYNC) if "changed" in m)
        assert first_new >= changed + 5 - 0.5, "a change restarts the idle wait"
        assert not [t for t, m in pings(op, SYNC) if "'value'" in m and t > changed + 0.5], "no old value after the change"
    assert op.returncode == 0
