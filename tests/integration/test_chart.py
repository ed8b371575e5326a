"""The Helm chart (charts/declop) and the Dockerfile, checked the way a user meets them.

- ``helm lint --strict`` and ``helm template`` for the default values and every ``ci/*-values.yaml``
  scenario; every rendered set is accepted by ``kubectl apply --dry-run=server`` on the real
  apiserver (schema, defaulting, admission, PodSecurity warnings);
- ``helm install`` into the control plane creates the objects, and the ServiceAccount gets exactly
  the permissions ``kubectl auth can-i`` should show — no more;
- the installed Deployment's container is "run" as a kubelet would: its env, its ConfigMap laid
  out as a volume, a token of its ServiceAccount — so ``declop run`` proves that the chart's
  interface (DECLOP_* variables, RBAC, Lease Role, probes) is the one declop implements;
- the rules of the chart: one handler source, the checksum annotation, the Lease Role, the
  schema, the kubeVersion; the Dockerfile's key properties, read as text (no engine here).

There is no kubelet: installed Pods never run, which is expected.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import socket
import ssl
import sys
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

import declop
from declop.testing.cluster.runner import OperatorProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "declop"
DOCKERFILE = ROOT / "Dockerfile"
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
CI_NAMESPACES = ("declop-ci-team-a", "declop-ci-team-b")  # ci/namespaced-values.yaml
SCENARIOS = {"default": None} | {
    p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))
}

# A minimal monitoring.coreos.com/v1 ServiceMonitor CRD (the real one is prometheus-operator's).
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {
            "plural": "servicemonitors",
            "singular": "servicemonitor",
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["selector", "endpoints"],
                                "properties": {
                                    "selector": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                    "namespaceSelector": {
                                        "type": "object",
                                        "properties": {
                                            "any": {"type": "boolean"},
                                            "matchNames": {
                                                "type": "array",
                                                "items": {"type": "string"},
                                            },
                                        },
                                    },
                                    "endpoints": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                            "properties": {
                                                "port": {"type": "string"},
                                                "path": {"type": "string"},
                                                "interval": {
                                                    "type": "string",
                                                    "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$",
                                                },
                                                "scrapeTimeout": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                },
            }
        ],
    },
}


# -- tools -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tool_env(control_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """control_plane.env() (KUBECONFIG, kubectl/helm on PATH) with helm's homes in a temp folder."""
    home = tmp_path_factory.mktemp("helm-home")
    return control_plane.env() | {
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def run(
    env: dict[str, str], *cmd: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(cmd), env=env, input=stdin, capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{shlex.join(cmd)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def template(env: dict[str, str], *args: str, namespace: str = "ops", release: str = "op") -> str:
    return run(
        env, "helm", "template", release, str(CHART), "-n", namespace, "--skip-tests", *args
    ).stdout


def render(
    env: dict[str, str], *args: str, namespace: str = "ops", release: str = "op"
) -> list[dict[str, Any]]:
    return [
        d
        for d in yaml.safe_load_all(template(env, *args, namespace=namespace, release=release))
        if d
    ]


def render_error(env: dict[str, str], *args: str) -> str:
    result = run(env, "helm", "template", "op", str(CHART), "-n", "ops", *args, check=False)
    assert result.returncode != 0, (
        f"expected helm template {shlex.join(args)} to fail:\n{result.stdout}"
    )
    return result.stderr


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (
        f"{len(found)} {kind} {name or ''} in {[(d['kind'], d['metadata']['name']) for d in docs]}"
    )
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["declop"]
    return containers[0]


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(docs)["env"]}


def values_args(scenario: str) -> list[str]:
    path = SCENARIOS[scenario]
    return ["-f", str(path)] if path else []


def kubectl_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(run(env, "kubectl", *args, "-o", "json").stdout)


def can_i(env: dict[str, str], sa: str, *args: str) -> bool:
    result = run(env, "kubectl", "auth", "can-i", *args, f"--as={sa}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def service_monitor_crd(tool_env: dict[str, str]) -> Any:
    run(tool_env, "kubectl", "apply", "-f", "-", stdin=json.dumps(SERVICE_MONITOR_CRD))
    run(
        tool_env,
        "kubectl",
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/servicemonitors.monitoring.coreos.com",
    )
    yield
    run(
        tool_env,
        "kubectl",
        "delete",
        "crd",
        "servicemonitors.monitoring.coreos.com",
        "--wait=false",
        check=False,
    )


@pytest.fixture(scope="module")
def ci_namespaces(tool_env: dict[str, str]) -> Any:
    for name in CI_NAMESPACES:
        run(tool_env, "kubectl", "create", "namespace", name)
    yield CI_NAMESPACES
    run(tool_env, "kubectl", "delete", "namespace", *CI_NAMESPACES, "--wait=false", check=False)


# -- lint, render, server-side dry run --------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(tool_env: dict[str, str], scenario: str) -> None:
    result = run(tool_env, "helm", "lint", "--strict", str(CHART), *values_args(scenario))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    # lint turns a template's `fail` into an [INFO] line and passes: look for it explicitly.
    assert "Fail:" not in result.stdout + result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rendered_manifests_pass_server_side_dry_run(
    tool_env: dict[str, str],
    namespace: str,
    scenario: str,
    service_monitor_crd: Any,
    ci_namespaces: Any,
) -> None:
    # PodSecurity admission warns about workloads (Deployments) too: the restricted level must hold.
    run(
        tool_env,
        "kubectl",
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/warn=restricted",
    )
    manifests = template(
        tool_env, *values_args(scenario), "--api-versions", SERVICE_MONITOR_API, namespace=namespace
    )
    result = run(tool_env, "kubectl", "apply", "--dry-run=server", "-f", "-", stdin=manifests)
    assert "would violate PodSecurity" not in result.stderr, result.stderr
    applied = result.stdout
    assert "deployment.apps/op-declop created (server dry run)" in applied
    if scenario == "ha":
        assert "servicemonitor.monitoring.coreos.com/op-declop created (server dry run)" in applied
        assert "poddisruptionbudget.policy/op-declop created (server dry run)" in applied


def test_kube_version_floor(tool_env: dict[str, str]) -> None:
    assert "chart requires kubeVersion" in render_error(tool_env, "--kube-version", "1.28.9")
    render(tool_env, "--kube-version", "1.29.0")
    render(tool_env, "--kube-version", "v1.31.4-eks-ac2d5a0")  # provider pre-release tags match


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "replicaz=2"],
        ["--set", "image.tga=1.0"],
        ["--set", "logFormat=xml"],
        ["--set", "rbac.scope=everywhere"],
        ["--set", "rbac.watch[0].group=apps/v1", "--set", "rbac.watch[0].resource=deployments"],
        ["--set", "rbac.watch[0].resource=pods", "--set", "rbac.watch[0].finalizer=true"],
        ["--set", "handlers.files.bad/name\\.py=x"],
    ],
    ids=[
        "top-level typo",
        "nested typo",
        "enum",
        "scope",
        "group with version",
        "watch typo",
        "file name",
    ],
)
def test_schema_rejects(tool_env: dict[str, str], bad: list[str]) -> None:
    assert "values don't meet the specifications of the schema" in render_error(tool_env, *bad)


def test_schema_and_values_have_the_same_keys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if node.get("additionalProperties") is not False:
            return
        declared = {k for k, v in node["properties"].items() if "x-did-you-mean" not in v} - {"global"}
        assert set(value) == declared, (
            f"{path or 'values'}: values.yaml {sorted(value)} vs schema {sorted(declared)}"
        )
        for key, child in value.items():
            if isinstance(child, dict) and node["properties"][key].get("type") == "object":
                walk(child, node["properties"][key], f"{path}.{key}".lstrip("."))

    walk(values, schema, "")


