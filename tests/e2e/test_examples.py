"""Every example in examples/ runs as a user would run it: `declop run` as a process, kubectl
against the real control plane, assertions on the operator's real stdout and on the cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from declop.testing.cluster.runner import OperatorProcess, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def kubectl(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result


def get_json(env: dict[str, str], *args: str) -> dict | None:
    result = kubectl(env, "get", *args, "-o", "json", check=False)
    if result.returncode != 0:
        if "NotFound" in result.stderr or "not found" in result.stderr:
            return None
        raise AssertionError(result.stderr)
    return json.loads(result.stdout)


def test_seed_scenario_pods(control_plane, namespace):
    """kubectl run / label / delete give the seed's three lines, each with a fresh reconcileID.

    The operator watches all namespaces, as `declop run examples/pods.py` does; only the lines
    about this test's namespace are looked at (other tests may leave pods elsewhere).
    """
    env = control_plane.env()
    here = f'"namespace": "{namespace}", "name": "nginx"'
    with OperatorProcess([str(EXAMPLES / "pods.py")], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "run", "nginx", "--image", "nginx", "-n", namespace)
        created = op.wait_for_line(here)
        line = re.compile(
            r'^INFO Pod created \{"controller": "example", "namespace": "%s", "name": "nginx", "reconcileID": "(%s)"\}$'
            % (re.escape(namespace), UUID4)
        )
        first = line.match(created[0])
        assert first, created[0]

        kubectl(env, "label", "pod", "nginx", "env=prod", "-n", namespace)
        again = op.wait_for_line(here, count=2)
        second = line.match(again[1])
        assert second, again[1]
        assert second.group(1) != first.group(1)
        assert len([x for x in op.lines if here in x]) == 2, "\n".join(op.lines)

        # A plain delete, as the README's scenario types it. No node runs here and nothing
        # scheduled the pod, so the apiserver finishes the delete at once: it first records the
        # deletionTimestamp (an update: the seed's handler still finds the pod and may log "Pod
        # created" once more), then removes the pod: NotFound in the cache.
        kubectl(env, "delete", "pod", "nginx", "-n", namespace, "--timeout=30s")
        gone = op.wait_for_line('The pod was deleted {"controller": "example", ' + here)
        assert re.match(
            r'^INFO The pod was deleted \{"controller": "example", "namespace": "%s", "name": "nginx", "reconcileID": "%s"\}$'
            % (re.escape(namespace), UUID4),
            gone[0],
        ), gone[0]
        # the README's order: maybe "Pod created" (the deletionTimestamp), then only "deleted"
        after = [x.split(" {")[0] for x in op.lines if here in x][2:]
        first_gone = after.index("INFO The pod was deleted")
        assert set(after[:first_gone]) <= {"INFO Pod created"}, after
        assert set(after[first_gone:]) == {"INFO The pod was deleted"}, after
    assert op.returncode == 0


def test_finalizer_example(control_plane, namespace):
    env = control_plane.env()
    with OperatorProcess([str(EXAMPLES / "finalizer.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "create", "configmap", "precious", "-n", namespace, "--from-literal=a=b")
        kubectl(env, "label", "configmap", "precious", "-n", namespace, "declop.example/backup=true")
        op.wait_for_line("Registering an external copy")
        cm = wait_for(
            lambda: (lambda o: o if (o["metadata"].get("annotations") or {}).get("declop.example/registered") else None)(
                get_json(env, "configmap", "precious", "-n", namespace)
            ),
            10,
        )
        assert cm["metadata"]["finalizers"] == ["declop.example/backup"]
        assert cm["metadata"]["annotations"]["declop.example/registered"] == cm["metadata"]["uid"]
        kubectl(env, "delete", "configmap", "precious", "-n", namespace, "--wait=false")
        op.wait_for_line("Releasing the external copy")
        wait_for(lambda: get_json(env, "configmap", "precious", "-n", namespace) is None, 10)
        op.wait_for_line("Gone; nothing left to do")
    assert op.returncode == 0


def test_crd_example(control_plane, namespace):
    """A Widget gets a Deployment and a Service it owns, a Ready condition, and its children repaired."""
    import time

    env = control_plane.env()
    # as its docstring says: declop crd examples/crd/handlers.py | kubectl apply -f -
    crd = subprocess.run([sys.executable, "-m", "declop", "crd", str(EXAMPLES / "crd" / "handlers.py")], capture_output=True, text=True, timeout=60, check=True)
    applied = subprocess.run(["kubectl", "apply", "-f", "-"], env=env, input=crd.stdout, capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stderr
    kubectl(env, "wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s")

    def widget() -> dict:
        return get_json(env, "widget", "hello", "-n", namespace)

    def ready() -> dict | None:
        return next((c for c in (widget().get("status") or {}).get("conditions") or () if c["type"] == "Ready"), None)

    with OperatorProcess([str(EXAMPLES / "crd" / "handlers.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "apply", "-n", namespace, "-f", str(EXAMPLES / "crd" / "widget.yaml"))
        deploy = wait_for(lambda: get_json(env, "deployment", "hello", "-n", namespace), 10)
        svc = wait_for(lambda: get_json(env, "service", "hello", "-n", namespace), 10)
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        assert container["env"] == [{"name": "MESSAGE", "value": "Hello from a Widget"}]
        assert deploy["spec"]["replicas"] == 1
        assert svc["spec"]["selector"] == {"example.com/widget": "hello"}
        for child in (deploy, svc):
            owner = child["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["controller"], owner["blockOwnerDeletion"]) == ("Widget", "hello", True, True)
        op.wait_for_line("Deployment created")
        op.wait_for_line("Service created")

        # no kubelet runs pods here: 0 of 1 replicas ready
        cond = wait_for(ready, 10)
        assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", "Progressing", 1)
        assert widget()["status"]["observedGeneration"] == 1

        # zero replicas are all ready: Ready turns True and lastTransitionTime moves. (Done before
        # the repairs below: after a Deployment is deleted and recreated under the same name, the
        # controller-manager took ~40 s to report the new one's status here.)
        kubectl(env, "patch", "widget", "hello", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":0}}')
        cond = wait_for(lambda: (lambda c: c if c and c["status"] == "True" else None)(ready()), 20)
        assert (cond["reason"], cond["observedGeneration"]) == ("Available", 2)
        op.wait_for_line('"ready": "True"')
        # a spec change the Deployment does not depend on keeps it Ready: observedGeneration
        # follows, lastTransitionTime (second precision: wait past this second) stays
        time.sleep(1.1)
        kubectl(env, "patch", "widget", "hello", "-n", namespace, "--type=merge", "-p", '{"spec":{"secretName":"x"}}')
        later = wait_for(lambda: (lambda c: c if c and c["observedGeneration"] == 3 else None)(ready()), 20)
        assert later["status"] == "True"
        assert later["lastTransitionTime"] == cond["lastTransitionTime"]
        # a message change rolls the Deployment out: its container gets the new message
        kubectl(env, "patch", "widget", "hello", "-n", namespace, "--type=merge", "-p", '{"spec":{"message":"changed"}}')
        wait_for(
            lambda: get_json(env, "deployment", "hello", "-n", namespace)["spec"]["template"]["spec"]["containers"][0]["env"]
            == [{"name": "MESSAGE", "value": "changed"}],
            10,
        )

        # someone deletes a child by hand: the owner's reconciler puts it back
        kubectl(env, "delete", "deployment", "hello", "-n", namespace)
        wait_for(
            lambda: (lambda o: o if o and o["metadata"]["uid"] != deploy["metadata"]["uid"] else None)(
                get_json(env, "deployment", "hello", "-n", namespace)
            ),
            10,
        )
        kubectl(env, "delete", "service", "hello", "-n", namespace)
        wait_for(
            lambda: (lambda o: o if o and o["metadata"]["uid"] != svc["metadata"]["uid"] else None)(
                get_json(env, "service", "hello", "-n", namespace)
            ),
            10,
        )
        # someone edits one by hand: repaired
        updates = len([line for line in op.lines if "Deployment updated" in line])
        kubectl(env, "scale", "deployment", "hello", "-n", namespace, "--replicas=3")
        op.wait_for_line("Deployment updated", count=updates + 1)
        wait_for(lambda: get_json(env, "deployment", "hello", "-n", namespace)["spec"]["replicas"] == 0, 10)

        # the Widget goes: the garbage collector removes its children
        kubectl(env, "delete", "widget", "hello", "-n", namespace)
        op.wait_for_line("Widget deleted")
        wait_for(lambda: get_json(env, "deployment", "hello", "-n", namespace) is None, 60)
        wait_for(lambda: get_json(env, "service", "hello", "-n", namespace) is None, 60)
    assert op.returncode == 0


def test_metadata_only_example(control_plane, namespace):
    """Secrets are seen as metadata; the annotated one is read live and audited (keys counted)."""
    env = control_plane.env()
    here = f'"namespace": "{namespace}", "name": "db"'
    with OperatorProcess([str(EXAMPLES / "metadata_only.py"), "-n", namespace], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "create", "secret", "generic", "db", "-n", namespace, "--from-literal=password=s3cret")
        seen = op.wait_for_line(here)
        assert seen[0].startswith("INFO Secret seen {") and '"labels": 0' in seen[0], seen
        kubectl(env, "annotate", "secret", "db", "-n", namespace, "example.com/audit=true")
        audited = op.wait_for_line("Secret audited")
        assert here in audited[0] and '"keys": 1' in audited[0], audited
        assert not any("s3cret" in line or "czNjcmV0" in line for line in op.lines + op.stderr)
        (informer_line,) = [line for line in op.lines if "Starting Controller" in line]
        assert '"resource": "secrets"' in informer_line
    assert op.returncode == 0


def test_startup_example(control_plane, namespace):
    """Without its settings the operator refuses to start (exit 1, one line); with them it greets
    and says goodbye after the drain."""
    env = {**control_plane.env(), "GREETER_NAMESPACE": namespace}
    refused = OperatorProcess([str(EXAMPLES / "startup.py"), "-n", namespace], env=env)
    refused.start()
    assert refused.proc.wait(60) == 1
    wait_for(lambda: refused.stderr, 5)
    assert refused.stderr[-1].startswith(
        f"declop: error: startup hook 'load_settings' failed: LookupError: ConfigMap {namespace}/greeter-settings is missing"
    ), refused.stderr
    assert refused.stderr[-1].endswith("the operator did not start")

    kubectl(env, "create", "configmap", "greeter-settings", "-n", namespace, "--from-literal=greeting=Bonjour")
    with OperatorProcess([str(EXAMPLES / "startup.py"), "-n", namespace], env=env) as op:
        loaded = op.wait_for_line("Settings loaded")
        assert loaded[0] == 'INFO Settings loaded {"hook": "load_settings", "greeting": "Bonjour"}'
        op.wait_for_line("Starting workers")
        kubectl(env, "create", "configmap", "world", "-n", namespace)
        kubectl(env, "label", "configmap", "world", "-n", namespace, "greet=yes")
        op.wait_for_line("Bonjour, world")
        assert op.lines.index(loaded[0]) < min(i for i, line in enumerate(op.lines) if "Starting Controller" in line)
    assert op.returncode == 0
    goodbye = op.lines.index('INFO Goodbye {"hook": "goodbye", "greeted": 1}')
    assert goodbye > min(i for i, line in enumerate(op.lines) if "Stopping, waiting for in-flight reconciles" in line)


def test_every_example_is_exercised():
    # watches.py runs in tests/integration/test_relations.py; test_widget_unit.py is itself a
    # test module that pytest collects (testpaths includes examples/); greeting runs under
    # `declop dev` in tests/integration/test_dev_reload.py
    tested = {
        "pods.py", "finalizer.py", "crd", "watches.py", "test_widget_unit.py", "greeting", "metadata_only.py", "startup.py", "triggers.py",
        "sharded.py",
        "webhooks",  # validator.py, mutator.py, converter.py: the three tests below
        "kopf",  # ports of Kopf's examples: each in tests/e2e/test_kopf_<NN>.py
        "buggy",  # buggy handlers and their fixes: examples/buggy/test_buggy.py runs declop sim on each
    }
    present = {p.name for p in EXAMPLES.iterdir() if p.suffix == ".py" or p.is_dir()} - {"__pycache__"}
    untested = present - tested - set(os.environ.get("DECLOP_EXAMPLES_TESTED_ELSEWHERE", "").split(","))
    assert not untested, f"examples without a test: {sorted(untested)}"


def test_triggers_example_logs_why_each_reconcile_ran(control_plane, namespace):
    """`declop run --log-format json examples/triggers.py`: each line carries the compact
    ``trigger`` and the handler's own ``why`` from its ``trigger`` argument."""
    env = control_plane.env()
    with OperatorProcess(["--log-format", "json", "-n", namespace, str(EXAMPLES / "triggers.py")], env=env) as op:
        op.wait_for_line("Starting workers")
        kubectl(env, "create", "configmap", "demo", "--from-literal=k=v", "-n", namespace)
        (created,) = op.wait_for_line('"name": "demo"')
        first = json.loads(created)
        assert (first["msg"], first["why"], first["events"]) == ("Reconciled", ["created"], 1)
        assert re.fullmatch(r"created rv=\d+", first["trigger"]), first["trigger"]
        kubectl(env, "label", "configmap", "demo", "tier=gold", "-n", namespace)
        second = json.loads(op.wait_for_line('"name": "demo"', count=2)[1])
        assert second["why"] == ["updated"] and second["trigger"].startswith("updated rv=")
        kubectl(env, "delete", "configmap", "demo", "-n", namespace)
        third = json.loads(op.wait_for_line('"name": "demo"', count=3)[2])
        assert (third["msg"], third["why"]) == ("Gone", ["deleted"])


