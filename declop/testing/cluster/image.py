"""Container images built from a Dockerfile by BuildKit: no Docker daemon, no registry, no network.

``buildkitd`` (OCI worker: runc, overlayfs) and ``buildctl`` come from ``tools/node/build.sh``.
The declop image is the repository's ``Dockerfile``, built on a local Python base::

    with BuildKit() as builder:
        image = declop_image(output=Path("build/declop-image.tar"), builder=builder)
        # ctr -n k8s.io images import build/declop-image.tar
        operator = build_image(ctx, "widgets:1", output=tmp / "widgets.tar",
                               contexts={image.name: image}, builder=builder)

Guarantees:

- Builds run on :class:`~declop.testing.cluster.buildkit.BuildKit` (:mod:`declop.testing.cluster.buildkit`: how
  ``buildkitd`` runs and stops; :class:`BuildKit`, :class:`BuiltImage` and
  :class:`ImageBuildError` are importable from here too): this process's running builder when no
  ``builder=`` is given, else a temporary one.
- A built image's ``tar`` (an OCI archive naming the image, for ``ctr -n k8s.io images import``)
  and ``layout`` (the same image as an OCI layout folder, for a later build's ``FROM``) are
  complete or absent, cached images too.
- A failed build, debootstrap or wheel download raises :class:`ImageBuildError` quoting the
  tool's last lines.
- Builds need no network: the base comes from :func:`base_image` (debootstrap, cached; it also
  holds Debian's ``tini``, the Dockerfile's ``tini`` context), the Python dependencies from
  :func:`wheelhouse` (exactly the hash-pinned lock files, downloaded on the host, cached) as the
  Dockerfile's ``wheels`` context, and the Dockerfile's ``# syntax=`` line is not followed
  (BuildKit's built-in Dockerfile frontend is used).
- A lock that no longer covers ``setup.cfg`` / ``pyproject.toml`` (:func:`lock_problems`) stops
  :func:`wheelhouse` with one line saying ``make lock``, before anything is downloaded.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from declop.errors import ConfigError
from declop.testing.cluster.buildkit import TAIL_LINES, _cache_root, _require_root, _tail
from declop.testing.cluster.buildkit import BuildKit as BuildKit
from declop.testing.cluster.buildkit import BuiltImage as BuiltImage
from declop.testing.cluster.buildkit import ImageBuildError as ImageBuildError
from declop.testing.cluster.buildkit import buildctl_command as buildctl_command
from declop.testing.cluster.buildkit import find_buildkit as find_buildkit
from declop.testing.cluster.buildkit import manifest_digest as manifest_digest
from declop.version import __version__

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
        raise ConfigError("debootstrap is not installed; run `declop assets build --node` as root")
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
    try:
        from packaging.requirements import Requirement  # the dev and test extras bring it
    except ImportError:
        raise ConfigError(
            "building declop's image checks its lock files with the packaging module, which is "
            "not installed: pip install 'declop[dev]'"
        ) from None

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
    here = Path(__file__).resolve().parents[3]
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
    """declop's Dockerfile built on :func:`base_image` with :func:`wheelhouse` as its
    ``wheels`` context and the base as its ``tini`` context, named ``declop:<version>`` unless
    ``name`` says otherwise. ``source`` defaults to this declop: its checkout, or from an
    install the shipped Dockerfile beside a copy of the installed package
    (:func:`declop.assets.files.image_source`)."""
    if source is None:  # this declop: its checkout, or the installed package (declop.assets.files)
        from declop.assets.files import image_source

        with image_source() as staged:
            return declop_image(output=output, name=name, source=staged, builder=builder)
    source = Path(source)
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
