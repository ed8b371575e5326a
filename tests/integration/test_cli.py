"""`declop run` with bad input: one clear line on stderr, a non-zero exit, no traceback unless -v."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HANDLER = """
import declop

@declop.reconciler({resource!r})
def handler(**_):
    return None
"""


def declop_run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "declop", "run", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("declop: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_missing_file(tmp_path):
    assert_one_line_error(declop_run(str(tmp_path / "missing.py")), "no such file", "missing.py")


def test_syntax_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import declop\n\ndef oops(:\n    pass\n")
    assert_one_line_error(declop_run(str(bad)), "syntax error", "bad.py:3")


def test_syntax_error_with_verbose_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def oops(:\n")
    result = declop_run("-v", str(bad))
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("declop: error: syntax error")


def test_import_error_in_the_handlers(tmp_path):
    bad = tmp_path / "needs.py"
    bad.write_text("import declop\nimport not_a_real_module_xyz\n")
    assert_one_line_error(declop_run(str(bad)), "needs.py", "not_a_real_module_xyz")


def test_file_that_registers_nothing(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("import declop\n")
    assert_one_line_error(declop_run(str(empty)), "no reconciler is registered", "empty.py")


def test_no_paths_at_all():
    assert_one_line_error(declop_run(), "nothing to run")


def test_no_kubeconfig(tmp_path):
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="pods"))
    env = {"KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}
    assert_one_line_error(declop_run(str(h), env=env), "no kubeconfig", "declop dev")


def test_unreachable_apiserver(tmp_path, control_plane):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    config = open(control_plane.kubeconfig_path).read()
    config = config.replace(control_plane.host, f"https://127.0.0.1:{port}")
    kc = tmp_path / "kubeconfig"
    kc.write_text(config)
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="pods"))
    assert_one_line_error(declop_run(str(h), "--kubeconfig", str(kc)), "cannot reach the apiserver", str(port))


def test_unknown_resource(tmp_path, kubeconfig):
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="flumpets"))
    assert_one_line_error(declop_run(str(h), "--kubeconfig", kubeconfig), "unknown resource 'flumpets'", "kubectl api-resources")


@pytest.fixture(scope="module")
def widget_crd(control_plane):
    env = control_plane.env()
    handlers = Path(__file__).resolve().parents[2] / "examples" / "crd" / "handlers.py"
    crd = subprocess.run([sys.executable, "-m", "declop", "crd", str(handlers)], capture_output=True, text=True, timeout=60, check=True).stdout
    for args in (
        ["apply", "-f", "-"],
        ["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"],
    ):
        result = subprocess.run(["kubectl", *args], env=env, input=crd, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("resource", "meant"),
    [("deploymnets", "'deployments.apps'"), ("widgts.example.com", "'widgets.example.com'")],
)
def test_misspelt_resource_suggests_the_served_one(tmp_path, kubeconfig, widget_crd, resource, meant):
    """Discovery on the real apiserver: the closest listable and watchable resources are named.
    (A singular such as 'pod' is no mistake: it resolves as kubectl reads it.)"""
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource=resource))
    assert_one_line_error(
        declop_run(str(h), "--kubeconfig", kubeconfig),
        f"unknown resource {resource!r}: not served by the apiserver; did you mean {meant}?",
    )


# -- handler mistakes: one line from the loader, before any apiserver is contacted -----------------


@pytest.mark.parametrize(
    ("source", "needles"),
    [
        ("@declop.reconciler('pods')\ndef h(reqest, **_):\n    pass\n",
         ["handler 'h' (h.py:2) takes an unknown argument 'reqest': did you mean 'request'?"]),
        ("@declop.reconciler('pods')\ndef h(request, loger=None):\n    pass\n",
         ["takes an unknown argument 'loger', which would always keep its default: did you mean 'logger'?"]),
        ("@declop.reconciler('pods')\ndef h(spec, meta, **kwargs):\n    pass\n",
         ["takes 'spec', which Kopf passes and declop does not:", "obj['spec']"]),
        ("@declop.reconciler('pods', own=['configmaps'])\ndef h(**_):\n    pass\n",
         ["@reconciler got an unknown option own=: did you mean 'owns'?"]),
        ("@declop.reconciler('pods', finalizers='example.com/x')\ndef h(**_):\n    pass\n",
         ["@reconciler got an unknown option finalizers=: did you mean 'finalizer'?"]),
        ("@declop.reconciler('zalando.org', 'v1', 'kopfexamples')\ndef h(**_):\n    pass\n",
         ["declop takes the resource as one string: @declop.reconciler('kopfexamples.zalando.org')"]),
    ],
    ids=["misspelt argument with **_", "misspelt defaulted argument", "Kopf argument", "misspelt option",
         "misspelt finalizer option", "Kopf resource in parts"],
)
def test_handler_mistakes_explain_themselves(tmp_path, source, needles):
    h = tmp_path / "h.py"
    h.write_text("import declop\n" + source)
    env = {"KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), env=env)
    assert_one_line_error(result, *needles)
    assert result.returncode == 1
    assert "TypeError" not in result.stderr


def test_options_read_declop_environment_variables(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("import declop\n")
    # DECLOP_PATHS stands in for the positional argument (the Helm chart uses the variables)
    assert_one_line_error(declop_run(env={"DECLOP_PATHS": str(empty)}), "no reconciler is registered")


def test_help_lists_the_options():
    result = subprocess.run([sys.executable, "-m", "declop", "run", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for option in ("--namespace", "--all-namespaces", "--kubeconfig", "--context", "--log-format", "--verbose",
                   "--quiet", "--health-port", "--metrics-port", "--leader-elect", "--leader-election-id",
                   "--leader-election-namespace", "--grace-period"):
        assert option in result.stdout, option


@pytest.mark.parametrize(
    ("timings", "env"),
    [
        (("--lease-duration", "5", "--renew-deadline", "6"), {}),  # duration must exceed deadline
        (("--renew-deadline", "2.4"), {}),  # deadline must exceed 1.2 × retry (2.4)
        ((), {"DECLOP_RETRY_PERIOD": "0", "DECLOP_RENEW_DEADLINE": "1", "DECLOP_LEASE_DURATION": "2"}),
    ],
)
def test_contradictory_lease_timings_exit_2_before_connecting(tmp_path, timings, env):
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="pods"))
    env = {**env, "KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), "--leader-elect", *timings, env=env)
    assert_one_line_error(result, "--lease-duration", "--renew-deadline", "1.2 × --retry-period")
    assert result.returncode == 2


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        (("--shards", "0"), {}, ("--shards must be 1 or more", "got 0")),
        ((), {"DECLOP_SHARDS": "-3"}, ("--shards must be 1 or more", "got -3")),
        (("--shards", "4", "--leader-elect"), {}, ("--shards replaces --leader-elect", "drop --leader-elect")),
        (("--shards", "4"), {"DECLOP_LEADER_ELECT": "true"}, ("--shards replaces --leader-elect",)),
    ],
    ids=["zero", "negative-from-env", "with-leader-elect", "with-leader-elect-from-env"],
)
def test_bad_shards_exit_2_before_connecting(tmp_path, args, env, needles):
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="pods"))
    env = {**env, "KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), *args, env=env)
    assert_one_line_error(result, *needles)
    assert result.returncode == 2


def test_a_shard_key_that_is_not_uid_or_namespace_exits_2(tmp_path):
    h = tmp_path / "h.py"
    h.write_text("import declop\n\n@declop.reconciler('pods', shard_by='name')\ndef handler(**_):\n    pass\n")
    env = {"KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), "--shards", "4", env=env)
    assert_one_line_error(result, "shard_by must be 'uid' (the default) or 'namespace'", "'name'")
    assert result.returncode == 2


def test_more_shards_than_leases_can_carry_exits_2(tmp_path):
    h = tmp_path / "h.py"
    h.write_text(HANDLER.format(resource="pods"))
    env = {"KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), "--shards", "5000", env=env)
    assert_one_line_error(result, "--shards 5000 is more than 1024", "2500 writes/s", "use at most 1024")
    assert result.returncode == 2


@pytest.mark.parametrize("value", ["0", "-1", "'4'", "True"])
def test_a_bad_max_concurrent_is_refused_in_sharded_mode_too(tmp_path, value):
    """max_concurrent is per replica (each replica runs that many workers for its own ranges);
    a value that is not a positive int is refused before connecting, sharded or not."""
    h = tmp_path / "h.py"
    h.write_text(f"import declop\n\n@declop.reconciler('pods', max_concurrent={value})\ndef handler(**_):\n    pass\n")
    env = {"KUBECONFIG": str(tmp_path / "nope"), "KUBERNETES_SERVICE_HOST": ""}  # never reached
    result = declop_run(str(h), "--shards", "4", env=env)
    assert_one_line_error(result, "max_concurrent must be a positive int", "per replica", f"got {value}")
    assert result.returncode == 2


def test_a_namespace_shard_key_on_a_cluster_scoped_resource_exits_2(tmp_path, kubeconfig):
    """Every cluster-scoped object hashes the empty namespace: one range, one replica for all."""
    h = tmp_path / "h.py"
    h.write_text("import declop\n\n@declop.reconciler('namespaces', shard_by='namespace')\ndef handler(**_):\n    pass\n")
    result = declop_run(str(h), "--kubeconfig", kubeconfig, "--shards", "4", "--leader-election-namespace", "default")
    assert_one_line_error(result, "shard_by='namespace' on namespaces, which is cluster-scoped", "use shard_by='uid'")
    assert result.returncode == 2