# -- webhooks (examples/webhooks/): the apiserver calls the example at https://127.0.0.1:<port> --


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Webhooks:
    """Run one webhook example under its own --webhook-name and port; remove what it registered."""

    def __init__(self, env: dict[str, str], example: str) -> None:
        import secrets

        self.env = env
        self.name = f"ex-{secrets.token_hex(3)}"
        self.op = OperatorProcess(
            [str(EXAMPLES / "webhooks" / example), "--webhook-port", str(_free_port()), "--webhook-name", self.name],
            env=env,
        )

    def __enter__(self) -> OperatorProcess:
        self.op.start()
        return self.op

    def __exit__(self, *exc: object) -> None:
        self.op.stop()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            kubectl(self.env, "delete", kind, self.name, "--ignore-not-found", check=False)
        kubectl(self.env, "delete", "secret", f"{self.name}-webhook-ca", "--ignore-not-found", check=False)


def _apply(env: dict[str, str], namespace: str, obj: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "apply", "-n", namespace, "-f", "-", *args], env=env, input=json.dumps(obj),
        capture_output=True, text=True, timeout=60,
    )


def _widget(name: str, spec: dict) -> dict:
    return {"apiVersion": "webhooks.example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def _crd(env: dict[str, str], file: str, name: str) -> None:
    kubectl(env, "apply", "-f", str(EXAMPLES / "webhooks" / file))
    kubectl(env, "wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")


def test_validator_example(control_plane, namespace):
    """The docstring's session: size 11 refused with the field, the old spelling warned about."""
    env = control_plane.env()
    _crd(env, "widget-crd.yaml", "widgets.webhooks.example.com")
    with _Webhooks(env, "validator.py") as op:
        op.wait_for_line("Registered ValidatingWebhookConfiguration")
        # the apiserver loads a new configuration a moment after it is written
        big = _widget("big", {"size": 11})
        wait_for(lambda: "denied the request" in _apply(env, namespace, big, "--dry-run=server").stderr, 20, what="enforcement")
        refused = _apply(env, namespace, big)
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            'Error from server (Forbidden): error when creating "STDIN": admission webhook '
            '"check-size.widgets.webhooks.example.com" denied the request: spec.size: must be at most 10'
        )
        warned = _apply(env, namespace, _widget("old", {"size": 3, "colour": "red"}))
        assert warned.returncode == 0
        assert warned.stderr.strip() == "Warning: spec.colour is deprecated; use spec.color"
        assert warned.stdout.strip() == "widget.webhooks.example.com/old created"
        assert op.wait_for_line('"dryRun": true')[0].startswith("INFO Refused")


