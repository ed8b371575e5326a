"""declop.testing.cluster.image, its pure parts: buildctl's command line, the wheelhouse's requirements,
lock files and platforms, the base's cache key and cache hit, OCI layout reading, finding BuildKit.
The real builds are in tests/integration/test_image_build.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from declop.errors import ConfigError
from declop.testing.cluster import buildkit as buildkit_module
from declop.testing.cluster import image as image_module
from declop.testing import wait_for
from declop.testing.cluster.image import (
    BuildKit,
    BuiltImage,
    ImageBuildError,
    base_image,
    base_key,
    LOCK_COMMAND,
    buildctl_command,
    check_locks,
    find_buildkit,
    lock_problems,
    read_lock,
    manifest_digest,
    manylinux_platforms,
    requirements,
    wheelhouse,
)
from declop.testing.cluster.image_cli import main

ROOT = Path(__file__).resolve().parents[4]


def layout(folder: Path, digests: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": d, "size": 1}
            for d in digests
        ],
    }
    (folder / "index.json").write_text(json.dumps(index))
    return folder


def test_buildctl_command_names_contexts_args_and_output(tmp_path: Path) -> None:
    base = BuiltImage("declop/python-base:abc", tmp_path / "b.tar", tmp_path / "b.oci", "sha256:1")
    command = buildctl_command(
        "/bin/buildctl",
        "unix:///run/x.sock",
        context=Path("/src"),
        dockerfile=Path("/src/Dockerfile"),
        name="declop:0.1.0",
        output=Path("/out/x.tar"),
        build_args={"VERSION": "0.1.0", "PYTHON_IMAGE": base.name},
        contexts={base.name: base, "wheels": Path("/w")},
        target="builder",
    )
    assert command[:4] == ["/bin/buildctl", "--addr", "unix:///run/x.sock", "build"]
    pairs = list(zip(command[4::2], command[5::2]))
    assert ("--frontend", "dockerfile.v0") in pairs
    assert ("--local", "context=/src") in pairs and ("--local", "dockerfile=/src") in pairs
    assert ("--opt", "filename=Dockerfile") in pairs
    assert ("--opt", "cmdline=") in pairs, "the `# syntax=` line must not send it to a registry"
    assert ("--output", "type=oci,name=declop:0.1.0,dest=/out/x.tar") in pairs
    assert ("--opt", "target=builder") in pairs
    args = [v for k, v in pairs if k == "--opt" and v.startswith("build-arg:")]
    assert args == ["build-arg:PYTHON_IMAGE=declop/python-base:abc", "build-arg:VERSION=0.1.0"]
    # an image: its OCI layout as a store, selected by digest; a folder: a local context
    assert ("--oci-layout", f"store0={tmp_path / 'b.oci'}") in pairs
    assert ("--opt", "context:declop/python-base:abc=oci-layout://store0@sha256:1") in pairs
    assert ("--local", "named1=/w") in pairs
    assert ("--opt", "context:wheels=local:named1") in pairs


def test_manylinux_platforms_cover_every_older_glibc() -> None:
    tags = manylinux_platforms((2, 36))
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags
    old = manylinux_platforms((2, 12))
    assert "manylinux2014_x86_64" not in old and "manylinux2010_x86_64" in old


def test_requirements_are_build_system_install_requires_and_the_extra(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68", "wheel"]\n'
    )
    (tmp_path / "setup.cfg").write_text(
        "[options]\ninstall_requires =\n    a>=1\n    b<2\n"
        "[options.extras_require]\nfast = c>=3\ntest = d\n"
    )
    assert requirements(tmp_path) == ["setuptools>=68", "wheel", "a>=1", "b<2", "c>=3"]
    assert requirements(tmp_path, extras=()) == ["setuptools>=68", "wheel", "a>=1", "b<2"]


def test_requirements_of_this_checkout_include_the_fast_extra() -> None:
    wanted = requirements(ROOT)
    assert any(r.startswith("orjson") for r in wanted)
    assert any(r.startswith("kubernetes") for r in wanted)
    assert any(r.startswith("setuptools") for r in wanted)
    assert not any(r.startswith("pytest") for r in wanted)


def test_base_key_depends_on_what_the_base_holds() -> None:
    key = base_key("bookworm", "http://m/debian", ["python3", "ca-certificates"])
    assert key == base_key("bookworm", "http://m/debian", ["ca-certificates", "python3"])
    assert key != base_key("trixie", "http://m/debian", ["python3", "ca-certificates"])
    assert key != base_key("bookworm", "http://other/debian", ["python3", "ca-certificates"])
    assert key != base_key("bookworm", "http://m/debian", ["python3"])
    assert len(key) == 12


def test_base_image_found_in_the_cache_needs_no_build(tmp_path: Path) -> None:
    key = base_key("bookworm", "http://m/debian", ["python3"])
    layout(tmp_path / key / "image.oci", ["sha256:abc"])
    (tmp_path / key / "image.tar").write_bytes(b"")
    found = base_image(mirror="http://m/debian", packages=["python3"], cache_dir=tmp_path)
    assert found == BuiltImage(
        f"declop/python-base:{key}", tmp_path / key / "image.tar", tmp_path / key / "image.oci",
        "sha256:abc",
    )  # fmt: skip


def test_a_second_buildkit_on_one_folder_in_one_process_fails_at_once(tmp_path: Path) -> None:
    """The flock on ``<state>.lock`` is per open file: a second BuildKit of the same process on
    the same folder used to wait for it until its lock timeout (a 300 s hang in CI). It is refused
    at once, naming the way out, and the folder is free again once the first one stops."""
    state = tmp_path / "buildkit"
    first = BuildKit(state_dir=state)
    first._take_lock()
    try:
        assert BuildKit.running(state) is first
        second = BuildKit(state_dir=state, lock_timeout=900)
        with pytest.raises(ImageBuildError, match="already runs a BuildKit on .*pass that one as builder="):
            second._take_lock()
    finally:
        first.stop()
    assert BuildKit.running(state) is None
    second._take_lock()
    try:
        assert BuildKit.running(state) is second
    finally:
        second.stop()


def test_an_image_to_build_uses_the_buildkit_this_process_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no builder= given, the helpers build on this process's running BuildKit (here a
    recording stand-in at the unit boundary) instead of starting a second one on its folder."""
    built: list[str] = []

    class Recording:
        def build(self, context: Path, name: str, *, output: Path, **_: object) -> None:
            built.append(name)
            layout(output.parent / "image.oci", ["sha256:abc"])
            output.write_bytes(b"")

    monkeypatch.setattr(image_module, "_require_root", lambda what: None)
    monkeypatch.setattr(BuildKit, "running", classmethod(lambda cls, state_dir=None: Recording()))
    found = image_module._cached_image(tmp_path, "k1", "declop/x:1", lambda work, context: None, None)
    assert built == ["declop/x:1"] and found.tar == tmp_path / "k1" / "image.tar"


