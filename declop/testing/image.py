"""Container images built from a Dockerfile by BuildKit: no Docker daemon, no registry, no network.

``buildkitd`` (OCI worker: runc, overlayfs) and ``buildctl`` come from ``tools/node/build.sh``.
The declop image is the repository's ``Dockerfile``, built on a local Python base::

    with BuildKit() as builder:
        image = declop_image(output=Path("build/declop-image.tar"), builder=builder)
        # ctr -n k8s.io images import build/declop-image.tar
        operator = build_image(ctx, "widgets:1", output=tmp / "widgets.tar",
                               contexts={image.name: image}, builder=builder)

Guarantees:

- :class:`BuildKit` runs ``buildkitd`` as root in its own session and its own mount namespace,
  with a private state folder (``${XDG_CACHE_HOME:-~/.cache}/declop/buildkit``, kept between runs
  as the layer cache; one builder at a time holds it, behind a lock file) and its own socket in
  ``<state>.run/``. :meth:`BuildKit.stop` kills it by pid (SIGTERM, then SIGKILL after 10 s),
  then every process it left behind, by pid; its mounts die with its mount namespace. Stop is
  idempotent and also runs at interpreter exit; if the process is killed outright, buildkitd
  gets SIGTERM from the kernel (parent-death signal of the thread that started it).
- A build writes its outputs aside and moves them into place: a :class:`BuiltImage`'s ``tar``
  (an OCI archive naming the image, for ``ctr -n k8s.io images import``) and ``layout`` (the
  same image as an OCI layout folder, for a later build's ``FROM``) are complete or absent.
- A failed build raises :class:`ImageBuildError` quoting the builder's last lines.
- Builds need no network: the base comes from :func:`base_image` (debootstrap, cached; it also
  holds Debian's ``tini``, the Dockerfile's ``tini`` context), the Python dependencies from
  :func:`wheelhouse` (exactly the hash-pinned lock files, downloaded on the host, cached) as the
  Dockerfile's ``wheels`` context, and the Dockerfile's ``# syntax=`` line is not followed
  (BuildKit's built-in Dockerfile frontend is used).
- A lock that no longer covers ``setup.cfg`` / ``pyproject.toml`` (:func:`lock_problems`) stops
  :func:`wheelhouse` with one line saying ``make lock``, before anything is downloaded.
"""

from __future__ import annotations

import atexit
import configparser
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from declop.errors import ConfigError
from declop.testing.process import Component, launch
from declop.version import __version__

#: the BuildKit each state folder is run by in this process: a second one on the same folder
#: would wait forever for the lock the first holds (flock is per open file, not per process)
_RUNNING: dict[Path, BuildKit] = {}

#: the binaries this module runs from the node assets folder
BUILDKIT_BINARIES = ("buildkitd", "buildctl")
#: Debian packages in the base image, besides debootstrap's minbase. ``tini`` is there so that the
#: base doubles as the Dockerfile's ``tini`` stage (``/usr/bin/tini-static``): same suite, same
#: mirror, verified by debootstrap like the rest, whatever the host's own apt sources are.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: the Dockerfile turning a debootstrap tree (as ``rootfs.tar``) into an image
BASE_DOCKERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8
CMD ["python3"]
"""
#: the node's sandbox image: tools/node/pause.c, static, alone
PAUSE_DOCKERFILE = """\
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
"""
#: what the wheelhouse holds wheels for (the Dockerfile's base is CPython 3.11 on glibc x86_64)
WHEEL_PYTHON = "3.11"
WHEEL_GLIBC = (2, 36)  # Debian bookworm's, as in python:3.11-slim
#: the hash-pinned lock files, relative to the checkout (``make lock`` writes them with uv):
#: the image's runtime (install_requires + ``fast``) and the build backend (pyproject.toml)
RUNTIME_LOCK = "requirements/image.lock"
BUILD_LOCK = "requirements/build.lock"
#: what a lock's header must say, so that a reader knows how to regenerate it
LOCK_COMMAND = "make lock"
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
                "run tools/node/build.sh and point it at the folder it prints"
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
            "run tools/node/build.sh (needs Go >= 1.26)"
        )
    return max(found, key=lambda d: (d / "buildkitd").stat().st_mtime)


class ImageBuildError(RuntimeError):
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
                f"building an image needs {' and '.join(missing)}; run tools/node/build.sh as root"
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


# -- the base: Debian's python3 by debootstrap ----------------------------------------------------


def base_key(suite: str, mirror: str, packages: Sequence[str]) -> str:
    """The base image's cache key: everything its content depends on (pure)."""
    text = json.dumps([suite, mirror, sorted(packages), BASE_DOCKERFILE])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def base_image(
    *,
    builder: BuildKit | None = None,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    packages: Sequence[str] = BASE_PACKAGES,
    cache_dir: str | Path | None = None,
) -> BuiltImage:
    """A Python base image: ``debootstrap --variant=minbase`` of Debian ``suite`` with ``packages``.

    Named ``declop/python-base:<key>``; cached in ``<cache_dir>/<key>/`` (default
    ``~/.cache/declop/base``) as ``image.tar`` + ``image.oci/``, built aside and moved into
    place. ``mirror`` defaults to ``$DECLOP_DEBIAN_MIRROR`` or deb.debian.org. Returns at once
    when cached; otherwise needs root, the mirror, and a builder (a temporary one if None).
    """
    mirror = mirror or os.environ.get("DECLOP_DEBIAN_MIRROR") or DEFAULT_MIRROR
    key = base_key(suite, mirror, packages)

    def make_context(work: Path, context: Path) -> None:
        _debootstrap(work / "rootfs", suite, mirror, packages, work / "debootstrap.log")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(work / "rootfs"), "-cf",
             str(context / "rootfs.tar"), "."],
            check=True,
        )  # fmt: skip
        shutil.rmtree(work / "rootfs")
        (context / "Dockerfile").write_text(BASE_DOCKERFILE)

    root = Path(cache_dir) if cache_dir else _cache_root() / "base"
    return _cached_image(root, key, f"declop/python-base:{key}", make_context, builder)


