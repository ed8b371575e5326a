"""BuildKit: ``buildkitd`` run as root for one process's image builds, and the images it builds.

Owns :class:`BuildKit` (the daemon and its ``buildctl build``), :class:`BuiltImage` and
:class:`ImageBuildError`, and finding the binaries (:func:`find_buildkit`, from
``tools/node/build.sh``). What is built — the Debian base, the pause image, declop's own image and
its wheelhouse — is :mod:`declop.testing.cluster.image`.

Invariants:
- :class:`BuildKit` runs ``buildkitd`` as root in its own session and its own mount namespace,
  with a private state folder (``${XDG_CACHE_HOME:-~/.cache}/declop/buildkit``, kept between runs
  as the layer cache; one builder at a time holds it, behind a lock file) and its own socket in
  ``<state>.run/``; at most one per state folder runs in a process (:meth:`BuildKit.running`);
- :meth:`BuildKit.stop` kills it by pid (SIGTERM, then SIGKILL after 10 s), then every process
  it left behind, by pid; its mounts die with its mount namespace. Stop is idempotent and also
  runs at interpreter exit; if the process is killed outright, buildkitd gets SIGTERM from the
  kernel (parent-death signal of the thread that started it);
- a build writes its outputs aside and moves them into place: a :class:`BuiltImage`'s ``tar``
  and ``layout`` are complete or absent;
- a failed build raises :class:`ImageBuildError` quoting the builder's last lines;
- the Dockerfile's ``# syntax=`` line is not followed: BuildKit's built-in frontend is used.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from declop.errors import ConfigError, DeclopError
from declop.testing.cluster.process import Component, launch

__all__ = ["BuildKit", "BuiltImage", "ImageBuildError", "buildctl_command", "find_buildkit", "manifest_digest"]

#: the BuildKit each state folder is run by in this process: a second one on the same folder
#: would wait forever for the lock the first holds (flock is per open file, not per process)
_RUNNING: dict[Path, BuildKit] = {}

#: the binaries this module runs from the node assets folder
BUILDKIT_BINARIES = ("buildkitd", "buildctl")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes
TAIL_LINES = 25


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "declop"


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ConfigError(f"{what} needs root (buildkitd's runc worker, debootstrap); run as root")


def find_buildkit() -> Path:
    """The folder holding ``buildkitd`` and ``buildctl``.

    ``$DECLOP_NODE_ASSETS_DIR`` when set (it must hold both), else the newest complete
    ``${XDG_CACHE_HOME:-~/.cache}/declop/node/*``.

    Raises:
        ConfigError: the named folder lacks a binary, or nothing was found.
    """
    folder = os.environ.get("DECLOP_NODE_ASSETS_DIR")
    if folder:
        missing = [b for b in BUILDKIT_BINARIES if not os.access(Path(folder, b), os.X_OK)]
        if missing:
            raise ConfigError(
                f"$DECLOP_NODE_ASSETS_DIR={folder} has no {', '.join(missing)}; "
                "run `declop assets build --node` and point it at the folder it prints"
            )
        return Path(folder)
    root = _cache_root() / "node"
    found = [
        d
        for d in (sorted(root.iterdir()) if root.is_dir() else [])
        if all(os.access(d / b, os.X_OK) for b in BUILDKIT_BINARIES)
    ]
    if not found:
        raise ConfigError(
            f"no buildkitd/buildctl found (looked at $DECLOP_NODE_ASSETS_DIR and {root}); "
            "run `declop assets build --node` (needs Go >= 1.26)"
        )
    return max(found, key=lambda d: (d / "buildkitd").stat().st_mtime)


class ImageBuildError(DeclopError, RuntimeError):
    """A build (or the base's debootstrap) failed; the message quotes the tool's last lines."""


@dataclass(frozen=True)
class BuiltImage:
    """An image built by :class:`BuildKit`.

    Attributes:
        name: the image's name, e.g. ``declop:0.1.0`` (``ctr`` imports it as
            ``docker.io/library/declop:0.1.0``).
        tar: OCI archive of the image (``index.json`` carries the name).
        layout: the same image as an OCI layout folder.
        digest: the manifest digest, ``sha256:…``.
    """

    name: str
    tar: Path
    layout: Path
    digest: str

    def __fspath__(self) -> str:
        """Where a path is wanted (``ctr images import``), an image stands for its archive."""
        return str(self.tar)

    def __str__(self) -> str:
        return str(self.tar)


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _mounts_under(folder: Path) -> list[str]:
    """Mount points in this mount namespace at or below ``folder``, deepest first."""
    prefix = str(folder.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BuildKit:
    """``buildkitd`` for one or more builds; see the module docstring.

    Args:
        assets_dir: folder with ``buildkitd`` and ``buildctl``; default :func:`find_buildkit`.
        state_dir: buildkitd's root (its layer cache); default ``~/.cache/declop/buildkit``.
        start_timeout: seconds buildkitd may take to answer.
        lock_timeout: seconds to wait for another builder using the same state folder.
    """

    def __init__(
        self,
        *,
        assets_dir: str | Path | None = None,
        state_dir: str | Path | None = None,
        start_timeout: float = 60.0,
        lock_timeout: float = 900.0,
    ) -> None:
        self._assets = Path(assets_dir) if assets_dir else None
        self.state_dir = Path(state_dir) if state_dir else _cache_root() / "buildkit"
        self.start_timeout = start_timeout
        self.lock_timeout = lock_timeout
        self.run_dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._component: Component | None = None
        self._lock: int | None = None
        self._builds = 0

    @property
    def address(self) -> str:
        assert self.run_dir is not None, "BuildKit is not started"
        return f"unix://{self.run_dir}/buildkitd.sock"

    def _bin(self, name: str) -> str:
        return str((self._assets or find_buildkit()) / name)

    @classmethod
    def running(cls, state_dir: str | Path | None = None) -> BuildKit | None:
        """The started BuildKit of this process on ``state_dir`` (default: the shared cache
        folder), if any — what the image helpers use instead of starting a second one."""
        folder = Path(state_dir) if state_dir else _cache_root() / "buildkit"
        return _RUNNING.get(folder.resolve())

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start buildkitd and wait until it lists its worker; raises ``ImageBuildError``."""
        if self.process is not None:
            return self
        _require_root("building an image")
        if self._assets is None:
            self._assets = find_buildkit()
        path = f"{self._assets}:{SYSTEM_PATH}"
        tools = {tool: shutil.which(tool, path=path) for tool in ("setpriv", "unshare", "runc")}
        missing = [tool for tool, found in tools.items() if found is None]
        if missing:
            raise ConfigError(
                f"building an image needs {' and '.join(missing)}; run `declop assets build --node` as root"
            )
        atexit.register(self.stop)
        try:
            self._take_lock()
            self.run_dir = self._make_run_dir()
            config = self.run_dir / "buildkitd.toml"
            config.write_text("# declop: all settings are flags\n")
            env = dict(os.environ)
            env["PATH"] = path
            # SIGTERM when the thread that starts it dies, even by SIGKILL; its own mount
            # namespace, so its overlay mounts cannot outlive it on the host
            self._component = launch(
                "buildkitd",
                [
                    str(tools["setpriv"]), "--pdeathsig", "TERM", "--",
                    str(tools["unshare"]), "--mount", "--propagation", "private", "--",
                    self._bin("buildkitd"),
                    "--config", str(config),
                    "--root", str(self.state_dir),
                    "--addr", self.address,
                    "--oci-worker=true",
                    "--containerd-worker=false",
                    "--oci-worker-snapshotter=overlayfs",
                    "--oci-worker-net=host",
                ],
                self.run_dir,
                env,
            )  # fmt: skip
            self.process = self._component.popen
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _make_run_dir(self) -> Path:
        """``<state_dir>.run``, emptied (the lock is ours: what is there is stale), or a temporary
        folder when that path is too long for a socket."""
        run_dir = Path(f"{self.state_dir}.run")
        if len(f"{run_dir}/buildkitd.sock") > SOCKET_PATH_MAX:
            return Path(tempfile.mkdtemp(prefix="declop-buildkit-"))
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(mode=0o700)
        return run_dir

    def _take_lock(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        key = self.state_dir.resolve()
        if _RUNNING.get(key, self) is not self:
            raise ImageBuildError(
                f"this process already runs a BuildKit on {self.state_dir}; pass that one as "
                "builder= (BuildKit.running() returns it) instead of starting a second"
            )
        fd = os.open(f"{self.state_dir}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    os.close(fd)
                    raise ImageBuildError(
                        f"another builder holds {self.state_dir}.lock "
                        f"for more than {self.lock_timeout:.0f} s"
                    ) from e
                time.sleep(0.2)  # poll a lock held by another process; no event to await
        self._lock = fd
        _RUNNING[key] = self

    def _wait_ready(self) -> None:
        assert self.process is not None and self.run_dir is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.process.poll() is not None:
                raise ImageBuildError(
                    f"buildkitd exited with {self.process.returncode} at start:\n"
                    + _tail(self.run_dir / "buildkitd.log")
                )
            probe = subprocess.run(
                [self._bin("buildctl"), "--addr", self.address, "debug", "workers"],
                capture_output=True,
                text=True,
                check=False,
            )
            if probe.returncode == 0 and probe.stdout.count("\n") >= 2:
                return
            if time.monotonic() > deadline:
                raise ImageBuildError(
                    f"buildkitd did not answer within {self.start_timeout:.0f} s:\n"
                    + _tail(self.run_dir / "buildkitd.log")
                )
            time.sleep(0.1)  # the socket appears when buildkitd is up; nothing to await on

    def stop(self) -> None:
        """Kill buildkitd and what it left, by pid; remove the socket folder; release the lock."""
        component, self._component, self.process = self._component, None, None
        if component is not None:
            left = _descendants(component.popen.pid)
            component.stop()  # SIGTERM to its process group, SIGKILL after 10 s; reaped
            for pid in left:
                if _alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for folder in (self.run_dir, self.state_dir):
            if folder is not None:
                for point in _mounts_under(folder):  # none: its mount namespace died with it
                    subprocess.run(["umount", "--lazy", point], check=False)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
        if self._lock is not None:
            _RUNNING.pop(self.state_dir.resolve(), None)
            os.close(self._lock)  # closing the last descriptor releases the flock
            self._lock = None
        atexit.unregister(self.stop)

    def build(
        self,
        context: str | Path,
        name: str,
        *,
        output: str | Path,
        dockerfile: str | Path | None = None,
        build_args: Mapping[str, str] | None = None,
        contexts: Mapping[str, str | Path | BuiltImage] | None = None,
        target: str | None = None,
    ) -> BuiltImage:
        """Build ``dockerfile`` (default ``<context>/Dockerfile``) into ``output`` (a ``.tar``).

        ``contexts`` are named contexts: a folder, or a :class:`BuiltImage` (its OCI layout),
        each replacing the stage or image of that name in ``FROM``, ``COPY --from`` and
        ``RUN --mount=from=``. The OCI layout goes beside the tar (``x.tar`` → ``x.oci/``).
        """
        if self.process is None or self.run_dir is None:
            raise RuntimeError("BuildKit.build() before start()")
        context = Path(context).resolve()
        dockerfile = Path(dockerfile).resolve() if dockerfile else context / "Dockerfile"
        output = Path(output).resolve()
        layout = output.with_suffix(".oci")
        output.parent.mkdir(parents=True, exist_ok=True)
        self._builds += 1
        log = self.run_dir / f"build-{self._builds}.log"
        tmp_tar = output.with_name(f".{output.name}.{os.getpid()}.tmp")
        command = buildctl_command(
            self._bin("buildctl"),
            self.address,
            context=context,
            dockerfile=dockerfile,
            name=name,
            output=tmp_tar,
            build_args=build_args or {},
            contexts=contexts or {},
            target=target,
        )
        try:
            with open(log, "wb") as out:
                result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
            if result.returncode != 0:
                raise ImageBuildError(
                    f"building {name} from {dockerfile} failed (buildctl exit "
                    f"{result.returncode}); last lines:\n{_tail(log)}"
                )
            digest = _install_outputs(tmp_tar, output, layout)
        finally:
            tmp_tar.unlink(missing_ok=True)
        return BuiltImage(name=name, tar=output, layout=layout, digest=digest)


def buildctl_command(
    buildctl: str,
    address: str,
    *,
    context: Path,
    dockerfile: Path,
    name: str,
    output: Path,
    build_args: Mapping[str, str],
    contexts: Mapping[str, str | Path | BuiltImage],
    target: str | None = None,
) -> list[str]:
    """The ``buildctl build`` command line for one build (pure: no I/O)."""
    command = [
        buildctl, "--addr", address, "build",
        "--progress", "plain",
        "--frontend", "dockerfile.v0",
        "--local", f"context={context}",
        "--local", f"dockerfile={dockerfile.parent}",
        "--opt", f"filename={dockerfile.name}",
        # present, so the built-in frontend does not follow `# syntax=` to a registry image
        "--opt", "cmdline=",
        "--output", f"type=oci,name={name},dest={output}",
    ]  # fmt: skip
    if target:
        command += ["--opt", f"target={target}"]
    for key, value in sorted(build_args.items()):
        command += ["--opt", f"build-arg:{key}={value}"]
    for i, (ctx_name, source) in enumerate(sorted(contexts.items(), key=lambda kv: kv[0])):
        if isinstance(source, BuiltImage):
            store = f"store{i}"
            command += [
                "--oci-layout", f"{store}={source.layout}",
                "--opt", f"context:{ctx_name}=oci-layout://{store}@{source.digest}",
            ]  # fmt: skip
        else:
            local = f"named{i}"
            command += [
                "--local", f"{local}={Path(source).resolve()}",
                "--opt", f"context:{ctx_name}=local:{local}",
            ]  # fmt: skip
    return command


def _install_outputs(tmp_tar: Path, output: Path, layout: Path) -> str:
    """Unpack the OCI archive into ``layout``, move both into place; return the manifest digest."""
    tmp_layout = layout.with_name(f".{layout.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp_layout, ignore_errors=True)
    with tarfile.open(tmp_tar) as archive:
        archive.extractall(tmp_layout, filter="data")
    digest = manifest_digest(tmp_layout)
    old = layout.with_name(f".{layout.name}.{os.getpid()}.old")
    if layout.exists():
        layout.rename(old)
    tmp_layout.rename(layout)
    shutil.rmtree(old, ignore_errors=True)
    tmp_tar.chmod(0o644)
    os.replace(tmp_tar, output)
    return digest


def manifest_digest(layout: Path) -> str:
    """The digest of the single image in an OCI layout's ``index.json``."""
    index = json.loads((layout / "index.json").read_text())
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ImageBuildError(f"{layout}/index.json lists {len(manifests)} images, expected 1")
    return str(manifests[0]["digest"])
