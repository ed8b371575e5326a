"""The control plane's binaries: where they are, and how to build them from an installed declop.

declop's tests (and yours) run the upstream kube-apiserver, etcd, kubectl, kube-controller-manager
and helm. They are built from the Go module proxy by ``controlplane/build.sh`` in this package,
beside the wrapper Go module that pins them (``controlplane/go.mod``, ``go.sum``). Those three
files are package data: a wheel carries them, so ``declop assets build`` works outside a clone.

- **Cache key.** A build goes to ``${XDG_CACHE_HOME:-~/.cache}/declop/controlplane/<version>-<key>``
  where ``<version>`` is go.mod's ``k8s.io/kubernetes`` and ``<key>`` the first 12 hex digits of
  the sha256 of go.mod's bytes followed by go.sum's — exactly what build.sh computes, so a
  checkout, an editable install and a wheel of the same pins share one folder.
- **Lookup** (:func:`find`, ``declop assets path``): ``$KUBEBUILDER_ASSETS``, then
  ``$DECLOP_ASSETS_DIR`` (each, when set, must hold kube-apiserver, etcd and kubectl), then this
  version's cache folder, then the newest other complete folder in the cache. Nothing found is
  a :class:`~declop.errors.ConfigError` whose one line names ``declop assets build``.
- **Build** (:func:`build`, ``declop assets build``): into ``$DECLOP_ASSETS_DIR`` when set, else
  this version's cache folder. A folder already holding every binary is returned at once and
  needs no Go; otherwise build.sh runs with its progress on stderr. Idempotent.

This module imports nothing heavier than the standard library: ``declop assets path`` is called
from Makefiles and shell prompts. What declop ships for running in-cluster from an install (the
Helm chart, the image's Dockerfile, the node's build) is :mod:`declop.assets.files`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO

from declop.errors import ConfigError, DeclopError

__all__ = [
    "ALL_BINARIES",
    "REQUIRED_BINARIES",
    "build",
    "build_script",
    "cache_folder",
    "cache_key",
    "cache_root",
    "find",
    "kubernetes_version",
    "missing",
    "module_dir",
    "require",
]

#: what a folder must hold to run a control plane (kube-controller-manager and helm are optional)
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kubectl")
#: what build.sh builds; a folder holding all of them is complete
ALL_BINARIES = ("kube-apiserver", "kube-controller-manager", "etcd", "kubectl", "helm")
#: the command that builds them, named by every "not found" message
BUILD_COMMAND = "declop assets build"
_APISERVER = "kube-apiserver"
_KUBERNETES_MODULE = re.compile(r"^\s*k8s\.io/kubernetes\s+(v\S+)", re.MULTILINE)


def module_dir() -> Path:
    """The folder holding build.sh, go.mod and go.sum (inside the installed package)."""
    return Path(__file__).resolve().parent / "controlplane"


def build_script() -> Path:
    """The control-plane build script (run it with bash)."""
    return module_dir() / "build.sh"


def kubernetes_version(folder: Path | None = None) -> str:
    """The pinned Kubernetes version: go.mod's ``k8s.io/kubernetes`` requirement, e.g. ``v1.36.3``."""
    gomod = ((folder or module_dir()) / "go.mod").read_text()
    found = _KUBERNETES_MODULE.search(gomod)
    if found is None:
        raise ConfigError(f"{folder or module_dir()}/go.mod requires no k8s.io/kubernetes; reinstall declop")
    return found.group(1)


def cache_key(folder: Path | None = None) -> str:
    """First 12 hex digits of sha256(go.mod bytes + go.sum bytes): build.sh's cache key."""
    folder = folder or module_dir()
    digest = hashlib.sha256((folder / "go.mod").read_bytes() + (folder / "go.sum").read_bytes())
    return digest.hexdigest()[:12]


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/declop/controlplane``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "declop" / "controlplane"


def cache_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where this version's binaries are cached: ``<cache_root>/<version>-<key>``."""
    return cache_root(environ) / f"{kubernetes_version()}-{cache_key()}"


def missing(folder: str | Path, names: Iterable[str] = REQUIRED_BINARIES) -> list[str]:
    """Which of ``names`` are not executable files in ``folder`` (in the order given)."""
    folder = Path(folder)
    return [n for n in names if not (folder / n).is_file() or not os.access(folder / n, os.X_OK)]


def find(environ: Mapping[str, str] | None = None) -> str:
    """The folder holding kube-apiserver, etcd and kubectl (see the module docstring's lookup).

    Raises:
        ConfigError: a folder named by a variable lacks a binary, or nothing was found at all.
    """
    env = os.environ if environ is None else environ
    for variable in ("KUBEBUILDER_ASSETS", "DECLOP_ASSETS_DIR"):
        folder = env.get(variable)
        if folder:
            require(folder, f"${variable}")
            return folder
    root = cache_root(env)
    pinned = cache_folder(env)
    if not missing(pinned):
        return str(pinned)
    others = [d for d in _subdirs(root) if not missing(d)]
    if others:
        return str(max(others, key=lambda d: (d / _APISERVER).stat().st_mtime))
    raise ConfigError(
        "no Kubernetes control-plane binaries found (looked at $KUBEBUILDER_ASSETS, "
        f"$DECLOP_ASSETS_DIR and {root}); run `{BUILD_COMMAND}` (needs Go >= 1.26) "
        "or set KUBEBUILDER_ASSETS to a folder with kube-apiserver, etcd and kubectl"
    )


def require(folder: str | Path, where: str, names: Iterable[str] = REQUIRED_BINARIES) -> None:
    """Raise a one-line :class:`ConfigError` when ``folder`` (described as ``where``) lacks one of ``names``."""
    lacking = missing(folder, names)
    if lacking:
        raise ConfigError(
            f"{where} ({folder}) lacks {', '.join(lacking)}; run `{BUILD_COMMAND}` "
            "(needs Go >= 1.26) or point KUBEBUILDER_ASSETS at a folder with kube-apiserver, "
            "etcd and kubectl"
        )


def build(*, stderr: IO[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Build every binary that is missing (or find them all built) and return their folder.

    Progress lines go to ``stderr`` (default: this process's). The target is
    ``$DECLOP_ASSETS_DIR`` when set, else :func:`cache_folder`.

    Raises:
        ConfigError: something is missing to build (Go not on PATH).
        DeclopError: the build itself failed (Go, network, disk); build.sh's lines say why.
    """
    env = dict(os.environ if environ is None else environ)
    err = stderr if stderr is not None else sys.stderr
    target = Path(env.get("DECLOP_ASSETS_DIR") or cache_folder(env))
    if not missing(target, ALL_BINARIES):
        print(f"[controlplane] up to date: {target}", file=err, flush=True)
        return str(target)
    if shutil.which("go", path=env.get("PATH")) is None:
        raise ConfigError(
            "'go' is not on PATH and building the control plane needs Go >= 1.26; install it "
            f"(https://go.dev/doc/install or your distribution's golang package) and run `{BUILD_COMMAND}` again"
        )
    env["DECLOP_ASSETS_DIR"] = str(target)
    proc = subprocess.Popen(
        ["bash", str(build_script())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stderr:  # progress as it happens; stdout is one line, it cannot fill its pipe
        err.write(line)
        err.flush()
    out = proc.stdout.read()
    returncode = proc.wait()
    lines = out.strip().splitlines()
    if returncode != 0 or not lines:
        raise DeclopError(
            f"building the control plane into {target} failed (build.sh exited {returncode}); "
            "its lines above say why"
        )
    return lines[-1]


def _subdirs(root: Path) -> list[Path]:
    try:
        return [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return []