def pause_image(
    assets_dir: str | Path | None = None,
    name: str | None = None,
    *,
    builder: BuildKit | None = None,
    cache_dir: str | Path | None = None,
) -> BuiltImage:
    """The node's sandbox image: ``<assets_dir>/pause`` (default: :func:`find_buildkit`'s folder;
    tools/node/pause.c) as ``/pause``, its entrypoint, user 65535.

    Named ``name``, default ``declop/pause:<key>``; cached by (binary, name) like
    :func:`base_image`, in ``~/.cache/declop/pause``.
    """
    binary = Path(assets_dir or find_buildkit()) / "pause"
    digest = hashlib.sha256(binary.read_bytes() + PAUSE_DOCKERFILE.encode())
    digest.update((name or "").encode())
    key = digest.hexdigest()[:12]
    name = name or f"declop/pause:{key}"

    def make_context(work: Path, context: Path) -> None:
        shutil.copy2(binary, context / "pause")
        (context / "Dockerfile").write_text(PAUSE_DOCKERFILE)

    root = Path(cache_dir) if cache_dir else _cache_root() / "pause"
    return _cached_image(root, key, name, make_context, builder)


def _cached_image(
    root: Path,
    key: str,
    name: str,
    make_context: Callable[[Path, Path], None],
    builder: BuildKit | None,
) -> BuiltImage:
    """``root/key/image.{tar,oci}`` if there; else ``make_context(work, context)`` fills a
    context folder, the builder (a temporary one if None) builds it, and the result is moved
    into place in one rename (a concurrent build that finished first wins)."""
    final = root / key
    if not ((final / "image.tar").is_file() and (final / "image.oci" / "index.json").is_file()):
        _require_root(f"building {name}")
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            context = work / "context"
            context.mkdir()
            make_context(work, context)
            out = work / "out"
            builder = builder or BuildKit.running()
            if builder is None:
                with BuildKit() as temporary:
                    temporary.build(context, name, output=out / "image.tar")
            else:
                builder.build(context, name, output=out / "image.tar")
            try:
                out.rename(final)
            except OSError:
                if not (final / "image.oci" / "index.json").is_file():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return BuiltImage(
        name, final / "image.tar", final / "image.oci", manifest_digest(final / "image.oci")
    )


