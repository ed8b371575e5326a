"""declop.testing.cluster.image for real: BuildKit builds the repository's Dockerfile on a debootstrap
base, with no Docker daemon, no registry and no network in the build; an image FROM it; a failed
build; and nothing left behind (processes, mounts, the lock) after stop, even mid-build.
Also tools/node/build.sh's and the CLI's one-line errors without root.

Needs root and the node binaries (the fixture runs tools/node/build.sh: instant when built)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import declop
from declop.testing import (
    BuildKit,
    BuiltImage,
    ImageBuildError,
    base_image,
    build_image,
    declop_image,
    pause_image,
    wait_for,
)
from declop.testing.cluster import buildkit as buildkit_module
from declop.testing.cluster import image as image_module

pytestmark = pytest.mark.node

ROOT = Path(__file__).resolve().parents[2]
NODE_BUILD = ROOT / "tools" / "node" / "build.sh"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone


def leftovers(builder_pid: int, *folders: Path) -> list[str]:
    """Processes below ``builder_pid`` or still running as it; mounts under ``folders``."""
    found = [f"process {pid}" for pid in buildkit_module._descendants(builder_pid)]
    if buildkit_module._alive(builder_pid):
        found.append(f"process {builder_pid} ({cmdline(builder_pid)!r})")
    for folder in folders:
        found += [f"mount {m}" for m in buildkit_module._mounts_under(folder)]
    return found


@pytest.fixture(scope="module")
def builder(node_assets: Path) -> Iterator[BuildKit]:
    kit = BuildKit(assets_dir=node_assets)
    kit.start()
    assert kit.process is not None and kit.run_dir is not None
    pid, run_dir = kit.process.pid, kit.run_dir
    yield kit
    kit.stop()
    assert leftovers(pid, kit.state_dir, run_dir) == []
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def declop_built(builder: BuildKit, tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    return declop_image(output=tmp_path_factory.mktemp("img") / "declop.tar", builder=builder)


def read_layout(image: BuiltImage) -> tuple[dict, dict, list[Path]]:  # type: ignore[type-arg]
    """(index.json, image config, layer blobs) of an image's OCI layout."""
    index = json.loads((image.layout / "index.json").read_text())
    blob = lambda digest: image.layout / "blobs" / "sha256" / digest.split(":")[1]
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    return index, config, [blob(layer["digest"]) for layer in manifest["layers"]]


def test_declop_image_is_the_dockerfiles(declop_built: BuiltImage) -> None:
    image = declop_built
    assert image.name == f"declop:{declop.__version__}"
    index, config, layers = read_layout(image)
    annotations = index["manifests"][0]["annotations"]
    # what `ctr images import` names it
    assert annotations["io.containerd.image.name"] == f"docker.io/library/{image.name}"
    assert index["manifests"][0]["digest"] == image.digest
    with tarfile.open(image.tar) as archive:  # the tar is the same layout
        names = set(archive.getnames())
        assert {"index.json", "oci-layout"} <= names
        assert json.loads(archive.extractfile("index.json").read()) == index  # type: ignore[union-attr]
    settings = config["config"]
    assert settings["User"] == "65532:65532"
    assert settings["Entrypoint"] == ["tini", "--", "declop", "run"] and "Cmd" not in settings
    assert settings["WorkingDir"] == "/app"
    assert "PYTHONDONTWRITEBYTECODE=1" in settings["Env"] and "HOME=/tmp" in settings["Env"]
    assert settings["Labels"]["org.opencontainers.image.base.name"].startswith(
        "declop/python-base:"
    )
    contents = [set(members(layer)) for layer in layers]
    assert any("opt/declop/bin/declop" in names for names in contents)
    assert any("usr/bin/python3" in names for names in contents)  # the debootstrap base