def test_manifest_digest_wants_exactly_one_image(tmp_path: Path) -> None:
    assert manifest_digest(layout(tmp_path / "one", ["sha256:aa"])) == "sha256:aa"
    with pytest.raises(ImageBuildError, match="lists 2 images, expected 1"):
        manifest_digest(layout(tmp_path / "two", ["sha256:aa", "sha256:bb"]))


def executable(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_find_buildkit_names_the_missing_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable(tmp_path / "buildkitd")
    monkeypatch.setenv("DECLOP_NODE_ASSETS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=r"has no buildctl; run `declop assets build --node`"):
        find_buildkit()
    executable(tmp_path / "buildctl")
    assert find_buildkit() == tmp_path


def test_find_buildkit_takes_the_newest_complete_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DECLOP_NODE_ASSETS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="no buildkitd/buildctl found"):
        find_buildkit()
    node = tmp_path / "declop" / "node"
    for name in ("old", "new"):
        executable(node / name / "buildkitd")
        executable(node / name / "buildctl")
    executable(node / "newest-but-incomplete" / "buildkitd")
    os.utime(node / "old" / "buildkitd", (1, 1))
    assert find_buildkit() == node / "new"


def test_descendants_lists_grandchildren() -> None:
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        found = wait_for(
            lambda: pids if len(pids := buildkit_module._descendants(parent.pid)) == 2 else None,
            what="the shell's two children",
        )
        assert all(Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep") for pid in found)
    finally:
        for pid in buildkit_module._descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


def test_cli_names_a_folder_that_is_no_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--source", str(tmp_path), "--output", str(tmp_path / "x.tar")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path} is not a declop source checkout (no Dockerfile or setup.cfg)"
    ]


def test_cli_is_runnable_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "declop.testing.cluster.image_cli", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0 and "--output" in result.stdout


# -- the lock files: what the image installs with --require-hashes ------------------------------

HASH_A = "sha256:" + "a" * 64
HASH_B = "sha256:" + "b" * 64


def checkout(folder: Path, runtime: str, build: str | None = None) -> Path:
    """A checkout with install_requires a>=1, b<2, extra fast = c>=3, build-system w>=68."""
    (folder / "pyproject.toml").write_text('[build-system]\nrequires = ["w>=68"]\n')
    (folder / "setup.cfg").write_text(
        "[options]\ninstall_requires =\n    a>=1\n    B_b<2\n"
        "[options.extras_require]\nfast = c>=3\ntest = d\n"
    )
    (folder / "requirements").mkdir()
    (folder / "requirements" / "image.lock").write_text(runtime)
    (folder / "requirements" / "build.lock").write_text(
        build if build is not None else f"#    {LOCK_COMMAND}\nw==70 \\\n    --hash={HASH_A}\n"
    )
    return folder


HEADER = f"# This file was autogenerated by uv via the following command:\n#    {LOCK_COMMAND}\n"
GOOD = (
    HEADER
    + f"a==1.5 \\\n    --hash={HASH_A} \\\n    --hash={HASH_B}\n    # via declop (setup.cfg)\n"
    + f"b-b==1.9 \\\n    --hash={HASH_A}\n"
    + f"c==3.0 --hash={HASH_B}\n"
    + f"dep-of-a==0.1 \\\n    --hash={HASH_B}\n    # via a\n"
)


def test_a_lock_is_read_with_its_continuations_hashes_and_canonical_names(tmp_path: Path) -> None:
    lock = read_lock(checkout(tmp_path, GOOD) / "requirements" / "image.lock")
    assert lock.header == (
        "# This file was autogenerated by uv via the following command:", f"#    {LOCK_COMMAND}"
    )
    assert set(lock.pins) == {"a", "b-b", "c", "dep-of-a"}
    assert lock.pins["a"].version == "1.5" and lock.pins["a"].hashes == (HASH_A, HASH_B)
    assert lock.pins["c"].hashes == (HASH_B,)


def test_a_lock_entry_that_is_not_pinned_is_refused_naming_its_line(tmp_path: Path) -> None:
    (tmp_path / "x.lock").write_text(f"{HEADER}a==1 \\\n    --hash={HASH_A}\nb>=2 \\\n  --hash={HASH_A}\n")
    with pytest.raises(ConfigError, match=r"x.lock: line 5 \('b>=2'\) is not pinned as name==version; run make lock"):
        read_lock(tmp_path / "x.lock")


def test_without_the_packaging_module_the_lock_check_says_which_extra_brings_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "packaging.requirements", None)  # a plain `pip install declop`
    with pytest.raises(ConfigError) as info:
        lock_problems(checkout(tmp_path, GOOD))
    assert str(info.value).endswith("the packaging module, which is not installed: pip install 'declop[dev]'")
    assert "\n" not in str(info.value)


