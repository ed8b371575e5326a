"""declop.assets.files: the chart, the image's build inputs and the node's build, found inside the
package (links in a checkout, files in a wheel), and declop's image source staged from an install."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest

from declop.assets import files
from declop.errors import ConfigError, DeclopError

ROOT = Path(__file__).resolve().parents[3]


def test_in_a_checkout_the_links_lead_to_the_files_where_they_are_edited() -> None:
    assert files.checkout() == ROOT
    assert files.chart_dir() == ROOT / "charts" / "declop"
    assert files.node_build_script() == ROOT / "tools" / "node" / "build.sh"
    for name in files.IMAGE_FILES:
        assert (files.package_dir() / "assets" / "image" / name).resolve() == ROOT / name


def test_every_file_dev_node_needs_is_there() -> None:
    needed = files.required_files()
    assert {"chart/Chart.yaml", "image/Dockerfile", "image/requirements/image.lock", "node/build.sh", "node/pause.c"} <= set(needed)
    assert [name for name, path in needed.items() if not path.is_file()] == []


def test_from_a_checkout_the_image_is_built_from_the_checkout_itself() -> None:
    with files.image_source() as source:
        assert source == ROOT


def test_from_an_install_the_image_source_is_the_package_beside_the_shipped_build_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "checkout", lambda: None)  # as in site-packages: no setup.cfg above
    with files.image_source() as source:
        assert source != ROOT and not source.is_relative_to(ROOT)
        for name in files.IMAGE_FILES:
            assert (source / name).read_bytes() == (ROOT / name).read_bytes(), name
        assert (source / "declop" / "cli" / "entry.py").read_bytes() == (ROOT / "declop" / "cli" / "entry.py").read_bytes()
        assert (source / "declop" / "assets" / "controlplane" / "go.mod").is_file()
        # the links became files: the image's own wheel carries what an installed wheel does
        assert (source / "declop" / "assets" / "chart" / "Chart.yaml").is_file()
        assert not (source / "declop" / "assets" / "chart").is_symlink()
        assert not list(source.rglob("__pycache__"))
    assert not source.exists()


def test_a_broken_install_says_to_reinstall_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "chart" / "templates").mkdir(parents=True)
    (tmp_path / "chart" / "Chart.yaml").write_text("name: declop\n")
    monkeypatch.setattr(files, "_assets", lambda: tmp_path)
    with pytest.raises(ConfigError) as info:
        files.chart_dir()
    message = str(info.value)
    assert "lacks values.yaml, values.schema.json, templates/deployment.yaml); reinstall declop" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"node build is incomplete .* lacks build.sh, go.mod"):
        files.node_build_script()


def _script(folder: Path, body: str) -> Path:
    script = folder / "build.sh"
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_build_node_relays_the_progress_and_returns_the_folder_printed_last(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = _script(tmp_path, "echo '[node] building pause' >&2\necho /cache/node/v1\n")
    monkeypatch.setattr(files, "node_build_script", lambda: script)
    err = io.StringIO()
    assert files.build_node(stderr=err) == "/cache/node/v1"
    assert err.getvalue() == "[node] building pause\n"


def test_a_failed_node_build_is_one_line_pointing_at_its_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = _script(tmp_path, "echo '[node] error: go is not on PATH' >&2\nexit 2\n")
    monkeypatch.setattr(files, "node_build_script", lambda: script)
    err = io.StringIO()
    with pytest.raises(DeclopError, match=r"exited 2\); its lines above say why$"):
        files.build_node(stderr=err)
    assert "go is not on PATH" in err.getvalue()


def test_declop_assets_path_chart_prints_the_chart_folder() -> None:
    from click.testing import CliRunner

    from declop import cli

    result = CliRunner().invoke(cli.cli, ["assets", "path", "--chart"])
    assert (result.exit_code, result.output) == (0, f"{ROOT / 'charts' / 'declop'}\n")
