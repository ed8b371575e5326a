"""declop.testing.cluster.incluster's choice of images for `declop dev --node`: the project's own image
when a Dockerfile sits beside the handlers (not declop's checkout), else declop's (no build here);
and its RBAC: the project's rbac-values.yaml when there is one."""

from __future__ import annotations

from pathlib import Path

from declop.testing.cluster.buildkit import BuiltImage
from declop.testing.cluster.incluster import DevImages, _image_name, project_folder, project_rbac

ROOT = Path(__file__).resolve().parents[4]


def test_a_dockerfile_beside_the_handlers_makes_the_project_image(tmp_path: Path) -> None:
    project = tmp_path / "widget-operator"
    project.mkdir()
    (project / "handlers.py").write_text("")
    assert project_folder([str(project / "handlers.py")]) is None
    (project / "Dockerfile").write_text("FROM declop:0.1.0\n")
    assert project_folder([str(project / "handlers.py")]) == project
    assert project_folder([str(project)]) == project  # a folder of handlers


def test_only_the_first_path_decides(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "Dockerfile").write_text("FROM declop:0.1.0\n")
    assert project_folder([str(tmp_path / "a" / "h.py"), str(tmp_path / "b" / "h.py")]) is None
    assert project_folder([]) is None


def test_declops_own_dockerfile_is_not_a_project_image() -> None:
    assert (ROOT / "Dockerfile").is_file()
    assert project_folder([str(ROOT / "handlers.py")]) is None


def test_the_image_is_named_after_its_folder() -> None:
    assert _image_name(Path("/home/me/Widget_Operator v2")) == "widget-operator-v2"
    assert _image_name(Path("/___")) == "operator"


def test_the_pod_runs_the_project_image_when_there_is_one() -> None:
    declop = BuiltImage("declop:0.1.0", Path("/c/declop.tar"), Path("/c/declop.oci"), "sha256:a")
    own = BuiltImage("widget-operator:dev", Path("/c/widget.tar"), Path("/c/widget.oci"), "sha256:b")
    assert (DevImages(declop, None).runs, DevImages(declop, None).tars) == ("declop:0.1.0", (Path("/c/declop.tar"),))
    both = DevImages(declop, own)
    assert both.runs == "widget-operator:dev"
    assert both.tars == (Path("/c/declop.tar"), Path("/c/widget.tar"))


def test_a_projects_rbac_values_beside_the_handlers_are_its_rbac(tmp_path: Path) -> None:
    """What `declop dev --node` installs the chart with (else it generates one: test_cli_dev_node.py)."""
    project = tmp_path / "widget-operator"
    project.mkdir()
    (project / "handlers.py").write_text("")
    assert project_rbac([str(project / "handlers.py")]) is None
    (project / "rbac-values.yaml").write_text("rbac:\n  generated: []\n")
    assert project_rbac([str(project / "handlers.py")]) == project / "rbac-values.yaml"
    assert project_rbac([str(project)]) == project / "rbac-values.yaml"  # a folder of handlers
    assert project_rbac([str(tmp_path / "elsewhere.py"), str(project / "handlers.py")]) is None  # the first path decides
    assert project_rbac([]) is None