def test_the_image_installs_exactly_the_lock_and_tini(declop_built: BuiltImage, tmp_path: Path) -> None:
    """What pip installed into /opt/declop is the lock's pins (plus declop, and the venv's own
    pip/setuptools): nothing resolved from a range at build time. /usr/bin/tini is Debian's
    static tini (the `tini` stage; the kit's base holds the package)."""
    root = unpack(declop_built, tmp_path / "root")
    lock = image_module.read_lock(ROOT / image_module.RUNTIME_LOCK)
    site = next((root / "opt/declop/lib").glob("python3*/site-packages"))
    installed: dict[str, str] = {}
    for dist in site.glob("*.dist-info"):
        name, _, version = dist.name.removesuffix(".dist-info").partition("-")
        installed[image_module._canonical(name)] = version
    assert installed.pop("declop") == declop.__version__
    for bundled in ("pip", "setuptools"):
        installed.pop(bundled, None)
    assert installed == {pin.name: pin.version for pin in lock.pins.values()}
    tini = root / "usr/bin/tini"
    assert tini.read_bytes() == (root / "usr/bin/tini-static").read_bytes()
    result = subprocess.run(
        ["chroot", "--userspec=65532:65532", str(root), "/usr/bin/tini", "--version"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.startswith("tini version 0.19"), result


def members(layer: Path) -> list[str]:
    with tarfile.open(layer) as archive:
        return archive.getnames()


def unpack(image: BuiltImage, target: Path) -> Path:
    target.mkdir(mode=0o755)
    for layer in read_layout(image)[2]:
        subprocess.run(["tar", "-xzf", str(layer), "-C", str(target)], check=True)
    return target


def test_declop_runs_in_the_image_as_its_user(declop_built: BuiltImage, tmp_path: Path) -> None:
    root = unpack(declop_built, tmp_path / "root")
    result = subprocess.run(
        ["chroot", "--userspec=65532:65532", str(root), "/usr/bin/env", "-i",
         "PATH=/opt/declop/bin:/usr/bin", "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1",
         "python", "-c", "import declop, orjson, kubernetes, aiohttp; print(declop.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == declop.__version__
    # root owns the virtualenv: the operator's user cannot change it
    assert (root / "opt/declop/bin/python").lstat().st_uid == 0


def test_image_from_declop_with_handlers_baked_in(
    builder: BuildKit, declop_built: BuiltImage, tmp_path: Path
) -> None:
    context = tmp_path / "context"
    (context / "handlers").mkdir(parents=True)
    (context / "handlers" / "pods.py").write_text((ROOT / "examples" / "pods.py").read_text())
    (context / "Dockerfile").write_text(
        f"FROM {declop_built.name}\nCOPY handlers/ /app/handlers/\nENV DECLOP_PATHS=/app/handlers\n"
    )
    operator = build_image(
        context, "widgets:1", output=tmp_path / "out" / "widgets.tar",
        contexts={declop_built.name: declop_built}, builder=builder,
    )  # fmt: skip
    assert operator.tar.is_file() and operator.layout == tmp_path / "out" / "widgets.oci"
    _, config, layers = read_layout(operator)
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["tini", "--", "declop", "run"]
    assert "DECLOP_PATHS=/app/handlers" in config["config"]["Env"]
    assert "app/handlers/pods.py" in members(layers[-1])
    # declop's layers, unchanged, below the one new layer
    assert [p.name for p in read_layout(declop_built)[2]] == [p.name for p in layers[:-1]]


def test_pause_image_holds_only_pause(builder: BuildKit, node_assets: Path) -> None:
    image = pause_image(node_assets, "declop.local/pause:1", builder=builder)  # as the Node asks
    assert pause_image(node_assets, "declop.local/pause:1") == image  # cached: no builder needed
    assert str(image) == os.fspath(image) == str(image.tar)  # stands for its archive
    index, config, layers = read_layout(image)
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == (
        "declop.local/pause:1"
    )
    assert config["config"]["Entrypoint"] == ["/pause"]
    assert config["config"]["User"] == "65535:65535"
    assert [members(layer) for layer in layers] == [["pause"]]
    with tarfile.open(layers[0]) as archive:
        binary = archive.extractfile("pause")
        assert binary is not None and binary.read() == (node_assets / "pause").read_bytes()
    assert pause_image(node_assets).name.startswith("declop/pause:")


def test_failed_build_quotes_the_builders_last_lines(builder: BuildKit, tmp_path: Path) -> None:
    base = base_image(builder=builder)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base.name}\nRUN echo 'widgets: the step broke here' >&2 && exit 3\n"
    )
    with pytest.raises(ImageBuildError) as caught:
        build_image(
            tmp_path, "broken:1", output=tmp_path / "broken.tar",
            contexts={base.name: base}, builder=builder,
        )  # fmt: skip
    message = str(caught.value)
    assert message.startswith(f"building broken:1 from {tmp_path / 'Dockerfile'} failed")
    assert "widgets: the step broke here" in message and "exit code: 3" in message
    assert not (tmp_path / "broken.tar").exists() and not (tmp_path / "broken.oci").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".broken")]


