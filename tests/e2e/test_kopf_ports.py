"""Every port in examples/kopf/ does what Kopf's original does, run as a user runs it: `declop run
examples/kopf/NN_name.py` as a process, kubectl against the real control plane, assertions on the
cluster and on the operator's output. Each port is also no longer than Kopf's example, as its
header says (checked here, without a cluster)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

PORTS = Path(__file__).resolve().parents[2] / "examples" / "kopf"
OBJ = str(PORTS / "obj.yaml")
NAME = "kopf-example-1"


def kubectl(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def get(env: dict[str, str], *args: str) -> dict | None:
    result = subprocess.run(["kubectl", "get", *args, "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and "NotFound" in result.stderr:
        return None
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def env(control_plane) -> dict[str, str]:
    env = control_plane.env() | {"PYTHONUNBUFFERED": "1"}  # print() of 01 and 08 reach the pipe at once
    kubectl(env, "apply", "-f", str(PORTS / "crd.yaml"))
    kubectl(env, "wait", "--for=condition=Established", "crd/kopfexamples.kopf.dev", "--timeout=30s")
    return env


@contextlib.contextmanager
def running(name: str, namespace: str, env: dict[str, str], *args: str, controllers: int = 1) -> Iterator[OperatorProcess]:
    """`declop run examples/kopf/<name> -n <namespace> [args]`, once each controller has started."""
    with OperatorProcess([str(PORTS / name), "-n", namespace, *args], env=env) as op:
        op.wait_for_line("Starting workers", count=controllers)
        yield op


def status(env: dict[str, str], namespace: str) -> dict:
    return (get(env, "kex", NAME, "-n", namespace) or {}).get("status") or {}


@pytest.mark.parametrize("path", sorted(PORTS.glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_each_port_is_no_longer_than_kopfs_example(path):
    text = path.read_text()
    header = "\n".join(line for line in text.splitlines()[:4] if line.startswith("#"))
    if m := re.search(r"Kopf's example\.py (\d+).*?this port (\d+)\.", header, re.S):
        kopf, stated = int(m.group(1)), int(m.group(2))
    elif m := re.search(r"(\d+) lines of code here, (\d+) in Kopf's", header):
        stated, kopf = int(m.group(1)), int(m.group(2))
    elif m := re.search(r"(\d+) lines of code there, (\d+) here", header):
        kopf, stated = int(m.group(1)), int(m.group(2))
    else:
        raise AssertionError(f"{path.name}: no line counts in its header")
    code = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(code) == stated, f"{path.name}: the header says {stated} lines of code, the file has {len(code)}"
    assert stated <= kopf, f"{path.name}: {stated} lines of code, Kopf's example has {kopf}"


def test_01_minimal(env, namespace):
    """The spec is printed once and the status gets Kopf's return value; an edit prints nothing."""
    with running("01_minimal.py", namespace, env) as op:
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)
        line = op.wait_for_line("And here we are! Creating:")[0]
        assert line == "And here we are! Creating: {'duration': '1m', 'field': 'value', 'items': ['item1', 'item2']}"
        wait_for(lambda: status(env, namespace).get("create_fn") == {"message": "hello world"}, 10)
    with running("01_minimal.py", namespace, env, "-v") as again:  # a restart lists it again
        again.wait_for_line("Reconciling")
        kubectl(env, "label", "kex", NAME, "-n", namespace, "edited=yes")
        again.wait_for_line("Reconciling", count=2)
    assert [x for x in op.lines + again.lines if "Creating" in x] == [line]


def test_02_children(env, namespace):
    """A Pod owned by the KopfExample, built from its spec, its uid in the status; a Pod deleted
    by hand comes back (level-triggered) and the status follows."""
    with running("02_children.py", namespace, env) as op:
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)
        pod = wait_for(lambda: get(env, "pod", NAME, "-n", namespace), 10)
        (container,) = pod["spec"]["containers"]
        assert (container["image"], container["command"]) == ("busybox", ["sh", "-x", "-c"])
        assert container["env"] == [{"name": "FIELD", "value": "value"}]
        assert "sleep 1m" in container["args"][0]
        (owner,) = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("KopfExample", NAME, True)
        uid = pod["metadata"]["uid"]
        wait_for(lambda: status(env, namespace).get("create_fn") == {"children": [uid]}, 10)

        kubectl(env, "delete", "pod", NAME, "-n", namespace, "--timeout=30s")
        new = wait_for(lambda: (lambda p: p if p and p["metadata"]["uid"] != uid else None)(get(env, "pod", NAME, "-n", namespace)), 10)
        wait_for(lambda: status(env, namespace).get("create_fn") == {"children": [new["metadata"]["uid"]]}, 10)
    assert not [x for x in op.lines if x.startswith("ERROR")], op.lines  # a create the cache had not seen yet is a quiet Conflict


def test_04_events(env, namespace):
    """One Normal and two Warning events about the object, each posted once; types Kubernetes takes."""
    with running("04_events.py", namespace, env):
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)

        def events():
            items = get(env, "events", "-n", namespace, "--field-selector", f"involvedObject.name={NAME}")["items"]
            return items if len(items) == 3 else None

        got = sorted((e["type"], e["reason"], e["message"], e.get("series")) for e in wait_for(events, 15))
        assert got == [  # no series: none was repeated
            ("Normal", "SomeReason", "Some message", None),
            ("Warning", "SomeReason", "Some exception: RuntimeError('Exception text.')", None),
            ("Warning", "SomeReason", "Some message", None),
        ]
        kubectl(env, "delete", "kex", NAME, "-n", namespace, "--timeout=30s")  # our finalizer goes


