"""declop.assets and `declop assets path|build`: the lookup order, the cache key build.sh shares,
and the build driven through the packaged build.sh (a stand-in ``go`` writes the binaries, so
no Go toolchain and no network are needed here; tests/integration/test_dev.py runs the real one)."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from declop import assets
from declop.errors import ConfigError, DeclopError

CLEAN = ("KUBEBUILDER_ASSETS", "DECLOP_ASSETS_DIR", "XDG_CACHE_HOME")


def fake_binaries(folder: Path, names=assets.ALL_BINARIES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG cache, and no assets variables."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "declop" / "controlplane"


def test_all_is_sorted_and_exists() -> None:
    assert assets.__all__ == sorted(assets.__all__)
    assert [n for n in assets.__all__ if not hasattr(assets, n)] == []


def test_the_go_module_ships_inside_the_package() -> None:
    folder = assets.module_dir()
    assert folder.parent == Path(assets.__file__).resolve().parent
    assert {p.name for p in folder.iterdir()} >= {"build.sh", "go.mod", "go.sum"}
    assert assets.build_script() == folder / "build.sh"


def test_the_version_is_go_mods_kubernetes_requirement() -> None:
    gomod = (assets.module_dir() / "go.mod").read_text()
    version = assets.kubernetes_version()
    assert re.match(r"^v1\.\d+\.\d+$", version)
    assert f"\tk8s.io/kubernetes {version} " in gomod


def test_the_cache_key_is_sha256_of_go_mod_then_go_sum() -> None:
    folder = assets.module_dir()
    expected = hashlib.sha256((folder / "go.mod").read_bytes() + (folder / "go.sum").read_bytes()).hexdigest()[:12]
    assert assets.cache_key() == expected
    shell = subprocess.run(
        f"cat {folder}/go.mod {folder}/go.sum | sha256sum | cut -c1-12", shell=True, capture_output=True, text=True, check=True
    )
    assert shell.stdout.strip() == expected


def test_build_sh_and_python_agree_on_the_folder(cache: Path) -> None:
    """build.sh finds binaries exactly where declop.assets puts them (same version, same key)."""
    folder = fake_binaries(assets.cache_folder())
    assert folder.parent == cache
    out = subprocess.run(["bash", str(assets.build_script())], capture_output=True, text=True, env=dict(os.environ), timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(folder)
    assert out.stderr.strip() == f"[controlplane] up to date: {folder}"


# -- find / `declop assets path` -------------------------------------------------------------


def test_find_prefers_kubebuilder_assets_then_declop_assets_dir(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = fake_binaries(tmp_path / "kb", assets.REQUIRED_BINARIES)
    dd = fake_binaries(tmp_path / "dd", assets.REQUIRED_BINARIES)
    fake_binaries(assets.cache_folder())
    monkeypatch.setenv("DECLOP_ASSETS_DIR", str(dd))
    assert assets.find() == str(dd)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(kb))
    assert assets.find() == str(kb)


def test_a_named_folder_lacking_a_binary_is_one_line_naming_the_command(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_binaries(tmp_path / "half", ["etcd"])
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "half"))
    with pytest.raises(ConfigError) as info:
        assets.find()
    message = str(info.value)
    assert "$KUBEBUILDER_ASSETS" in message and "lacks kube-apiserver, kubectl" in message
    assert "run `declop assets build`" in message and "\n" not in message


def test_find_prefers_this_versions_folder_over_a_newer_other(cache: Path) -> None:
    pinned = fake_binaries(assets.cache_folder())
    other = fake_binaries(cache / "v1.99.0-000000000000")
    os.utime(pinned / "kube-apiserver", (1, 1))  # the other one is newer
    assert assets.find() == str(pinned)
    shutil.rmtree(pinned)
    assert assets.find() == str(other)


def test_find_takes_the_newest_complete_other_folder(cache: Path) -> None:
    old = fake_binaries(cache / "v1.1.0-aaaaaaaaaaaa")
    new = fake_binaries(cache / "v1.2.0-bbbbbbbbbbbb")
    fake_binaries(cache / "v1.3.0-cccccccccccc", ["etcd"])  # incomplete: never chosen
    os.utime(old / "kube-apiserver", (1, 1))
    assert assets.find() == str(new)


def test_nothing_built_says_run_declop_assets_build(cache: Path) -> None:
    with pytest.raises(ConfigError) as info:
        assets.find()
    message = str(info.value)
    assert "run `declop assets build` (needs Go >= 1.26)" in message
    assert str(cache) in message and "\n" not in message


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "declop", *args], capture_output=True, text=True, env=env, timeout=60)


def test_declop_assets_path_prints_the_folder(cache: Path) -> None:
    folder = fake_binaries(assets.cache_folder())
    out = run_cli("assets", "path", env=dict(os.environ))
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{folder}\n", "")


def test_declop_assets_path_without_binaries_is_one_error_line(cache: Path) -> None:
    out = run_cli("assets", "path", env=dict(os.environ))
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1
    assert out.stderr.startswith("declop: error: no Kubernetes control-plane binaries found")
    assert "run `declop assets build`" in out.stderr


# -- build / `declop assets build` -----------------------------------------------------------


def test_build_returns_a_complete_folder_at_once_without_go(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_binaries(assets.cache_folder())
    monkeypatch.setenv("PATH", "/nonexistent")
    err = io.StringIO()
    assert assets.build(stderr=err) == str(folder)
    assert err.getvalue() == f"[controlplane] up to date: {folder}\n"


def test_build_without_go_is_one_line_saying_what_to_install(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError) as info:
        assets.build(stderr=io.StringIO())
    message = str(info.value)
    assert "'go' is not on PATH" in message and "Go >= 1.26" in message
    assert "run `declop assets build` again" in message and "\n" not in message


FAKE_GO = r"""#!/usr/bin/env bash
# A stand-in for `go build -o OUT PKG` and `GOBIN=DIR go install PKG@V`: writes an executable.
set -euo pipefail
echo "$*" >>"$FAKE_GO_LOG"
if [[ -n ${FAKE_GO_FAIL:-} && "$*" == "$FAKE_GO_FAIL"* ]]; then echo "fake go: $1 failed" >&2; exit 1; fi
out=""
prev=""
for a in "$@"; do [[ $prev == -o ]] && out="$a"; prev="$a"; done
if [[ $1 == install ]]; then pkg="${@: -1}"; pkg="${pkg%%@*}"; out="$GOBIN/${pkg##*/}"; fi
printf '#!/bin/sh\necho built\n' >"$out"
chmod +x "$out"
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "gobin"
    bin_dir.mkdir()
    (bin_dir / "go").write_text(FAKE_GO)
    (bin_dir / "go").chmod(0o755)
    log = tmp_path / "go.log"
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_build_runs_the_packaged_script_for_what_is_missing(cache: Path, fake_go: Path) -> None:
    folder = fake_binaries(assets.cache_folder(), ["etcd", "kubectl"])
    err = io.StringIO()
    assert assets.build(stderr=err) == str(folder)
    assert assets.missing(folder, assets.ALL_BINARIES) == []
    calls = fake_go.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["build", "build", "install"]  # apiserver, kcm, helm
    assert any(c.endswith("k8s.io/kubernetes/cmd/kube-apiserver") for c in calls)
    progress = err.getvalue().splitlines()
    assert progress[0] == f"[controlplane] building kube-apiserver kube-controller-manager helm for Kubernetes {assets.kubernetes_version()} into {folder}"
    assert re.fullmatch(rf"\[controlplane\] done in \d+ s: {re.escape(str(folder))}", progress[-1])
    steps = [line.split("] ", 2)[1] for line in progress if line.startswith("[controlplane] [")]
    assert steps == ["[1/3", "[2/3", "[3/3"]  # every binary says where the build stands


