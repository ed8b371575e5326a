"""Handlers run in-cluster on a local node: the declop image, the Helm chart, handlers from a ConfigMap.

This is what ``declop dev --node handlers.py`` does after :class:`~declop.testing.ControlPlane`
started with a node: build (or reuse) the image from the checkout's Dockerfile, import it into
the node, and ``helm install`` the chart with the handler files as its ConfigMap — the same path
a user takes on a real cluster (README, "Deploying with Helm").

Invariants: the image tarball is reused only while every build input (Dockerfile, setup.cfg,
pyproject.toml, README.md, the lock files, declop/**) is byte-identical; it is written aside and moved into place,
so an interrupted build never leaves a tarball that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from declop.errors import ConfigError
from declop.testing.controlplane import ControlPlane
from declop.version import __version__

__all__ = ["DEV_RBAC", "handler_files", "install_operator", "operator_image_tar"]

#: A local dev cluster grants the operator everything: the handlers may touch any resource, and
#: nothing the user cares about lives there. Production RBAC comes from the chart's values.
DEV_RBAC = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
_INPUTS = (
    "Dockerfile",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "requirements/image.lock",
    "requirements/build.lock",
)


def handler_files(paths: Iterable[str]) -> list[Path]:
    """The ``*.py`` files of ``paths`` (files, or folders read one level deep), names unique."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        found = sorted(path.glob("*.py")) if path.is_dir() else [path]
        files += [f for f in found if f.is_file()]
    names = [f.name for f in files]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(
            f"two handler files are both named {', '.join(duplicated)}; a ConfigMap holds one "
            "file per name: rename one"
        )
    if not files:
        raise ConfigError("no handler files (*.py) in the given paths")
    return files


def operator_image_tar(source: Path, cache: Path) -> Path:
    """The declop image for ``source`` (a checkout) as an OCI tarball, built once per content."""
    from declop.testing.image import declop_image

    digest = hashlib.sha256()
    inputs = [source / name for name in _INPUTS] + sorted((source / "declop").rglob("*.py"))
    for path in inputs:
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    tar = cache / f"declop-{__version__}-{digest.hexdigest()[:12]}.tar"
    if not tar.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        declop_image(output=tar, source=source)
    return tar


def install_operator(
    cp: ControlPlane,
    chart: Path,
    files: Sequence[Path],
    *,
    release: str = "declop",
    namespace: str = "declop-system",
    extra_args: Sequence[str] = (),
) -> None:
    """``helm install --wait`` the chart with ``files`` as handlers and the local image."""
    values = {
        "image": {"repository": "declop", "tag": __version__, "pullPolicy": "Never"},
        "handlers": {"files": {f.name: f.read_text() for f in files}},
        "rbac": {"rules": DEV_RBAC},
        "extraArgs": list(extra_args),
    }
    path = Path(cp.tmp_dir) / "dev-values.json"
    path.write_text(json.dumps(values))
    result = subprocess.run(
        ["helm", "install", release, str(chart), "-n", namespace, "--create-namespace",
         "-f", str(path), "--wait", "--timeout", "180s"],
        env=cp.env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ConfigError(f"helm install failed: {result.stderr.strip().splitlines()[-1]}")