def schema_mistakes() -> dict[str, str]:
    """The well-known mistaken keys the schema lets through for the template to name: path → meant."""
    found: dict[str, str] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        for key, child in (node.get("properties") or {}).items():
            if "x-did-you-mean" in child:
                found[f"{path}{key}"] = child["x-did-you-mean"]
            else:
                walk(child, f"{path}{key}.")

    walk(json.loads((CHART / "values.schema.json").read_text()), "")
    return found


def test_mistaken_keys_are_the_same_in_schema_and_template_and_mean_real_values() -> None:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    in_template = dict(re.findall(r'set \$mistakes "([^"]+)" "([^"]+)"', helpers))
    assert in_template == schema_mistakes()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for meant in in_template.values():
        node = values
        for part in meant.split("."):
            assert isinstance(node, dict) and part in node, f"{meant} is not a value"
            node = node[part]


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (["--set", "replicas=2"], "replicas"),
        (["--set", "namespaces={a,b}"], "namespaces"),
        (["--set", "image.name=me/op"], "image.name"),
        (["--set", "handlers.configMap=mine"], "handlers.configMap"),
    ],
)
def test_mistaken_key_names_the_right_one(tool_env: dict[str, str], args: list[str], path: str) -> None:
    error = render_error(tool_env, *args)
    lines = [line for line in error.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, error  # helm adds only "Use --debug flag to render out invalid YAML"
    meant = schema_mistakes()[path]
    assert f"declop: unknown value '{path}': did you mean '{meant}'?" in lines[0]


def test_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    opaque = {"resources", "podSecurityContext", "securityContext", "affinity"}

    def leaves(value: Any, prefix: str = "") -> list[str]:
        if isinstance(value, dict) and value and prefix not in opaque:
            return [
                leaf for k, v in value.items() for leaf in leaves(v, f"{prefix}.{k}".lstrip("."))
            ]
        return [prefix]

    missing = [key for key in leaves(values) if f"| `{key}` |" not in readme]
    assert not missing, f"charts/declop/README.md has no row for {missing}"


# -- handler sources ---------------------------------------------------------------------------


def test_defaults_run_the_example_from_a_configmap(tool_env: dict[str, str]) -> None:
    docs = render(tool_env)
    data = one(docs, "ConfigMap", "op-declop-handlers")["data"]
    assert list(data) == ["handlers.py"]
    assert data["handlers.py"] == (CHART / "files" / "example-handlers.py").read_text()
    compile(data["handlers.py"], "handlers.py", "exec")
    assert '@declop.reconciler("pods")' in data["handlers.py"]
    assert env_of(docs)["DECLOP_PATHS"] == "/handlers"
    # the example needs pods, and gets only read access to them
    rules = one(docs, "ClusterRole", "ops-op-declop")["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in rules


def test_configmap_mode_from_set_file(tool_env: dict[str, str], tmp_path: Path) -> None:
    handlers = tmp_path / "handlers.py"
    handlers.write_text(
        'import declop\n\n@declop.reconciler("configmaps")\ndef h(**_):\n    return None\n'
    )
    docs = render(
        tool_env,
        "--set-file",
        f"handlers.files.handlers\\.py={handlers}",
        "--set",
        "rbac.watch[0].resource=configmaps",
    )
    assert one(docs, "ConfigMap", "op-declop-handlers")["data"] == {
        "handlers.py": handlers.read_text()
    }
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "handlers")
    assert mount == {
        "name": "handlers",
        "mountPath": "/handlers",
        "readOnly": True,
    }  # a directory, no subPath
    volume = next(v for v in spec["volumes"] if v["name"] == "handlers")
    assert volume["configMap"]["name"] == "op-declop-handlers"
    assert env_of(docs)["DECLOP_PATHS"] == "/handlers"
    assert "DECLOP_MODULES" not in env_of(docs)
    rules = one(docs, "ClusterRole", "ops-op-declop")["rules"]
    assert not any("pods" in r["resources"] for r in rules), (
        "the example's pods rule must go with the example"
    )


def test_image_mode(tool_env: dict[str, str]) -> None:
    docs = render(
        tool_env,
        "--set",
        "handlers.module=widgets.handlers",
        "--set",
        "handlers.path=/app/extra.py",
    )
    env = env_of(docs)
    assert env["DECLOP_MODULES"] == "widgets.handlers"
    assert env["DECLOP_PATHS"] == "/app/extra.py"
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    pod = one(docs, "Deployment")["spec"]["template"]
    assert "checksum/handlers" not in pod["metadata"]["annotations"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp"]


def test_existing_configmap_mode(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "--set", "handlers.existingConfigMap=team-handlers")
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    pod = one(docs, "Deployment")["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "handlers")
    assert volume["configMap"]["name"] == "team-handlers"
    assert env_of(docs)["DECLOP_PATHS"] == "/handlers"


NO_SOURCE = "declop: no handlers given (and handlers.example=false). Give exactly one source"
TWO_SOURCES = "declop: handlers are given twice"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "handlers.example=false"], NO_SOURCE),
        (
            ["--set", "handlers.module=a.b", "--set", "handlers.files.h\\.py=x"],
            f"{TWO_SOURCES}: handlers.files (h.py) and handlers.module=a.b.",
        ),
        (
            ["--set", "handlers.path=/app/h.py", "--set", "handlers.existingConfigMap=cm"],
            f"{TWO_SOURCES}: handlers.existingConfigMap=cm and handlers.path=/app/h.py.",
        ),
        (
            ["--set", "handlers.existingConfigMap=cm", "--set", "handlers.files.h\\.py=x"],
            f"{TWO_SOURCES}: handlers.files (h.py) and handlers.existingConfigMap=cm.",
        ),
        (
            ["--set", "handlers.files.notes\\.txt=x"],
            "declop: handlers.files has no *.py file (notes.txt)",
        ),
    ],
    ids=["neither", "module and files", "path and existing", "files and existing", "no python"],
)
def test_handler_sources_fail_clearly(
    tool_env: dict[str, str], args: list[str], message: str
) -> None:
    error = render_error(tool_env, *args)
    assert message in error, error
    if message == NO_SOURCE:
        assert "--set-file handlers.files.handlers\\.py=./handlers.py" in error


def test_checksum_annotation_follows_handler_content(
    tool_env: dict[str, str], tmp_path: Path
) -> None:
    def checksum(source: str) -> str:
        path = tmp_path / "handlers.py"
        path.write_text(source)
        docs = render(tool_env, "--set-file", f"handlers.files.handlers\\.py={path}")
        value: str = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"][
            "checksum/handlers"
        ]
        assert re.fullmatch(r"[0-9a-f]{64}", value)
        return value

    first = checksum("import declop\n# v1\n")
    assert checksum("import declop\n# v1\n") == first
    assert checksum("import declop\n# v2\n") != first


# -- RBAC, leader election, pod ----------------------------------------------------------------


def test_leader_election_role_is_restricted_to_the_lease(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "--set", "replicaCount=2", "--set", "leaderElection.leaseName=my-lease")
    role = one(docs, "Role", "op-declop-leader-election")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["my-lease"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(docs, "RoleBinding", "op-declop-leader-election")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "op-declop-leader-election",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}
    ]
    env = env_of(docs)
    assert (
        env["DECLOP_LEADER_ELECT"],
        env["DECLOP_LEADER_ELECTION_ID"],
        env["DECLOP_LEADER_ELECTION_NAMESPACE"],
    ) == ("true", "my-lease", "ops")
    assert one(docs, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"


def test_sharding_passes_shards_turns_leader_election_off_and_grants_the_range_leases(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "--set", "replicaCount=3", "--set", "sharding.enabled=true", "--set", "sharding.shards=12")
    env = env_of(docs)
    assert env["DECLOP_SHARDS"] == "12" and env["DECLOP_LEADER_ELECT"] == "false"
    assert env["DECLOP_LEADER_ELECTION_ID"] == "op-declop" and env["DECLOP_LEADER_ELECTION_NAMESPACE"] == "ops"
    assert one(docs, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not [d for d in docs if d["metadata"]["name"] == "op-declop-leader-election"]
    role = one(docs, "Role", "op-declop-sharding")
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "create", "update", "delete"]}
    ]
    binding = one(docs, "RoleBinding", "op-declop-sharding")
    assert binding["roleRef"]["name"] == "op-declop-sharding"
    assert "DECLOP_SHARDS" not in env_of(render(tool_env))
    error = render_error(tool_env, "--set", "replicaCount=4", "--set", "sharding.enabled=true", "--set", "sharding.shards=2")
    assert "declop: sharding.shards=2 is less than replicaCount=4" in error