def test_build_honours_declop_assets_dir(cache: Path, fake_go: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "mine"
    monkeypatch.setenv("DECLOP_ASSETS_DIR", str(target))
    assert assets.build(stderr=io.StringIO()) == str(target)
    assert assets.missing(target, assets.ALL_BINARIES) == []
    assert not cache.exists()


def test_a_failed_build_names_the_folder_and_leaves_no_half_binary(cache: Path, fake_go: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_GO_FAIL", "build")
    err = io.StringIO()
    with pytest.raises(DeclopError) as info:
        assets.build(stderr=err)
    assert not isinstance(info.value, ConfigError)
    assert f"building the control plane into {assets.cache_folder()} failed (build.sh exited 1)" in str(info.value)
    assert "fake go: build failed" in err.getvalue()
    assert assets.missing(assets.cache_folder(), assets.ALL_BINARIES) == list(assets.ALL_BINARIES)


def test_declop_assets_build_prints_the_folder_last_and_progress_on_stderr(cache: Path, fake_go: Path) -> None:
    out = run_cli("assets", "build", env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    folder = str(assets.cache_folder())
    assert out.stdout.splitlines()[-1] == folder
    assert re.fullmatch(rf"\[controlplane\] done in \d+ s: {re.escape(folder)}", out.stderr.splitlines()[-1])
    again = run_cli("assets", "build", env=dict(os.environ))
    assert (again.stdout, again.stderr) == (f"{folder}\n", f"[controlplane] up to date: {folder}\n")


def test_a_second_build_waits_for_the_first_and_then_finds_its_binaries(cache: Path, fake_go: Path) -> None:
    """Two builds into one folder (two terminals, two test sessions) would write the same .tmp
    files: the second waits on the folder's lock, then finds what the first built and runs no go."""
    import fcntl

    folder = assets.cache_folder()
    folder.mkdir(parents=True)
    with open(folder / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first build, in progress
        second = subprocess.Popen(["bash", str(assets.build_script())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        assert second.stderr is not None
        assert second.stderr.readline().strip() == f"[controlplane] another build into {folder} is running; waiting for it"
        assert second.poll() is None
        fake_binaries(folder)  # what the first build leaves
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert out.strip() == str(folder)
    assert err.strip() == f"[controlplane] up to date: {folder}"
    assert not fake_go.exists(), "the second build ran go"