def test_mutator_example(control_plane, namespace):
    """Defaults are stored with their label; a Widget that has both fields is stored as sent."""
    env = control_plane.env()
    _crd(env, "widget-crd.yaml", "widgets.webhooks.example.com")
    with _Webhooks(env, "mutator.py") as op:
        op.wait_for_line("Registered MutatingWebhookConfiguration")
        probe = _widget("probe", {})

        def defaulted() -> bool:
            out = _apply(env, namespace, probe, "--dry-run=server", "-o", "json")
            return out.returncode == 0 and "color" in json.loads(out.stdout)["spec"]

        wait_for(defaulted, 20, what="the mutator to be called")
        assert _apply(env, namespace, _widget("plain", {})).returncode == 0
        plain = get_json(env, "widgets.webhooks.example.com", "plain", "-n", namespace)
        assert plain["spec"] == {"color": "blue", "size": 1}
        assert plain["metadata"]["labels"] == {"webhooks.example.com/defaulted": "true"}
        op.wait_for_line('INFO Defaulted {"webhook": "defaults.widgets.webhooks.example.com", "operation": "CREATE", "namespace": "%s", "name": "plain"' % namespace)

        assert _apply(env, namespace, _widget("full", {"color": "red", "size": 2})).returncode == 0
        full = get_json(env, "widgets.webhooks.example.com", "full", "-n", namespace)
        assert full["spec"] == {"color": "red", "size": 2} and "labels" not in full["metadata"]


