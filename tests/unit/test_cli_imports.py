"""What ``declop run`` loads: the commands that need pydantic or YAML import them when they run.

A run's baseline memory is what every replica pays (issue 24); the dev loop and the CRD generator
bring pydantic and PyYAML (~8 MiB), which a run of handlers without typed models never uses; the
probe, metrics and webhook servers (aiohttp.web, ~35 ms of every start) load only when served.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

RUN_PATH = "import sys, declop.cli, declop.manager, declop.registry, declop.loader"


@pytest.mark.parametrize(
    # aiohttp.web and the servers: only a run with --health-port, --metrics-port or webhooks;
    # prometheus-client (~28 ms): only a run that serves /metrics
    "module", ["pydantic", "yaml", "declop.dev.loop", "declop.typed.model", "aiohttp.web", "declop.serving.probes", "declop.webhooks.server",
     "prometheus_client", "declop.serving.metrics"]
)
def test_the_run_path_does_not_import(module: str) -> None:
    code = f"{RUN_PATH}; assert {module!r} not in sys.modules, sorted(m for m in sys.modules if m.startswith({module!r}))"
    subprocess.run([sys.executable, "-c", code], check=True)


#: the typed modules the run path may load: ``declop.typed.dump`` (the JSON form the client,
#: Events and declop.conditions take a typed model as) imports nothing but the standard library
#: and never pydantic (its own invariant, tests/unit/typed/test_dump.py); its package is empty
TYPED_ON_THE_RUN_PATH = ["declop.typed", "declop.typed.dump"]


def test_the_run_path_imports_no_other_typed_module() -> None:
    code = f"{RUN_PATH}; loaded = sorted(m for m in sys.modules if m.startswith('declop.typed')); assert loaded == {TYPED_ON_THE_RUN_PATH!r}, loaded"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_crd_command_still_finds_its_generator() -> None:
    """The lazy import is inside the command: ``declop crd`` of a file without models still answers."""
    out = subprocess.run([sys.executable, "-m", "declop", "crd", "-m", "declop.predicates"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "no typed model in -m declop.predicates" in out.stderr