def test_leader_election_is_on_by_default_even_with_one_replica(tool_env: dict[str, str]) -> None:
    # so that `helm upgrade --set replicaCount=2` later rolls safely: the old Pod holds the Lease
    default = render(tool_env)
    assert env_of(default)["DECLOP_LEADER_ELECT"] == "true"
    assert one(default, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    off = render(tool_env, "--set", "leaderElection.enabled=false")
    assert env_of(off)["DECLOP_LEADER_ELECT"] == "false"
    assert not [d for d in off if d["kind"] == "Role"]
    assert one(off, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    auto = render(tool_env, "--set", "leaderElection.enabled=null")
    assert env_of(auto)["DECLOP_LEADER_ELECT"] == "false"
    error = render_error(
        tool_env, "--set", "replicaCount=3", "--set", "leaderElection.enabled=false"
    )
    assert "declop: replicaCount=3 with leaderElection.enabled=false" in error


def test_ha_rollout_strategy_fits_the_drain(tool_env: dict[str, str]) -> None:
    """With leader election the surge Pod is a Ready standby before the old Pod gets SIGTERM
    (maxUnavailable 0), and Kubernetes waits out the whole drain plus the Lease release
    (terminationGracePeriodSeconds > gracePeriod) before it would SIGKILL."""
    docs = render(tool_env, "--set", "replicaCount=2", "--set", "gracePeriod=40")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    assert env_of(docs)["DECLOP_GRACE_PERIOD"] == "40"
    assert container(docs)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    text = template(tool_env, "--set", "replicaCount=2")
    assert "keeps renewing the Lease while its in-flight" in text  # the comment says what holds
    assert "Safe with leader election: a new Pod waits" not in text


def test_watch_rules(tool_env: dict[str, str]) -> None:
    docs = render(
        tool_env,
        "--set",
        "handlers.module=m",
        "--set",
        "handlers.example=false",
        "--set-json",
        'rbac.watch=[{"group":"example.com","resource":"widgets","finalizers":true,"status":true},'
        '{"resource":"configmaps","verbs":["create","delete"]}]',
        "--set-json",
        'rbac.rules=[{"apiGroups":[""],"resources":["secrets"],"resourceNames":["x"],"verbs":["get"]}]',
    )
    assert one(docs, "ClusterRole", "ops-op-declop")["rules"] == [
        {
            "apiGroups": ["example.com"],
            "resources": ["widgets"],
            "verbs": ["get", "list", "watch", "patch"],
        },
        {
            "apiGroups": ["example.com"],
            "resources": ["widgets/status"],
            "verbs": ["patch", "update"],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["x"], "verbs": ["get"]},
    ]
    binding = one(docs, "ClusterRoleBinding", "ops-op-declop")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}
    ]


def test_generated_rules_from_declop_rbac_values(tool_env: dict[str, str], tmp_path: Path) -> None:
    """`declop rbac --values` output is rendered as written (with rbac.rules after it), in the
    ClusterRole or each namespaced Role; given with rbac.watch, the render fails saying which to drop."""
    handlers = tmp_path / "chart_rbac_handlers.py"
    handlers.write_text(
        "import declop\n"
        "@declop.reconciler('widgets.v1.example.com', finalizer='example.com/x', owns=['configmaps'])\n"
        "def widget(request):\n    pass\n"
    )
    values = tmp_path / "rbac-values.yaml"
    run({**tool_env, "PYTHONPATH": str(ROOT)}, sys.executable, "-m", "declop", "rbac", str(handlers), "--values", str(values))
    generated = yaml.safe_load(values.read_text())["rbac"]["generated"]
    extra = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["x"], "verbs": ["get"]}
    base = ("--set", "handlers.module=m", "--set", "handlers.example=false", "-f", str(values))
    docs = render(tool_env, *base, "--set-json", f"rbac.rules=[{json.dumps(extra)}]")
    assert one(docs, "ClusterRole", "ops-op-declop")["rules"] == [*generated, extra]
    assert {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list", "watch", "patch"]} in generated
    namespaced = render(tool_env, *base, "--set", "rbac.scope=namespaces", "--set-json", 'watchNamespaces=["a","b"]')
    roles = [d for d in namespaced if d["kind"] == "Role" and d["metadata"]["name"] == "op-declop"]
    assert [(r["metadata"]["namespace"], r["rules"]) for r in roles] == [("a", generated), ("b", generated)]
    error = render_error(tool_env, *base, "--set-json", 'rbac.watch=[{"resource":"pods"}]')
    assert "declop: rbac.watch and rbac.generated are both given" in error and "drop rbac.watch" in error


def test_the_generated_rbac_ci_scenario_is_what_declop_rbac_writes(tool_env: dict[str, str], tmp_path: Path) -> None:
    """ci/generated-rbac-values.yaml holds its handlers and their `declop rbac --values` output: in step."""
    scenario = yaml.safe_load((CHART / "ci" / "generated-rbac-values.yaml").read_text())
    handlers = tmp_path / "ci_generated_handlers.py"
    handlers.write_text(scenario["handlers"]["files"]["handlers.py"])
    values = tmp_path / "rbac-values.yaml"
    run({**tool_env, "PYTHONPATH": str(ROOT)}, sys.executable, "-m", "declop", "rbac", str(handlers), "--values", str(values))
    assert yaml.safe_load(values.read_text())["rbac"] == scenario["rbac"]


def test_secure_metrics_rbac_and_scraper_role(tool_env: dict[str, str]) -> None:
    """Secure metrics by default: a ClusterRole for the TokenReview/SubjectAccessReview checks
    (cluster-scoped APIs: also with rbac.scope=namespaces), bound to the ServiceAccount, and an
    unbound ClusterRole for scrapers; the ServiceMonitor scrapes over HTTPS with its token."""
    perms = json.loads((CHART / "files" / "permissions.json").read_text())
    for docs in (render(tool_env), render(tool_env, "-f", str(SCENARIOS["namespaced"]))):
        auth = one(docs, "ClusterRole", "ops-op-declop-metrics-auth")
        assert auth["rules"] == [
            {"apiGroups": [r["apiGroup"]], "resources": [r["resource"]], "verbs": r["verbs"]}
            for r in perms["metricsAuth"]["rules"]
        ] == [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ]
        binding = one(docs, "ClusterRoleBinding", "ops-op-declop-metrics-auth")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}]
        reader = one(docs, "ClusterRole", "ops-op-declop-metrics-reader")
        assert reader["rules"] == [{"nonResourceURLs": ["/metrics", "/debug/reconciles"], "verbs": ["get"]}]
        assert not [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "ops-op-declop-metrics-reader"]
    monitor = one(render(tool_env, "--set", "serviceMonitor.enabled=true", "--api-versions", SERVICE_MONITOR_API), "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    verified = one(render(tool_env, "--set", "serviceMonitor.enabled=true", "--api-versions", SERVICE_MONITOR_API,
                          "--set", "serviceMonitor.tlsConfig.serverName=op-declop-metrics.ops.svc"), "ServiceMonitor")
    assert verified["spec"]["endpoints"][0]["tlsConfig"] == {"serverName": "op-declop-metrics.ops.svc"}
    # a mounted certificate
    docs = render(tool_env, "--set", "metrics.certSecret=op-metrics-tls")
    assert env_of(docs)["DECLOP_METRICS_CERT_DIR"] == "/etc/declop/metrics-tls"
    assert {"name": "metrics-tls", "mountPath": "/etc/declop/metrics-tls", "readOnly": True} in container(docs)["volumeMounts"]
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "metrics-tls", "secret": {"secretName": "op-metrics-tls", "defaultMode": 0o440}} in volumes
    # plain HTTP: no checks, no roles for them, a plain ServiceMonitor
    plain = render(tool_env, "--set", "metrics.secure=false", "--set", "serviceMonitor.enabled=true", "--api-versions", SERVICE_MONITOR_API)
    assert env_of(plain)["DECLOP_METRICS_SECURE"] == "false"
    assert not [d for d in plain if d["metadata"]["name"].startswith("ops-op-declop-metrics")]
    assert "scheme" not in one(plain, "ServiceMonitor")["spec"]["endpoints"][0]


