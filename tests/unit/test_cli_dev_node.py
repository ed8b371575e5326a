"""``declop dev --node`` (and so ``make run``) installs the chart with least privilege: the
``rbac-values.yaml`` beside the handlers, else exactly what ``declop rbac PATHS --values`` writes
for them — never the dev cluster's old "everything" (``DEV_RBAC``). This is the function
``_run_in_cluster`` calls for ``install_operator(..., rbac_values=...)``; the node itself is
exercised by tests/node and tests/integration/test_dev.py, which need root and a node."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest
import yaml
from click.testing import CliRunner

import declop.registry as registry_module
from declop import cli
from declop.cli import dev as dev_command, rbac as rbac_command
from declop.loader import load
from declop.registry import Registry

HANDLERS = """
import declop

@declop.reconciler("pods", owns=["deploy"], finalizer="example.com/cleanup")
def pods(request):
    pass
"""


@pytest.fixture()
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    monkeypatch.setattr(rbac_command, "default_registry", fresh)
    monkeypatch.setattr(rbac_command, "setup_logging", lambda *a: None)
    yield fresh
    for name in set(sys.modules) - before:
        del sys.modules[name]


def dev_cluster(tmp_path: Path) -> SimpleNamespace:
    """What node_rbac reads of a ControlPlane: its kubeconfig (an apiserver that does not answer
    here: the names are then read against the standard resources, as --offline reads them) and
    its scratch folder."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    scratch = tmp_path / "cp"
    scratch.mkdir()
    return SimpleNamespace(kubeconfig_path=str(kubeconfig), tmp_dir=str(scratch))


def test_without_rbac_values_the_node_gets_what_declop_rbac_generates(registry: Registry, tmp_path: Path) -> None:
    """Failed before: dev --node installed DEV_RBAC ('*' on everything) when no rbac-values.yaml
    sat beside the handlers (there was no node_rbac; _run_in_cluster passed rbac_values=None)."""
    folder = tmp_path / "ops"
    folder.mkdir()
    handlers = folder / "handlers.py"
    handlers.write_text(HANDLERS)
    load([str(handlers)], [])
    values_file = dev_command.node_rbac(dev_cluster(tmp_path), [str(handlers)], registry)
    assert values_file.parent == tmp_path / "cp"  # never written beside the user's handlers
    assert not (folder / "rbac-values.yaml").exists()
    expected = tmp_path / "expected.yaml"
    result = CliRunner().invoke(cli.cli, ["rbac", str(handlers), "--offline", "--values", str(expected)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert values_file.read_text() == expected.read_text()
    generated = yaml.safe_load(values_file.read_text())["rbac"]["generated"]
    assert {(r["apiGroups"][0], r["resources"][0]) for r in generated} == {
        ("", "pods"), ("", "pods/finalizers"), ("apps", "deployments"), ("events.k8s.io", "events"),
    }
    assert not any("*" in r["apiGroups"] + r["resources"] + r["verbs"] for r in generated)


def test_an_rbac_values_file_beside_the_handlers_wins(registry: Registry, tmp_path: Path) -> None:
    handlers = tmp_path / "handlers.py"
    handlers.write_text(HANDLERS)
    (tmp_path / "rbac-values.yaml").write_text("rbac: {generated: []}\n")
    assert dev_command.node_rbac(dev_cluster(tmp_path), [str(handlers)], registry) == tmp_path / "rbac-values.yaml"