def _debootstrap(target: Path, suite: str, mirror: str, packages: Sequence[str], log: Path) -> None:
    """debootstrap into ``target`` in a private mount namespace (its /proc, /sys mounts die
    with it), then drop what an image must not carry: device nodes, apt caches and lists."""
    if shutil.which("debootstrap") is None:
        raise ConfigError("debootstrap is not installed; run tools/node/build.sh as root")
    with open(log, "wb") as out:
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--",
             "debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
             suite, str(target), mirror],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )  # fmt: skip
    if result.returncode != 0:
        inner = target / "debootstrap" / "debootstrap.log"
        raise ImageBuildError(
            f"debootstrap {suite} from {mirror} failed (exit {result.returncode}); last lines:\n"
            + _tail(log)
            + (f"\n--- {inner}:\n{_tail(inner)}" if inner.exists() else "")
        )
    for folder in ("dev", "var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (target / folder).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                if entry.name != "partial":
                    shutil.rmtree(entry)
            else:
                entry.unlink()


# -- the wheelhouse: declop's dependencies, downloaded on the host --------------------------------


def requirements(source: str | Path, extras: Sequence[str] = ("fast",)) -> list[str]:
    """What the project at ``source`` asks for: its build-system requirements (pyproject.toml),
    ``install_requires`` and ``extras`` (setup.cfg) — what the lock files must cover. Pure."""
    source = Path(source)
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    wanted = list(pyproject.get("build-system", {}).get("requires", []))
    config = configparser.ConfigParser()
    config.read(source / "setup.cfg")
    wanted += config.get("options", "install_requires", fallback="").split("\n")
    for extra in extras:
        wanted += config.get("options.extras_require", extra, fallback="").split("\n")
    return [line.strip() for line in wanted if line.strip()]


@dataclass(frozen=True)
class Pin:
    """One entry of a lock file: ``name==version`` with its ``--hash=sha256:`` values.

    ``name`` is canonical (PEP 503: lower case, runs of ``-_.`` as ``-``)."""

    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    """A parsed pip requirements lock: its leading comment lines and its pins, by name."""

    header: tuple[str, ...]
    pins: Mapping[str, Pin]


def _canonical(name: str) -> str:
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-").split("-"))


def read_lock(path: str | Path) -> Lock:
    """Parse a ``--generate-hashes`` lock (pip's requirements format, ``\\`` continuations).

    Raises:
        ConfigError: a requirement line that is not ``name==version [; marker] [--hash=…]``.
    """
    path = Path(path)
    header: list[str] = []
    pins: dict[str, Pin] = {}
    logical: list[tuple[int, str]] = []  # (first physical line, the line with continuations)
    joined = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if joined:
            logical[-1] = (logical[-1][0], logical[-1][1] + " " + line.rstrip("\\"))
        else:
            logical.append((number, line.rstrip("\\")))
        joined = line.endswith("\\")
    for number, line in logical:
        text = line.strip()
        if text.startswith("#"):
            if not pins:
                header.append(text)
            continue
        text = text.split(" #", 1)[0].strip()
        if not text or text.startswith("-"):  # blank, or a global option (--index-url …)
            continue
        spec, *options = text.split()
        hashes = tuple(o.removeprefix("--hash=") for o in options if o.startswith("--hash="))
        name, sep, version = spec.split(";", 1)[0].partition("==")
        if not sep or not name or not version:
            raise ConfigError(
                f"{path}: line {number} ({spec!r}) is not pinned as name==version; "
                f"run {LOCK_COMMAND}"
            )
        pin = Pin(_canonical(name.split("[", 1)[0]), version, hashes)
        pins[pin.name] = pin
    return Lock(tuple(header), pins)


def lock_problems(source: str | Path, extras: Sequence[str] = ("fast",)) -> list[str]:
    """Why the lock files of the checkout at ``source`` do not match its requirements: every
    ``install_requires`` and ``extras`` requirement (setup.cfg) pinned in :data:`RUNTIME_LOCK`,
    every build-system requirement (pyproject.toml) in :data:`BUILD_LOCK`, each at a version
    inside its specifier; every pin with a ``sha256`` hash; each header naming
    :data:`LOCK_COMMAND`. Empty when they match. Reads files only: no resolver, no network."""
    from packaging.requirements import Requirement  # pytest's and pip's dependency

    source = Path(source)
    wanted = requirements(source, extras)
    pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    build = set(pyproject.get("build-system", {}).get("requires", []))
    problems: list[str] = []
    locks: dict[str, Lock] = {}
    for relative in (RUNTIME_LOCK, BUILD_LOCK):
        if not (source / relative).is_file():
            problems.append(f"{relative} is missing")
            continue
        lock = locks[relative] = read_lock(source / relative)
        if not any(LOCK_COMMAND in line for line in lock.header):
            problems.append(f"{relative}'s header does not say '{LOCK_COMMAND}' regenerates it")
        for locked in lock.pins.values():
            if not any(h.startswith("sha256:") for h in locked.hashes):
                problems.append(f"{relative}: {locked.name}=={locked.version} has no --hash=sha256:")
    for line in wanted:
        relative = BUILD_LOCK if line in build else RUNTIME_LOCK
        if relative not in locks:
            continue
        requirement = Requirement(line)
        pin = locks[relative].pins.get(_canonical(requirement.name))
        if pin is None:
            problems.append(f"{requirement.name} ({line}) is not in {relative}")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{relative} pins {pin.name}=={pin.version}, outside '{line}'")
    return problems


def check_locks(source: str | Path, extras: Sequence[str] = ("fast",)) -> None:
    """Raise ``ConfigError`` (one line: the first problem, how many, ``make lock``) unless
    :func:`lock_problems` is empty."""
    problems = lock_problems(source, extras)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"stale lock: {problems[0]}{more}; run {LOCK_COMMAND} and commit it")


