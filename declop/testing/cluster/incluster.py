"""Handlers run in-cluster on a local node: the declop image, the Helm chart, handlers from a ConfigMap.

This is what ``declop dev --node handlers.py`` does after :class:`~declop.testing.ControlPlane`
started with a node: build (or reuse) declop's image from its Dockerfile, and the project's own
image ``FROM`` it when a ``Dockerfile`` sits beside the handlers (:func:`dev_images`), import them
into the node, and ``helm install`` the chart with the handler files as its ConfigMap — the same
path a user takes on a real cluster (README, "Deploying with Helm"). The Dockerfile, its build
inputs and the chart come from :mod:`declop.assets.files`: a checkout and an installed wheel work
alike.

The RBAC is a values file and nothing else, so the Pod runs with exactly the permissions a
cluster would give it: the project's ``rbac-values.yaml`` beside its handlers (what ``declop rbac
handlers.py --values rbac-values.yaml`` writes; every ``declop new`` project has one), else the
one ``declop dev --node`` generates the same way (:func:`declop.cli.dev.node_rbac`). The dev
cluster never grants everything: a permission the handlers lack shows here, not in production.

Invariants: declop's image tarball is reused only while every build input (Dockerfile, setup.cfg,
pyproject.toml, README.md, the lock files, declop/**) is byte-identical; it is written aside and moved into place,
so an interrupted build never leaves a tarball that looks finished. A project's image is rebuilt
at every start (BuildKit's layer cache makes an unchanged one take seconds).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from declop.assets import files as shipped
from declop.dev import scaffold
from declop.errors import ConfigError
from declop.testing.cluster.buildkit import BuildKit, BuiltImage, _cache_root, manifest_digest
from declop.testing.cluster.controlplane import ControlPlane
from declop.version import __version__

__all__ = [
    "RBAC_VALUES",
    "DevImages",
    "cached_declop_image",
    "dev_images",
    "handler_files",
    "install_operator",
    "project_folder",
    "project_rbac",
]

#: the chart values ``declop rbac handlers.py --values`` writes into a project (``declop new`` does)
RBAC_VALUES = scaffold.RBAC_VALUES


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


def cached_declop_image(source: Path, cache: Path, builder: BuildKit | None = None) -> BuiltImage:
    """declop's image built from ``source`` (a checkout or :func:`~declop.assets.files.image_source`'s
    tree) as an OCI tarball in ``cache``, built once per content."""
    from declop.testing.cluster.image import declop_image

    digest = hashlib.sha256()
    inputs = [source / name for name in shipped.IMAGE_FILES] + sorted((source / "declop").rglob("*.py"))
    for path in inputs:
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    tar = cache / f"declop-{__version__}-{digest.hexdigest()[:12]}.tar"
    layout = tar.with_suffix(".oci")
    if tar.is_file() and (layout / "index.json").is_file():
        return BuiltImage(f"declop:{__version__}", tar, layout, manifest_digest(layout))
    cache.mkdir(parents=True, exist_ok=True)
    return declop_image(output=tar, source=source, builder=builder)


def project_folder(paths: Iterable[str]) -> Path | None:
    """The folder of the first handler path (or that path, a folder) when it holds a
    ``Dockerfile`` — the project's own image — and is not declop's checkout; else None."""
    for raw in paths:
        path = Path(raw).resolve()
        folder = path if path.is_dir() else path.parent
        if (folder / "Dockerfile").is_file() and folder != shipped.checkout():
            return folder
        return None
    return None


def project_rbac(paths: Iterable[str]) -> Path | None:
    """The ``rbac-values.yaml`` in the folder of the first handler path (or that path, a folder),
    or None: then ``declop dev --node`` generates one (:func:`declop.cli.dev.node_rbac`)."""
    for raw in paths:
        path = Path(raw).resolve()
        folder = path if path.is_dir() else path.parent
        values = folder / RBAC_VALUES
        return values if values.is_file() else None
    return None


def _image_name(folder: Path) -> str:
    """``widget-operator`` from a folder's name: lower case, runs of other characters as ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", folder.name.lower()).strip("-") or "operator"


@dataclass(frozen=True, slots=True)
class DevImages:
    """What ``declop dev --node`` imports into the node, and which image the chart runs."""

    declop: BuiltImage
    project: BuiltImage | None

    @property
    def tars(self) -> tuple[Path, ...]:
        return tuple(i.tar for i in (self.declop, self.project) if i is not None)

    @property
    def runs(self) -> str:
        """The image the operator's Pod runs: the project's when it has one."""
        return (self.project or self.declop).name


def dev_images(paths: Sequence[str], echo: Callable[[str], None] = print) -> DevImages:
    """declop's image (cached), and the project's ``FROM`` it when :func:`project_folder` finds
    a Dockerfile (named ``<folder>:dev``, built with declop's image as the named context
    ``declop:<version>``). What must be built is built on a temporary BuildKit."""
    from declop.testing.cluster.image import build_image

    handler_files(paths)  # a bad path fails before minutes of building
    project = project_folder(paths)
    root = shipped.checkout()
    cache = root / ".declop" / "image" if root is not None else _cache_root() / "image"
    echo("Building the declop image from its Dockerfile (BuildKit; reused while declop is unchanged)…")
    with shipped.image_source() as source:
        base = cached_declop_image(source, cache)
    if project is None:
        return DevImages(base, None)
    name = f"{_image_name(project)}:dev"
    echo(f"Building {name} from {project / 'Dockerfile'} FROM {base.name}…")
    output = _cache_root() / "images" / f"{_image_name(project)}.tar"
    return DevImages(base, build_image(project, name, output=output, contexts={base.name: base}))


def install_operator(
    cp: ControlPlane,
    chart: Path,
    files: Sequence[Path],
    *,
    rbac_values: Path,
    release: str = "declop",
    namespace: str = "declop-system",
    extra_args: Sequence[str] = (),
    image: str = f"declop:{__version__}",
) -> None:
    """``helm install --wait`` the chart with ``files`` as handlers and the local ``image``
    (``repository:tag``, imported into the node); its RBAC is the values file ``rbac_values``
    (what ``declop rbac --values`` writes) and nothing else."""
    repository, _, tag = image.rpartition(":")
    values: dict[str, object] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "handlers": {"files": {f.name: f.read_text() for f in files}},
        "extraArgs": list(extra_args),
    }
    path = Path(cp.tmp_dir) / "dev-values.json"
    path.write_text(json.dumps(values))
    rbac = ["-f", str(rbac_values)]
    result = subprocess.run(
        ["helm", "install", release, str(chart), "-n", namespace, "--create-namespace",
         *rbac, "-f", str(path), "--wait", "--timeout", "180s"],
        env=cp.env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ConfigError(f"helm install failed: {result.stderr.strip().splitlines()[-1]}")