def test_network_policy(tool_env: dict[str, str]) -> None:
    assert "NetworkPolicy" not in {d["kind"] for d in render(tool_env)}
    docs = render(tool_env, "--set", "networkPolicy.enabled=true", "--set-json",
                  'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]')
    policy = one(docs, "NetworkPolicy", "op-declop")["spec"]
    assert policy["podSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [
        {"ports": [{"port": "health", "protocol": "TCP"}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}],
         "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
    ]
    no_metrics = one(render(tool_env, "--set", "networkPolicy.enabled=true", "--set", "metrics.enabled=false"), "NetworkPolicy")
    assert no_metrics["spec"]["ingress"] == [{"ports": [{"port": "health", "protocol": "TCP"}]}]
    assert "networkPolicy.enabledd" in render_error(tool_env, "--set", "networkPolicy.enabledd=true") or "enabledd" in render_error(tool_env, "--set", "networkPolicy.enabledd=true")


def test_namespaced_rbac(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "-f", str(SCENARIOS["namespaced"]))
    # only the secure-metrics checks are cluster-wide (TokenReview/SubjectAccessReview are cluster-scoped)
    assert {d["metadata"]["name"] for d in docs if d["kind"].startswith("Cluster")} == {
        "ops-op-declop-metrics-auth", "ops-op-declop-metrics-reader"
    }
    lease = "op-declop-leader-election"  # the Lease Role in the release namespace
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] != lease}
    bindings = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "RoleBinding" and d["metadata"]["name"] != lease
    }
    assert set(roles) == set(bindings) == set(CI_NAMESPACES)
    for ns in CI_NAMESPACES:
        assert {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "list", "watch", "patch"],
        } in roles[ns]["rules"]
        assert bindings[ns]["subjects"] == [
            {"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}
        ]
    assert env_of(docs)["DECLOP_NAMESPACES"] == " ".join(CI_NAMESPACES)
    error = render_error(tool_env, "--set", "rbac.scope=namespaces")
    assert "declop: rbac.scope=namespaces needs the namespaces in watchNamespaces" in error


def test_pod_spec(tool_env: dict[str, str]) -> None:
    docs = render(
        tool_env, "--set", "gracePeriod=50", "--set", "logLevel=debug", "--set", "logFormat=json"
    )
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "declop",
        "app.kubernetes.io/instance": "op",
    }
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert spec["terminationGracePeriodSeconds"] == 55  # grace period + 5
    assert (
        spec["serviceAccountName"] == "op-declop" and spec["automountServiceAccountToken"] is True
    )
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    c = container(docs)
    assert "command" not in c and "args" not in c  # the image's ENTRYPOINT: tini -- declop run
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8081, "metrics": 8080}
    env = env_of(docs)
    assert env == {
        "DECLOP_PATHS": "/handlers",
        "DECLOP_LOG_FORMAT": "json",
        "DECLOP_VERBOSE": "1",
        "DECLOP_GRACE_PERIOD": "50",
        "DECLOP_HEALTH_PORT": "8081",
        "DECLOP_METRICS_PORT": "8080",
        "DECLOP_METRICS_SECURE": "true",
        "DECLOP_LEADER_ELECT": "true",
        "DECLOP_LEADER_ELECTION_ID": "op-declop",
        "DECLOP_LEADER_ELECTION_NAMESPACE": "ops",
    }
    service = one(docs, "Service", "op-declop-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert (
            labels["app.kubernetes.io/managed-by"] == "Helm"
            and labels["app.kubernetes.io/instance"] == "op"
        )