def manylinux_platforms(glibc: tuple[int, int], arch: str = "x86_64") -> list[str]:
    """Every manylinux tag a wheel for ``arch`` may carry to run on ``glibc`` (pip takes
    ``--platform`` tags literally), newest first, with the legacy aliases. Pure."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{alias}_{arch}" for m, alias in legacy.items() if m <= minor]


def wheelhouse(
    source: str | Path,
    *,
    extras: Sequence[str] = ("fast",),
    python_version: str = WHEEL_PYTHON,
    glibc: tuple[int, int] = WHEEL_GLIBC,
    cache_dir: str | Path | None = None,
) -> Path:
    """A folder of wheels for exactly the lock files (:data:`RUNTIME_LOCK`, :data:`BUILD_LOCK`) on
    CPython ``python_version`` for x86_64 with ``glibc``, downloaded by this interpreter's pip in
    hash-checking mode (``--require-hashes --no-deps``); cached by the locks' contents in
    ``~/.cache/declop/wheels`` (built aside, moved into place). A stale lock raises
    ``ConfigError`` first (:func:`check_locks`)."""
    source = Path(source)
    check_locks(source, extras)
    locks = [source / RUNTIME_LOCK, source / BUILD_LOCK]
    platforms = manylinux_platforms(glibc)
    texts = [lock.read_text() for lock in locks]
    key = hashlib.sha256(json.dumps([texts, python_version, platforms]).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir else _cache_root() / "wheels"
    final = root / key
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    abi = "cp" + python_version.replace(".", "")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--require-hashes", "--no-deps",
             "--only-binary=:all:", *(f"--platform={p}" for p in platforms),
             "--python-version", python_version,
             "--implementation", "cp", "--abi", abi, "--dest", str(work),
             *(arg for lock in locks for arg in ("-r", str(lock)))],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            lines = (result.stdout + result.stderr).strip().splitlines()[-TAIL_LINES:]
            raise ImageBuildError("pip download of the wheelhouse failed:\n" + "\n".join(lines))
        try:
            work.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


# -- the declop image ---------------------------------------------------------------------------


def source_dir() -> Path:
    """The declop checkout this module runs from (it holds the Dockerfile)."""
    here = Path(__file__).resolve().parents[2]
    if not (here / "Dockerfile").is_file() or not (here / "setup.cfg").is_file():
        raise ConfigError(
            f"{here} is not a declop source checkout (no Dockerfile); pass the checkout's folder"
        )
    return here


def build_image(
    context: str | Path,
    name: str,
    *,
    output: str | Path,
    dockerfile: str | Path | None = None,
    build_args: Mapping[str, str] | None = None,
    contexts: Mapping[str, str | Path | BuiltImage] | None = None,
    target: str | None = None,
    builder: BuildKit | None = None,
) -> BuiltImage:
    """:meth:`BuildKit.build` on ``builder``, else on this process's running BuildKit, else on
    a temporary one."""
    builder = builder or BuildKit.running()
    if builder is None:
        with BuildKit() as temporary:
            return build_image(
                context, name, output=output, dockerfile=dockerfile, build_args=build_args,
                contexts=contexts, target=target, builder=temporary,
            )  # fmt: skip
    return builder.build(
        context, name, output=output, dockerfile=dockerfile, build_args=build_args,
        contexts=contexts, target=target,
    )  # fmt: skip


def declop_image(
    *,
    output: str | Path,
    name: str | None = None,
    source: str | Path | None = None,
    builder: BuildKit | None = None,
) -> BuiltImage:
    """The repository's Dockerfile built on :func:`base_image` with :func:`wheelhouse` as its
    ``wheels`` context and the base as its ``tini`` context, named ``declop:<version>`` unless
    ``name`` says otherwise."""
    source = Path(source) if source else source_dir()
    if not (source / "Dockerfile").is_file() or not (source / "setup.cfg").is_file():
        raise ConfigError(f"{source} is not a declop source checkout (no Dockerfile or setup.cfg)")
    name = name or f"declop:{__version__}"
    builder = builder or BuildKit.running()
    if builder is None:
        with BuildKit() as temporary:
            return declop_image(output=output, name=name, source=source, builder=temporary)
    base = base_image(builder=builder)
    wheels = wheelhouse(source)
    return builder.build(
        source,
        name,
        output=output,
        build_args={"PYTHON_IMAGE": base.name, "VERSION": name.rpartition(":")[2]},
        contexts={base.name: base, "wheels": wheels, "tini": base},
    )