def test_08_events(env, namespace):
    """Every change of the object wakes the printing reconciler; the failing one is logged, not retried."""
    with running("08_events.py", namespace, env, controllers=2) as op:
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)
        rv = wait_for(lambda: get(env, "kex", NAME, "-n", namespace), 10)["metadata"]["resourceVersion"]
        op.wait_for_line(f"Seen: {namespace}/{NAME} at resourceVersion {rv}")
        op.wait_for_line("declop.TerminalError: Oops!")
        kubectl(env, "delete", "kex", NAME, "-n", namespace, "--timeout=30s")
        op.wait_for_line(f"Seen: {namespace}/{NAME} gone")
        op.wait_for_line("declop.TerminalError: Oops!", count=2)  # the deletion woke it too
    failures = [x for x in op.lines if x.startswith("ERROR ")]
    assert all(x.startswith('ERROR Reconciler error (terminal, not retried) {"controller": "event_fn_with_error"') for x in failures), failures
    assert len(failures) <= 3, failures  # one per wake (the create, perhaps merged with others, the delete)


def test_09_testing(control_plane, namespace):
    """Kopf's 09 example is a test: examples/kopf/test_09_testing.py, the port of it, passes here."""
    spec = importlib.util.spec_from_file_location("kopf_port_test_09", PORTS / "test_09_testing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_a_new_object_is_logged_once_and_an_old_one_not()
    module.test_resource_lifecycle(control_plane, namespace)


def test_10_builtins(env, namespace):
    """A pod is deleted when its lifetime is over; the deadline comes from the pod, so a restart
    of the operator does not move it."""
    env = env | {"POD_LIFETIME": "8"}
    with running("10_builtins.py", namespace, env) as op:
        kubectl(env, "run", "doomed", "--image", "busybox", "-n", namespace)
        first = op.wait_for_line("=== Pod killing happens in")[0]
        assert re.match(r"INFO === Pod killing happens in [78]s\. ", first), first  # creationTimestamp has whole seconds
    born = datetime.datetime.fromisoformat(get(env, "pod", "doomed", "-n", namespace)["metadata"]["creationTimestamp"])
    wait_for(lambda: (datetime.datetime.now(datetime.timezone.utc) - born).total_seconds() >= 3, 10)  # the pod's age
    with running("10_builtins.py", namespace, env) as again:
        line = again.wait_for_line("=== Pod killing happens in")[0]
        assert int(re.search(r"in (\d+)s\.", line).group(1)) <= 5, line  # counted from the creation, not from this start
        again.wait_for_line("=== Pod killing happens NOW!", timeout=15)
        wait_for(lambda: get(env, "pod", "doomed", "-n", namespace) is None, 10)


def test_11_filtering_handlers(env, namespace):
    """The handlers whose filters match obj.yaml log, the others never; a field change from
    'value' to 'changed' is seen as such."""
    matching = [
        "Label is matching.", "Label is present.", "Label is absent.", "Field value is satisfied.",
        "Label callback matching.", "Annotation is matching.", "Annotation is present.",
        "Annotation is absent.", "Field presence is satisfied.",
    ]
    with running("11_filtering_handlers.py", namespace, env, controllers=6) as op:
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)
        for message in matching:
            op.wait_for_line(message)
        kubectl(env, "patch", "kex", NAME, "-n", namespace, "--type=merge", "-p", '{"spec": {"field": "changed"}}')
        op.wait_for_line("Field change is satisfied.")
    said = {x.split(" {")[0].removeprefix("INFO ") for x in op.lines if NAME in x}
    assert said == {*matching, "Field change is satisfied."}, said


def test_13_hooks(env, namespace):
    """The startup hook runs before the workers, each pod is served again and again, and the
    shutdown hook runs on SIGTERM."""
    with running("13_hooks.py", namespace, env) as op:
        kubectl(env, "run", "sleepy", "--image", "busybox", "-n", namespace)
        op.wait_for_line("Served by the periodic reconcile.", count=2, timeout=25)
    assert op.returncode == 0
    started = op.lines.index('INFO Starting up... {"hook": "startup_fn"}')
    assert started < op.lines.index(next(x for x in op.lines if x.startswith("INFO Starting workers"))), op.lines
    assert any("Cleaning up..." in x for x in op.lines), op.lines[-5:]


def test_16_indexing(env, namespace):
    """The status lists the pods of the namespace that run and those that carry the object's
    labels, following the pods as they change."""
    with running("16_indexing.py", namespace, env):
        kubectl(env, "apply", "-n", namespace, "-f", OBJ)
        kubectl(env, "run", "web", "--image", "nginx", "-n", namespace, "-l", "somelabel=somevalue")
        kubectl(env, "run", "other", "--image", "nginx", "-n", namespace)
        wait_for(lambda: status(env, namespace) == {"running-pods": [], "labelled-pods": ["web"]}, 10)
        # no kubelet runs here: say it as a kubelet would
        kubectl(env, "patch", "pod", "other", "-n", namespace, "--subresource=status", "-p", '{"status": {"phase": "Running"}}')
        wait_for(lambda: status(env, namespace) == {"running-pods": ["other"], "labelled-pods": ["web"]}, 10)
        kubectl(env, "delete", "pod", "web", "-n", namespace, "--timeout=30s")
        wait_for(lambda: status(env, namespace) == {"running-pods": ["other"], "labelled-pods": []}, 10)