def test_optional_objects(tool_env: dict[str, str]) -> None:
    kinds = {d["kind"] for d in render(tool_env)}
    assert not kinds & {"ServiceMonitor", "PodDisruptionBudget"}
    ha = render(tool_env, "-f", str(SCENARIOS["ha"]))
    assert "ServiceMonitor" not in {d["kind"] for d in ha}  # the cluster does not serve the API
    ha = render(tool_env, "-f", str(SCENARIOS["ha"]), "--api-versions", SERVICE_MONITOR_API)
    monitor = one(ha, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pdb = one(ha, "PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    off = render(tool_env, "--set", "metrics.enabled=false")
    assert "DECLOP_METRICS_PORT" not in env_of(off) and "Service" not in {d["kind"] for d in off}


# -- webhooks ----------------------------------------------------------------------------------

WEBHOOK_ENV = (
    "DECLOP_WEBHOOK_PORT", "DECLOP_WEBHOOK_SERVICE", "DECLOP_WEBHOOK_NAME", "DECLOP_WEBHOOK_NAMESPACE",
    "DECLOP_WEBHOOK_CERT_DIR",
)  # fmt: skip


def webhook_rules(perms: dict[str, Any], name: str, crds: list[str]) -> list[dict[str, Any]]:
    """The ClusterRole rules the chart must render for webhooks, from permissions.json."""
    configurations = perms["webhookConfigurations"]
    rules = [
        {"apiGroups": [configurations["apiGroup"]], "resources": configurations["resources"],
         "resourceNames": [name], "verbs": configurations["named"]},
    ]  # fmt: skip
    if crds:
        rules.append({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                      "resourceNames": crds, "verbs": perms["conversion"]["named"]})  # fmt: skip
    return rules


def test_webhooks_are_off_by_default(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "--set", "networkPolicy.enabled=true")
    assert not [d for d in docs if "webhook" in d["metadata"]["name"]]
    assert not set(env_of(docs)) & set(WEBHOOK_ENV)
    assert "webhook" not in {p["name"] for p in container(docs)["ports"]}
    assert "webhook" not in json.dumps(one(docs, "NetworkPolicy")["spec"])


def test_webhooks_with_the_generated_ca(tool_env: dict[str, str]) -> None:
    """Service → every operator Pod's `webhook` port; the service form of the client config;
    RBAC limited by name to the two configurations, the converters' CRDs and the CA Secret."""
    perms = json.loads((CHART / "files" / "permissions.json").read_text())
    docs = render(tool_env, "-f", str(SCENARIOS["webhooks"]))
    deployment = one(docs, "Deployment")
    service = one(docs, "Service", "op-declop-webhook")
    assert service["metadata"]["namespace"] == "ops"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container(docs)["ports"]
    env = env_of(docs)
    assert {k: env.get(k) for k in WEBHOOK_ENV} == {
        "DECLOP_WEBHOOK_PORT": "9443",
        "DECLOP_WEBHOOK_SERVICE": "ops/op-declop-webhook:443",
        "DECLOP_WEBHOOK_NAME": "ops-op-declop",
        "DECLOP_WEBHOOK_NAMESPACE": "ops",
        "DECLOP_WEBHOOK_CERT_DIR": None,  # not set: declop's own CA
    }
    assert "webhook-tls" not in json.dumps(deployment)
    role = one(docs, "ClusterRole", "ops-op-declop-webhooks")
    assert role["rules"] == webhook_rules(perms, "ops-op-declop", ["widgets.example.com"]) == [
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
         "resourceNames": ["ops-op-declop"], "verbs": ["patch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
         "resourceNames": ["widgets.example.com"], "verbs": ["patch"]},
    ]  # fmt: skip
    binding = one(docs, "ClusterRoleBinding", "ops-op-declop-webhooks")
    assert binding["roleRef"]["name"] == "ops-op-declop-webhooks"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}]
    ca = one(docs, "Role", "op-declop-webhook-ca")
    assert ca["metadata"]["namespace"] == "ops"
    assert ca["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["ops-op-declop-webhook-ca"],
         "verbs": perms["webhookCA"]["named"]},
    ]  # fmt: skip
    # no create, on Secrets or configurations: RBAC cannot limit a create by name
    assert perms["webhookCA"] | {"//": ""} == {"//": "", "apiGroup": "", "resource": "secrets", "named": ["get", "update"]}
    assert "create" not in json.dumps([d["rules"] for d in docs if d["kind"] in ("Role", "ClusterRole") and "webhook" in d["metadata"]["name"]])
    # ... because the chart creates them: both configurations and the CA Secret, empty (the
    # operator fills them in; Helm never sets those fields, so an upgrade leaves them alone)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        assert set(one(docs, kind, "ops-op-declop")) == {"apiVersion", "kind", "metadata"}
    secret = one(docs, "Secret", "ops-op-declop-webhook-ca")
    assert set(secret) == {"apiVersion", "kind", "metadata", "type"} and secret["metadata"]["namespace"] == "ops"
    ca_binding = one(docs, "RoleBinding", "op-declop-webhook-ca")
    assert ca_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "op-declop-webhook-ca"}
    assert ca_binding["subjects"] == [{"kind": "ServiceAccount", "name": "op-declop", "namespace": "ops"}]
    # the apiserver is no Pod: webhookFrom (an ipBlock) is the only way to narrow the port
    policy = one(docs, "NetworkPolicy", "op-declop")["spec"]
    assert policy["ingress"][-1] == {
        "ports": [{"port": "webhook", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    }
    # without converters, no CRD is touched
    plain = render(tool_env, "--set", "webhooks.enabled=true", "--set", "networkPolicy.enabled=true")
    assert one(plain, "ClusterRole", "ops-op-declop-webhooks")["rules"] == webhook_rules(perms, "ops-op-declop", [])
    assert one(plain, "NetworkPolicy")["spec"]["ingress"][-1] == {"ports": [{"port": "webhook", "protocol": "TCP"}]}


def test_webhooks_with_a_mounted_certificate(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "--set", "webhooks.enabled=true", "--set", "webhooks.certSecret=op-webhook-tls",
                  "--set", "webhooks.service.port=8443", "--set", "webhooks.port=10250")  # fmt: skip
    env = env_of(docs)
    assert env["DECLOP_WEBHOOK_CERT_DIR"] == "/etc/declop/webhook-tls"
    assert (env["DECLOP_WEBHOOK_PORT"], env["DECLOP_WEBHOOK_SERVICE"]) == ("10250", "ops/op-declop-webhook:8443")
    assert {"name": "webhook-tls", "mountPath": "/etc/declop/webhook-tls", "readOnly": True} in container(docs)["volumeMounts"]
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": "op-webhook-tls", "defaultMode": 0o440}} in volumes
    assert one(docs, "Service", "op-declop-webhook")["spec"]["ports"][0]["port"] == 8443
    # no CA of declop's: no Secret access at all, and no CA Secret
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding") and "webhook" in d["metadata"]["name"]]
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert "secrets" not in json.dumps([d for d in docs if d["kind"] in ("Role", "ClusterRole")])


def test_webhooks_rbac_is_cluster_scoped_also_with_namespaced_scope(tool_env: dict[str, str]) -> None:
    docs = render(tool_env, "-f", str(SCENARIOS["namespaced"]), "--set", "webhooks.enabled=true")
    one(docs, "ClusterRole", "ops-op-declop-webhooks")  # the configurations are cluster-scoped
    assert one(docs, "Role", "op-declop-webhook-ca")["metadata"]["namespace"] == "ops"  # not a watched namespace
    off = render(tool_env, "--set", "webhooks.enabled=true", "--set", "rbac.create=false")
    assert not [d for d in off if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert one(off, "Service", "op-declop-webhook")


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "webhooks.failurePolicy=Ignore"],
        ["--set", "webhooks.port=70000"],
        ["--set", "webhooks.enabled=true", "--set", "webhooks.conversionCRDs[0]=widgets"],
        ["--set", "webhooks.certSecret=Not_A_Name"],
        ["--set", "webhooks.service.type=NodePort"],
        ["--set", "webhooks.enabld=true"],
    ],
    ids=["failure policy is per handler", "port", "crd without group", "secret name",
         "service typo", "typo"],
)  # fmt: skip
def test_webhooks_schema_rejects(tool_env: dict[str, str], bad: list[str]) -> None:
    assert "values don't meet the specifications of the schema" in render_error(tool_env, *bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "webhooks.conversionCRDs[0]=widgets.example.com"],
         "declop: webhooks.conversionCRDs (widgets.example.com) needs webhooks.enabled=true"),
        (["--set", "webhooks.enabled=true", "--set", "webhooks.port=8080"],
         "declop: webhooks.port=8080 is also metrics.port; give the webhook server its own port"),
        (["--set", "webhooks.enabled=true", "--set", "webhooks.port=8081"],
         "declop: webhooks.port=8081 is also health.port"),
        (["--set", "webhook.enabled=true"], "declop: unknown value 'webhook': did you mean 'webhooks'?"),
        (["--set", "webhooks.enable=true"], "declop: unknown value 'webhooks.enable': did you mean 'webhooks.enabled'?"),
    ],
    ids=["converters without webhooks", "metrics port", "health port", "webhook", "enable"],
)  # fmt: skip
def test_webhooks_bad_values_fail_clearly(tool_env: dict[str, str], args: list[str], message: str) -> None:
    error = render_error(tool_env, *args)
    assert message in error, error
    # the same port is fine once metrics are off
    if "metrics.port" in message:
        render(tool_env, *args, "--set", "metrics.enabled=false")