def test_a_lock_covering_every_requirement_with_hashes_has_no_problems(tmp_path: Path) -> None:
    assert lock_problems(checkout(tmp_path, GOOD)) == []
    check_locks(tmp_path)  # no error


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda t: t.replace("c==3.0", "c==2.9"), "requirements/image.lock pins c==2.9, outside 'c>=3'"),
        (lambda t: t.replace("b-b==1.9", "b-b==2.0"), "requirements/image.lock pins b-b==2.0, outside 'B_b<2'"),
        (lambda t: t.replace(f"c==3.0 --hash={HASH_B}\n", ""), "c (c>=3) is not in requirements/image.lock"),
        (lambda t: t.replace(f"dep-of-a==0.1 \\\n    --hash={HASH_B}", "dep-of-a==0.1"),
         "requirements/image.lock: dep-of-a==0.1 has no --hash=sha256:"),
        (lambda t: t.replace(HEADER, "# generated\n"),
         "requirements/image.lock's header does not say 'make lock' regenerates it"),
    ],
)
def test_a_stale_lock_is_named_with_what_is_wrong(
    tmp_path: Path, edit: Callable[[str], str], problem: str
) -> None:
    checkout(tmp_path, edit(GOOD))
    assert lock_problems(tmp_path) == [problem]
    with pytest.raises(ConfigError) as caught:
        check_locks(tmp_path)
    assert str(caught.value) == f"stale lock: {problem}; run make lock and commit it"


def test_the_build_backend_is_checked_in_the_build_lock(tmp_path: Path) -> None:
    checkout(tmp_path, GOOD, build=f"#    {LOCK_COMMAND}\nw==60 --hash={HASH_A}\n")
    assert lock_problems(tmp_path) == ["requirements/build.lock pins w==60, outside 'w>=68'"]
    (tmp_path / "requirements" / "build.lock").unlink()
    assert lock_problems(tmp_path) == ["requirements/build.lock is missing"]


def test_the_wheelhouse_refuses_a_stale_lock_before_downloading(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    checkout(tmp_path / "src", GOOD.replace("c==3.0", "c==2.9"))
    with pytest.raises(ConfigError, match=r"^stale lock: .* pins c==2.9, outside 'c>=3'; run make lock"):
        wheelhouse(tmp_path / "src", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_this_checkouts_locks_cover_setup_cfg_and_pyproject_with_hashes() -> None:
    """CI's freshness check: no resolver, no network — setup.cfg's install_requires and `fast`
    extra, and pyproject's build backend, each pinned inside its range with sha256 hashes."""
    assert lock_problems(ROOT) == []
    runtime = read_lock(ROOT / "requirements" / "image.lock")
    assert {"kubernetes", "cryptography", "orjson", "aiohttp"} <= set(runtime.pins)
    assert not {"pytest", "setuptools", "declop"} & set(runtime.pins)  # test/build tools stay out
    for pin in runtime.pins.values():
        assert all(h.startswith("sha256:") and len(h) == 71 for h in pin.hashes), pin