def test_second_builder_on_the_same_state_waits_then_says_so(
    builder: BuildKit, node_assets: Path
) -> None:
    """Another process's BuildKit on the same state folder waits for the lock, then says so; a
    second one in this process is refused at once (flock is per open file: it would wait for
    itself), naming the builder to use instead."""
    script = (
        "import sys\n"
        "from declop.testing.cluster.image import BuildKit, ImageBuildError\n"
        f"other = BuildKit(assets_dir={str(node_assets)!r}, state_dir={str(builder.state_dir)!r}, lock_timeout=0.3)\n"
        "try:\n"
        "    other.start()\n"
        "except ImageBuildError as exc:\n"
        "    print(exc); sys.exit(3 if other.process is None and other.run_dir is None else 4)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "another builder holds" in done.stdout and "buildkit.lock" in done.stdout
    same_process = BuildKit(assets_dir=node_assets, state_dir=builder.state_dir, lock_timeout=900)
    with pytest.raises(ImageBuildError, match=r"this process already runs a BuildKit on .*builder="):
        same_process.start()
    assert same_process.process is None and same_process.run_dir is None
    assert BuildKit.running(builder.state_dir) is builder


def test_stop_mid_build_leaves_nothing(
    node_assets: Path, declop_built: BuiltImage, tmp_path: Path
) -> None:
    """A build running a container is stopped: buildkitd, runc and the container's process
    are gone, no mount is left, the socket folder is removed, the state lock is free."""
    (tmp_path / "ctx").mkdir()
    marker = "declop-stop-test-" + os.urandom(4).hex()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f'FROM {declop_built.name}\nRUN ["/bin/bash", "-c", "exec -a {marker} sleep 600"]\n'
    )
    kit = BuildKit(assets_dir=node_assets, state_dir=tmp_path / "state").start()
    assert kit.process is not None and kit.run_dir is not None
    pid, run_dir = kit.process.pid, kit.run_dir
    failures: list[BaseException] = []

    def build() -> None:
        try:
            kit.build(tmp_path / "ctx", "sleeper:1", output=tmp_path / "sleeper.tar",
                      contexts={declop_built.name: declop_built})  # fmt: skip
        except BaseException as e:  # noqa: BLE001 - the build fails by design
            failures.append(e)

    thread = threading.Thread(target=build)
    thread.start()

    def container() -> list[int]:
        assert not failures, failures  # the build must still be running
        return [
            p for p in buildkit_module._descendants(pid)
            if marker.encode() in cmdline(p)
        ]  # fmt: skip

    try:
        wait_for(container, timeout=120, what="the build's container process")
    finally:
        kit.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert failures and isinstance(failures[0], ImageBuildError)
    assert leftovers(pid, tmp_path / "state", run_dir) == []
    stray = subprocess.run(
        ["pgrep", "-f", marker], capture_output=True, text=True, check=False
    ).stdout
    assert stray == "", f"processes left: {stray}"
    assert not run_dir.exists()
    with open(f"{tmp_path / 'state'}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free


def test_builder_dies_with_the_process_that_started_it(node_assets: Path, tmp_path: Path) -> None:
    """SIGKILL leaves no chance to clean up: the kernel's parent-death signal stops buildkitd,
    and the next builder on the same state starts (stale socket folder and all)."""
    owner = subprocess.Popen(
        [sys.executable, "-c",
         ("import sys, time; from declop.testing.cluster.image import BuildKit\n"
          f"kit = BuildKit(assets_dir={str(node_assets)!r}, state_dir={str(tmp_path / 's')!r})\n"
          "print(kit.start().process.pid, flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout is not None
    buildkitd = int(owner.stdout.readline())
    assert b"buildkitd" in cmdline(buildkitd)
    owner.kill()
    owner.wait()
    wait_for(lambda: not buildkit_module._alive(buildkitd), timeout=15, what="buildkitd gone")
    assert leftovers(buildkitd, tmp_path / "s") == []
    with BuildKit(assets_dir=node_assets, state_dir=tmp_path / "s") as again:
        assert again.run_dir == tmp_path / "s.run"


def test_without_root_the_cli_says_so_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [*NOBODY, sys.executable, "-m", "declop.testing.cluster.image_cli", "--output",
         str(tmp_path / "x.tar")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HOME": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: building an image needs root (buildkitd's runc worker, debootstrap); run as root"
    ]