def test_helm_install_with_webhooks_grants_exactly_the_named_objects(
    tool_env: dict[str, str], namespace: str
) -> None:
    """The RBAC as the apiserver evaluates it (kubectl auth can-i), not as rendered."""
    sa = f"system:serviceaccount:{namespace}:op-declop"
    name = f"{namespace}-op-declop"
    install = run(tool_env, "helm", "install", "op", str(CHART), "-n", namespace, "-f", str(SCENARIOS["webhooks"]))
    try:
        assert "behind Service op-declop-webhook (port 443)" in install.stdout, install.stdout
        assert f"ValidatingWebhookConfiguration / MutatingWebhookConfiguration {name}" in install.stdout
        assert f"Secret {namespace}/{name}-webhook-ca" in install.stdout
        service = kubectl_json(tool_env, "get", "service", "op-declop-webhook", "-n", namespace)
        assert service["spec"]["ports"][0]["targetPort"] == "webhook"
        vwc, mwc = "validatingwebhookconfigurations", "mutatingwebhookconfigurations"
        # the chart creates the configurations and the CA Secret (empty): the operator needs no
        # create, which RBAC cannot limit by name
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            assert "webhooks" not in kubectl_json(tool_env, "get", kind, name)
        assert "data" not in kubectl_json(tool_env, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
        expect = {
            ("create", vwc): False,
            ("create", mwc): False,
            ("patch", f"{vwc}/{name}"): True,
            ("patch", f"{mwc}/{name}"): True,
            ("get", f"{vwc}/{name}"): False,
            ("update", f"{vwc}/{name}"): False,
            ("delete", f"{vwc}/{name}"): False,
            ("delete", f"{mwc}/{name}"): False,
            ("patch", f"{vwc}/another"): False,
            ("patch", f"{mwc}/another"): False,
            ("list", vwc): False,
            ("patch", "customresourcedefinitions/widgets.example.com"): True,
            ("get", "customresourcedefinitions/widgets.example.com"): False,
            ("update", "customresourcedefinitions/widgets.example.com"): False,
            ("patch", "customresourcedefinitions/gadgets.example.com"): False,
            ("create", "customresourcedefinitions"): False,
            ("create", "secrets", "-n", namespace): False,
            ("get", f"secrets/{name}-webhook-ca", "-n", namespace): True,
            ("update", f"secrets/{name}-webhook-ca", "-n", namespace): True,
            ("patch", f"secrets/{name}-webhook-ca", "-n", namespace): False,
            ("delete", f"secrets/{name}-webhook-ca", "-n", namespace): False,
            ("update", "secrets/other", "-n", namespace): False,
            ("get", "secrets/other", "-n", namespace): False,
            ("list", "secrets", "-n", namespace): False,
            ("get", f"secrets/{name}-webhook-ca", "-n", "default"): False,
            ("create", "secrets", "-n", "default"): False,
        }
        assert {k: can_i(tool_env, sa, *k) for k in expect} == expect
    finally:
        run(tool_env, "helm", "uninstall", "op", "-n", namespace, check=False)
    gone = run(tool_env, "kubectl", "get", "clusterrole", f"{namespace}-op-declop-webhooks", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_a_ca_secret_an_earlier_operator_created_is_kept_not_a_conflict(tool_env: dict[str, str], namespace: str) -> None:
    """Before the chart created the CA Secret, the operator did: installing this chart over one
    must neither fail ("invalid ownership metadata") nor replace the CA in it."""
    name = f"{namespace}-op-declop-webhook-ca"
    run(tool_env, "kubectl", "create", "secret", "generic", name, "-n", namespace, "--from-literal=ca.crt=earlier", "--from-literal=ca.key=earlier")
    try:
        install = run(tool_env, "helm", "install", "op", str(CHART), "-n", namespace, "-f", str(SCENARIOS["webhooks"]), check=False)
        assert install.returncode == 0, install.stderr
        secret = kubectl_json(tool_env, "get", "secret", name, "-n", namespace)
        assert secret["data"]["ca.crt"] == base64.b64encode(b"earlier").decode()
        assert "meta.helm.sh/release-name" not in secret["metadata"].get("annotations", {})
        upgrade = run(tool_env, "helm", "upgrade", "op", str(CHART), "-n", namespace, "-f", str(SCENARIOS["webhooks"]), check=False)
        assert upgrade.returncode == 0, upgrade.stderr
    finally:
        run(tool_env, "helm", "uninstall", "op", "-n", namespace, check=False)
    assert kubectl_json(tool_env, "get", "secret", name, "-n", namespace)["data"]["ca.crt"], "helm uninstall deleted a Secret it did not own"


# -- helm install on the control plane ---------------------------------------------------------


def test_helm_install(
    tool_env: dict[str, str], namespace: str, service_monitor_crd: Any, tmp_path: Path
) -> None:
    sa = f"system:serviceaccount:{namespace}:op-declop"
    install = run(
        tool_env,
        "helm",
        "install",
        "op",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "replicaCount=2",
        "--set",
        "podDisruptionBudget.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
    )
    try:
        assert f"kubectl logs -n {namespace} deployment/op-declop -f" in install.stdout
        assert "EXAMPLE handler" in install.stdout
        names = set(
            run(
                tool_env,
                "kubectl",
                "get",
                "-n",
                namespace,
                "-o",
                "name",
                "deployments,serviceaccounts,configmaps,services,poddisruptionbudgets,servicemonitors,roles,rolebindings",
            ).stdout.split()
        )
        assert {
            "deployment.apps/op-declop",
            "serviceaccount/op-declop",
            "configmap/op-declop-handlers",
            "service/op-declop-metrics",
            "poddisruptionbudget.policy/op-declop",
            "servicemonitor.monitoring.coreos.com/op-declop",
            "role.rbac.authorization.k8s.io/op-declop-leader-election",
            "rolebinding.rbac.authorization.k8s.io/op-declop-leader-election",
        } <= names
        kubectl_json(tool_env, "get", "clusterrole", f"{namespace}-op-declop")
        kubectl_json(tool_env, "get", "clusterrolebinding", f"{namespace}-op-declop")

        expect = {
            ("list", "pods", "-A"): True,
            ("watch", "pods", "-A"): True,
            ("create", "events.events.k8s.io", "-n", "default"): True,
            ("create", "events", "-n", "default"): False,  # core events are never written
            ("patch", "events.events.k8s.io", "-n", "default"): True,
            ("create", "leases.coordination.k8s.io", "-n", namespace): True,
            ("update", "leases.coordination.k8s.io/op-declop", "-n", namespace): True,
            ("patch", "leases.coordination.k8s.io/op-declop", "-n", namespace): False,
            ("create", "tokenreviews.authentication.k8s.io"): True,
            ("create", "subjectaccessreviews.authorization.k8s.io"): True,
            ("get", "leases.coordination.k8s.io/op-declop", "-n", namespace): True,
            ("patch", "pods", "-n", "default"): False,
            ("delete", "pods", "-n", "default"): False,
            ("get", "secrets", "-n", namespace): False,
            ("list", "configmaps", "-n", namespace): False,
            ("update", "leases.coordination.k8s.io/other", "-n", namespace): False,
            ("list", "leases.coordination.k8s.io", "-n", namespace): False,
            ("delete", "leases.coordination.k8s.io/op-declop", "-n", namespace): False,
            ("create", "leases.coordination.k8s.io", "-n", "default"): False,
        }
        assert {k: can_i(tool_env, sa, *k) for k in expect} == expect

        # The pod template is admitted by PodSecurity "restricted" as a real Pod.
        run(
            tool_env,
            "kubectl",
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
        )
        template_ = kubectl_json(tool_env, "get", "deployment", "op-declop", "-n", namespace)[
            "spec"
        ]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "op-declop-pss",
                "namespace": namespace,
                "labels": template_["metadata"]["labels"],
            },
            "spec": template_["spec"],
        }
        run(tool_env, "kubectl", "create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))

        # helm upgrade: new handlers roll the Pods; one replica switches election and strategy off.
        handlers = tmp_path / "handlers.py"
        handlers.write_text('import declop\n\n@declop.reconciler("pods")\ndef h(**_):\n    pass\n')
        before = template_["metadata"]["annotations"]["checksum/handlers"]
        run(
            tool_env,
            "helm",
            "upgrade",
            "op",
            str(CHART),
            "-n",
            namespace,
            "--reuse-values",
            "--set",
            "replicaCount=1",
            "--set",
            "podDisruptionBudget.enabled=false",
            "--set-file",
            f"handlers.files.handlers\\.py={handlers}",
            "--set-json",
            'rbac.watch=[{"resource": "pods"}]',
        )
        deployment = kubectl_json(tool_env, "get", "deployment", "op-declop", "-n", namespace)
        # one replica keeps leader election (the default) and so the RollingUpdate strategy
        assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
        assert (
            deployment["spec"]["template"]["metadata"]["annotations"]["checksum/handlers"] != before
        )
        cm = kubectl_json(tool_env, "get", "configmap", "op-declop-handlers", "-n", namespace)
        assert cm["data"] == {"handlers.py": handlers.read_text()}
        roles = run(tool_env, "kubectl", "get", "roles", "-n", namespace, "-o", "name").stdout
        assert "leader-election" in roles  # still electing with one replica
    finally:
        run(tool_env, "helm", "uninstall", "op", "-n", namespace, check=False)
    gone = run(tool_env, "kubectl", "get", "clusterrole", f"{namespace}-op-declop", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def kubelet_env(
    control_plane: Any, tool_env: dict[str, str], namespace: str, tmp_path: Path
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """Play kubelet for the installed Deployment ``op-declop``: (its container, the container's
    env, the env of a ``declop run`` process given that env, the handlers ConfigMap laid out as a
    volume, a token of the ServiceAccount and free local ports)."""
    spec = kubectl_json(tool_env, "get", "deployment", "op-declop", "-n", namespace)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "handlers")
    assert env["DECLOP_PATHS"] == mount["mountPath"]

    # Laid out as by the kubelet: ..<time>/NAME, ..data -> ..<time>, NAME -> ..data/NAME
    cm_name = next(v for v in spec["volumes"] if v["name"] == "handlers")["configMap"]["name"]
    data = kubectl_json(tool_env, "get", "configmap", cm_name, "-n", namespace)["data"]
    volume = tmp_path / "handlers"
    (volume / "..2026_01_01_00_00_00.000000001").mkdir(parents=True)
    for key, text in data.items():
        (volume / "..2026_01_01_00_00_00.000000001" / key).write_text(text)
        (volume / key).symlink_to(f"..data/{key}")
    (volume / "..data").symlink_to("..2026_01_01_00_00_00.000000001")

    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text(control_plane.service_account_token(namespace, spec["serviceAccountName"]))
    (sa_dir / "ca.crt").write_text(Path(control_plane.ca_file).read_text())
    (sa_dir / "namespace").write_text(namespace)

    host, port = control_plane.host.removeprefix("https://").rsplit(":", 1)
    process_env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "DECLOP_SERVICE_ACCOUNT_DIR": str(sa_dir),
        **env,
        "DECLOP_PATHS": str(volume),
        "DECLOP_HEALTH_PORT": str(free_port()),
        "DECLOP_METRICS_PORT": str(free_port()),
    }
    if "DECLOP_WEBHOOK_PORT" in env:
        process_env["DECLOP_WEBHOOK_PORT"] = str(free_port())
    return c, env, process_env


def test_installed_container_runs_declop(
    control_plane: Any, tool_env: dict[str, str], namespace: str, tmp_path: Path
) -> None:
    """Play kubelet for the installed Deployment: its env, volume and token; then `declop run`."""
    run(
        tool_env,
        "helm",
        "install",
        "op",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "replicaCount=2",
        "--set",
        "gracePeriod=5",
    )
    try:
        c, env, process_env = kubelet_env(control_plane, tool_env, namespace, tmp_path)
        health, metrics = process_env["DECLOP_HEALTH_PORT"], process_env["DECLOP_METRICS_PORT"]
        with OperatorProcess(c.get("args", []), env=process_env) as op:
            wait_for(
                lambda: (
                    run(
                        tool_env,
                        "kubectl",
                        "run",
                        "web",
                        "--image=nginx",
                        "-n",
                        namespace,
                        check=False,
                    ).returncode
                    == 0
                ),
                timeout=30,
                what="kubectl run web (the namespace's default ServiceAccount)",
            )
            try:
                wait_for(
                    lambda: [
                        line
                        for line in op.lines
                        if "Pod created" in line and f'"{namespace}"' in line and '"web"' in line
                    ],
                    timeout=60,  # a fresh namespace: the Lease's first creation waits ~27 s (contract.md §7)
                    what=f"'Pod created' for {namespace}/web",
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; declop printed:\n" + "\n".join(op.lines + op.stderr)
                ) from None
            lease = kubectl_json(
                tool_env, "get", "lease", env["DECLOP_LEADER_ELECTION_ID"], "-n", namespace
            )
            assert lease["spec"].get("holderIdentity")

            def get(url: str, token: str | None = None) -> tuple[int, str]:
                insecure = ssl.create_default_context()
                insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # self-signed
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                request = urllib.request.Request(url, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=5, context=insecure if url.startswith("https") else None) as r:
                        return r.status, r.read().decode()
                except urllib.error.HTTPError as exc:
                    return exc.code, exc.read().decode()

            assert get(f"http://127.0.0.1:{health}/healthz")[0] == 200
            assert wait_for(
                lambda: get(f"http://127.0.0.1:{health}/readyz")[0] == 200, timeout=10, what="/readyz 200"
            )
            # secure metrics with the chart's RBAC: the operator's own identity runs the
            # TokenReview/SubjectAccessReview; a scraper needs the metrics-reader ClusterRole
            url = f"https://127.0.0.1:{metrics}/metrics"
            assert get(url) == (401, "Unauthorized\n")
            for sa in ("scraper", "nobody"):
                run(tool_env, "kubectl", "create", "serviceaccount", sa, "-n", namespace)
            run(tool_env, "kubectl", "create", "clusterrolebinding", f"{namespace}-scraper",
                f"--clusterrole={namespace}-op-declop-metrics-reader", f"--serviceaccount={namespace}:scraper")
            try:
                assert get(url, control_plane.service_account_token(namespace, "nobody"))[0] == 403
                status, text = get(url, control_plane.service_account_token(namespace, "scraper"))
                assert status == 200, text
            finally:
                run(tool_env, "kubectl", "delete", "clusterrolebinding", f"{namespace}-scraper", check=False)
            assert "# TYPE" in text
            code = op.stop()
        assert code == 0, "\n".join(op.lines + op.stderr)
        # released on SIGTERM, so that a RollingUpdate's new Pod takes over at once
        lease = kubectl_json(
            tool_env, "get", "lease", env["DECLOP_LEADER_ELECTION_ID"], "-n", namespace
        )
        assert not lease["spec"].get("holderIdentity"), lease["spec"]
    finally:
        run(tool_env, "helm", "uninstall", "op", "-n", namespace, check=False)


GUARD = '''
import declop


@declop.validator("configmaps", labels="chart-webhook-test=yes", failure_policy="Ignore")
def guard(obj, **_):
    if "forbidden" in (obj.get("data") or {}):
        raise declop.Rejected("no key 'forbidden'", field="data")
'''


def test_installed_container_with_webhooks_registers_the_charts_service(
    control_plane: Any, tool_env: dict[str, str], tmp_path: Path
) -> None:
    """Play kubelet for a release with webhooks.enabled: `declop run` given the container's env
    (DECLOP_WEBHOOK_SERVICE, _NAME, _NAMESPACE), its ServiceAccount token and the chart's RBAC
    fills in the chart's empty CA Secret and registers the service form of the client config,
    with a serving certificate for the Service's DNS name signed by that CA; a `helm upgrade` that
    changes those objects' labels leaves what the operator wrote (CA, webhooks) alone. (The apiserver cannot call the
    Service without kube-proxy: tests/node/test_webhooks_on_node.py does that on a real node.)"""
    namespace = f"wh-{os.urandom(3).hex()}"  # short: the CA's subject holds <namespace>/<secret>
    run(tool_env, "kubectl", "create", "namespace", namespace)
    handlers = tmp_path / "guard.py"
    handlers.write_text(GUARD)
    name = f"{namespace}-op-declop"
    run(tool_env, "helm", "install", "op", str(CHART), "-n", namespace, "--set", "webhooks.enabled=true",
        "--set-file", f"handlers.files.guard\\.py={handlers}", "--set", "leaderElection.enabled=false")  # fmt: skip
    try:
        c, env, process_env = kubelet_env(control_plane, tool_env, namespace, tmp_path)
        assert env["DECLOP_WEBHOOK_SERVICE"] == f"{namespace}/op-declop-webhook:443"

        # the chart creates both configurations and the CA Secret empty (so that `helm uninstall`
        # deletes them, and the operator needs no create)
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            made = kubectl_json(tool_env, "get", kind, name)
            assert "webhooks" not in made and made["metadata"]["labels"]["app.kubernetes.io/instance"] == "op"
        made = kubectl_json(tool_env, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
        assert "data" not in made and made["metadata"]["labels"]["app.kubernetes.io/instance"] == "op"

        def registered() -> dict[str, Any] | None:
            found = run(tool_env, "kubectl", "get", "validatingwebhookconfiguration", name, "-o", "json", check=False)
            config = json.loads(found.stdout) if found.returncode == 0 else {}
            return config if config.get("webhooks") else None

        with OperatorProcess(c.get("args", []), env=process_env) as op:
            try:
                config = wait_for(registered, timeout=30, what=f"ValidatingWebhookConfiguration {name}")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; declop printed:\n" + "\n".join(op.lines + op.stderr)) from None
            (hook,) = config["webhooks"]
            service = hook["clientConfig"]["service"]
            assert (service["namespace"], service["name"], service["port"]) == (namespace, "op-declop-webhook", 443)
            assert "url" not in hook["clientConfig"]
            assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": ["kube-system", "kube-public", "kube-node-lease", namespace]} in (
                hook["namespaceSelector"]["matchExpressions"]
            )
            secret = kubectl_json(tool_env, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
            ca = base64.b64decode(secret["data"]["ca.crt"])
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
            # what the apiserver would do through the Service: TLS to the Pod's webhook port,
            # verifying the Service's DNS name against the caBundle
            context = ssl.create_default_context(cadata=ca.decode())
            port = int(process_env["DECLOP_WEBHOOK_PORT"])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname=f"op-declop-webhook.{namespace}.svc") as tls:
                    assert tls.version() in ("TLSv1.2", "TLSv1.3")
            code = op.stop()
        assert code == 0, "\n".join(op.lines + op.stderr)
        # an upgrade leaves the operator's entries and CA alone (the chart never sets `webhooks`
        # nor `data`): Helm's three-way merge patches only what its manifests changed — here the
        # labels, so the Secret and the configurations are patched, and keep what declop wrote
        run(tool_env, "helm", "upgrade", "op", str(CHART), "-n", namespace, "--reuse-values",
            "--set", "commonLabels.upgraded=yes")  # fmt: skip
        after = kubectl_json(tool_env, "get", "secret", f"{name}-webhook-ca", "-n", namespace)
        assert after["metadata"]["labels"]["upgraded"] == "yes"
        assert after["data"] == secret["data"]
        config = registered()
        assert config is not None and config["metadata"]["labels"]["upgraded"] == "yes"
        assert base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"]) == ca
        # ... and `helm uninstall` deletes both: nothing is left to refuse writes with no operator
        run(tool_env, "helm", "uninstall", "op", "-n", namespace)
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            gone = run(tool_env, "kubectl", "get", kind, name, "--ignore-not-found", "-o", "name", check=False)
            assert gone.stdout.strip() == "", f"{kind} {name} outlived helm uninstall"
        gone = run(tool_env, "kubectl", "get", "secret", f"{name}-webhook-ca", "-n", namespace, "--ignore-not-found", "-o", "name", check=False)
        assert gone.stdout.strip() == "", "the CA Secret outlived helm uninstall"
    finally:
        run(tool_env, "helm", "uninstall", "op", "-n", namespace, check=False)
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            run(tool_env, "kubectl", "delete", kind, name, "--ignore-not-found", check=False)
        run(tool_env, "kubectl", "delete", "namespace", namespace, "--wait=false", check=False)


# -- the Dockerfile, read as text --------------------------------------------------------------


def dockerfile_stages() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """(global ARG defaults, stages as [(INSTRUCTION, arguments)]), continuation lines joined."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(
            line
            for line in DOCKERFILE.read_text().splitlines()
            if not line.lstrip().startswith("#")
        ),
    )
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        instruction, _, rest = line.strip().partition(" ")
        instruction, rest = instruction.upper(), " ".join(rest.split())
        if instruction == "FROM":
            stages.append([])
        if not stages:
            assert instruction == "ARG", f"{instruction} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default
            continue
        stages[-1].append((instruction, rest))
    return global_args, stages


def test_dockerfile() -> None:
    global_args, stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: a builder and a runtime stage"
    # the base pinned by digest, the tag beside it (make pin-base moves it)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", global_args["PYTHON_IMAGE"])
    froms = {stage[0][1].rpartition(" AS ")[2]: stage[0][1] for stage in stages[:-1]}
    runtime_from = stages[-1][0][1]
    # same Python in every stage that runs it; `wheels` is only files
    assert froms.pop("wheels") == "scratch AS wheels", "a named context `wheels` replaces it"
    assert all(f.startswith("${PYTHON_IMAGE}") for f in [*froms.values(), runtime_from]), froms
    builder = next(stage for stage in stages if stage[0][1].endswith(" AS builder"))
    final = stages[-1]
    builder_runs = " ".join(rest for ins, rest in builder if ins == "RUN")
    assert "venv /opt/declop" in builder_runs
    # the install needs no network: every wheel comes from the `wheels` stage or context, and
    # exactly the locks' pins with their hashes; declop's own wheel adds nothing (--no-deps)
    assert builder_runs.startswith("--network=none --mount=type=bind,from=wheels,"), builder_runs
    assert builder_runs.count("--no-index --find-links /wheels --require-hashes --no-deps") == 2
    assert "-r requirements/image.lock" in builder_runs and "-r requirements/build.lock" in builder_runs
    assert "/opt/declop/bin/pip install --no-index --no-deps" in builder_runs
    assert "/opt/declop/bin/pip check" in builder_runs
    copies = [rest for ins, rest in builder if ins == "COPY"]
    assert any("declop/" in c for c in copies) and any("setup.cfg" in c for c in copies)
    assert "requirements/ requirements/" in copies
    download = next(stage for stage in stages if stage[0][1].endswith(" AS wheel-download"))
    assert "--require-hashes --no-deps" in " ".join(rest for ins, rest in download if ins == "RUN")
    tini = next(stage for stage in stages if stage[0][1].endswith(" AS tini"))
    assert "apt-get install -y --no-install-recommends tini" in " ".join(r for i, r in tini if i == "RUN")

    final_ = dict((ins, rest) for ins, rest in final)  # last of each instruction wins, as in Docker
    assert "--from=builder /opt/declop /opt/declop" in [
        rest for ins, rest in final if ins == "COPY"
    ]
    assert not [rest for ins, rest in final if ins == "RUN"], (
        "nothing is installed in the runtime stage"
    )
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", final_["USER"]), (
        "USER must be numeric and non-root"
    )
    assert final_["USER"] == "65532:65532"
    assert "--from=tini /usr/bin/tini-static /usr/bin/tini" in [
        rest for ins, rest in final if ins == "COPY"
    ]
    # exec form; tini is PID 1 (signals forwarded, orphans reaped), arguments go to `declop run`
    assert json.loads(final_["ENTRYPOINT"]) == ["tini", "--", "declop", "run"]
    assert "CMD" not in final_, "handlers come from DECLOP_PATHS / DECLOP_MODULES, or arguments"
    env = " ".join(rest for ins, rest in final if ins == "ENV")
    for setting in (
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
        "HOME=/tmp",
        "PATH=/opt/declop/bin:$PATH",
    ):
        assert setting in env.split(), setting
    assert final_["EXPOSE"].split() == ["8080", "8081"]
    labels = " ".join(rest for ins, rest in final if ins == "LABEL")
    for key in ("title", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert f"ARG VERSION={declop.__version__}" in [
        f"ARG {rest}" for ins, rest in final if ins == "ARG"
    ]


def test_image_chart_and_package_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"] == ">=1.29.0-0"
    assert chart["appVersion"] == declop.__version__
    _, stages = dockerfile_stages()
    user, group = dict(stages[-1])["USER"].split(":")
    security = values["podSecurityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (int(user), int(group))
    assert dict(stages[-1])["EXPOSE"].split() == [
        str(values["metrics"]["port"]),
        str(values["health"]["port"]),
    ]
    # the build context is a whitelist holding what the builder copies
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    ignore = [line for line in ignore if line and not line.startswith("#")]
    assert ignore[0] == "*"
    for needed in ("pyproject.toml", "setup.cfg", "README.md", "declop/"):
        assert f"!{needed}" in ignore