def test_converter_example(control_plane, namespace):
    """A Gadget written at v1 reads the same at v1 and in the v1alpha1 layout."""
    env = control_plane.env()
    _crd(env, "gadget-crd.yaml", "gadgets.webhooks.example.com")
    try:
        with _Webhooks(env, "converter.py") as op:
            op.wait_for_line("Registered the conversion webhook")
            gadget = {"apiVersion": "webhooks.example.com/v1", "kind": "Gadget", "metadata": {"name": "g"},
                      "spec": {"replicas": 3, "appearance": {"color": "red"}}}
            wait_for(lambda: _apply(env, namespace, gadget).returncode == 0, 20, what="a write at v1")
            spec = lambda version: kubectl(env, "get", f"gadgets.{version}.webhooks.example.com", "g", "-n", namespace, "-o", "jsonpath={.spec}").stdout  # noqa: E731
            assert spec("v1alpha1") == '{"color":"red","size":3}'
            assert spec("v1") == '{"appearance":{"color":"red"},"replicas":3}'
    finally:
        kubectl(env, "delete", "crd", "gadgets.webhooks.example.com", "--ignore-not-found", check=False)


def test_sharded_example_two_replicas_split_the_configmaps(control_plane, namespace):
    """Two `declop run examples/sharded.py --shards 4` replicas: every labelled ConfigMap is
    logged by exactly one of them, each line names its shard, both get a share; after one stops
    (SIGTERM: drain, release) the other reconciles every ConfigMap of the ranges it took."""
    env = control_plane.env()
    args = [
        str(EXAMPLES / "sharded.py"), "--shards", "4", "--log-format", "json", "-n", namespace,
        "--leader-election-namespace", namespace, "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5",
    ]

    def seen(op: OperatorProcess) -> dict[str, str]:
        out = {}
        for line in list(op.lines):
            if line.startswith("{") and '"ConfigMap seen"' in line:
                record = json.loads(line)
                out[record["name"]] = record["shard"]
        return out

    names = [f"cm-{i}" for i in range(16)]
    with OperatorProcess(args, env=env) as one, OperatorProcess(args, env=env) as two:
        for op in (one, two):
            op.wait_for_line("Acquired shard", timeout=60)
        for name in names:
            kubectl(env, "create", "configmap", name, "--from-literal=colour=blue", "-n", namespace)
            kubectl(env, "label", "configmap", name, "sharded=yes", "-n", namespace)
        wait_for(lambda: set(seen(one)) | set(seen(two)) == set(names), 60, what="every ConfigMap reconciled")
        a, b = seen(one), seen(two)
        assert a and b, "both replicas hold ranges and reconcile some ConfigMaps"
        assert not set(a) & set(b), f"reconciled by both: {sorted(set(a) & set(b))}"
        assert all(re.fullmatch(r"[0-3]/4", shard) for shard in [*a.values(), *b.values()])
        two.stop()
        assert two.returncode == 0
        # a gained range queues every cached object of it: the survivor logs b's ConfigMaps too
        wait_for(lambda: set(names) <= set(seen(one)), 60, what="the survivor reconciled the ConfigMaps of the ranges it took")
        identity = next(json.loads(line)["identity"] for line in one.lines if '"Sharding: joining"' in line)
        leases = get_json(env, "leases", "-n", namespace)
        holders = {i["metadata"]["name"]: i["spec"].get("holderIdentity") for i in leases["items"] if "-shard-" in i["metadata"]["name"]}
        assert len(holders) == 4 and set(holders.values()) == {identity}, holders
