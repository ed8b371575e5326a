"""``declop crd``: the CRDs of the models that handler files define or import, printed as YAML,
the same bytes run after run (each run in its own interpreter, with its own hash seed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "crd" / "handlers.py"

MODELS = '''
from pydantic import BaseModel

from declop.typed.model import CustomResource


class GadgetSpec(BaseModel):
    size: int = 1


class GadgetV1(CustomResource, group="example.com", version="v1", kind="Gadget"):
    spec: GadgetSpec


class GadgetV2(CustomResource, group="example.com", version="v2", kind="Gadget", storage=False):
    spec: GadgetSpec
'''

HANDLERS = '''
import declop
from models import GadgetV1, GadgetV2  # imported, not defined here: found all the same


@declop.converter("gadgets.example.com")
def convert(obj, desired_api_version, **_):
    obj["apiVersion"] = desired_api_version
'''


def declop_crd(*args: str, seed: str = "0", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "declop", "crd", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_the_examples_crd_is_the_same_bytes_every_run() -> None:
    first = declop_crd(str(EXAMPLE), seed="1")
    second = declop_crd(str(EXAMPLE), seed="2")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stderr == ""
    (crd,) = yaml.safe_load_all(first.stdout)
    assert crd["metadata"]["name"] == "widgets.example.com"
    assert crd["spec"]["names"]["shortNames"] == ["wg"]


def test_imported_models_a_converter_and_output_to_a_file(tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "handlers.py").write_text(HANDLERS)
    out = tmp_path / "crds.yaml"
    result = declop_crd("handlers.py", "-o", str(out), "--webhook-service", "ops/gadget-operator:8443", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == f"Wrote 1 CRD to {out}: gadgets.example.com\n"
    (crd,) = yaml.safe_load_all(out.read_text())
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v2", "v1"]
    assert crd["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "ops", "name": "gadget-operator", "port": 8443, "path": "/convert/convert.gadgets.example.com"}},
        },
    }
    local = declop_crd("handlers.py", "--webhook-port", "9555", cwd=tmp_path)
    (crd,) = yaml.safe_load_all(local.stdout)
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"] == {"url": "https://127.0.0.1:9555/convert/convert.gadgets.example.com"}


def test_no_models_is_one_line_and_exit_1() -> None:
    result = declop_crd(str(ROOT / "examples" / "pods.py"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"declop: error: no typed model in {ROOT / 'examples' / 'pods.py'}: subclass declop.typed.model.CustomResource "
        "with group=, version= and kind= (docs/typed.md)\n"
    )


def test_a_model_the_crd_cannot_be_made_of_is_one_line_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "from pydantic import BaseModel\nfrom declop.typed.model import CustomResource\n\n"
        "class Spec(BaseModel):\n    port: int | str = 80\n\n"
        "class Bad(CustomResource, group='example.com', version='v1', kind='Bad'):\n    spec: Spec\n"
    )
    result = declop_crd("bad.py", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("declop: error: Bad: spec.port: a union of int, str cannot be a CRD field")
    assert result.stderr.count("\n") == 1


def test_nothing_to_read_is_one_line() -> None:
    result = declop_crd()
    assert result.returncode == 1
    assert result.stderr == "declop: error: nothing to read: pass handler files (declop crd handlers.py) or -m module\n"
