"""What declop ships to run an operator in-cluster from an install, not only from a clone: the Helm
chart, the image's Dockerfile with what it builds declop from, and the local node's build.

``declop dev --node`` needs all three: the node's binaries (kubelet, kube-proxy, kube-scheduler,
BuildKit, pause) come from :func:`node_build_script`, declop's image ``declop:<version>`` from the
Dockerfile in :func:`image_source`, and the operator's Pod from the chart in :func:`chart_dir`.

Where they are:

- in a checkout, ``declop/assets/chart`` links to ``charts/declop``, ``declop/assets/node`` to
  ``tools/node``, and ``declop/assets/image/*`` to the root's ``Dockerfile``, ``setup.cfg``,
  ``pyproject.toml``, ``README.md`` and ``requirements/``: one copy of each file, edited where it
  always was;
- in the sdist and the wheel they are files (package data, ``setup.cfg``), so an installed declop
  finds them inside its own package, exactly where a checkout's links are.

How declop's image is built from an install: the Dockerfile builds declop's wheel from a source
tree (``COPY pyproject.toml setup.cfg README.md declop/``). :func:`image_source` gives it one:
the checkout itself, or, installed, a staged copy of the installed package (``__pycache__`` left
out) beside the shipped Dockerfile, lock files and build metadata — the same files the installed
wheel was built from, so the image runs the declop the user has. Its Python dependencies still
come only from the hash-pinned lock files.

Invariants:

- every path returned is inside the imported ``declop`` package (or, for a checkout, the file a
  link there points to), whatever the current directory;
- :func:`image_source` never writes into the installed package or the checkout; a staged tree is
  removed when its ``with`` block ends;
- a missing file (a broken install) is a one-line :class:`~declop.errors.ConfigError` that says
  to reinstall declop.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from declop.errors import ConfigError, DeclopError

__all__ = [
    "CHART_FILES",
    "build_node",
    "IMAGE_FILES",
    "NODE_FILES",
    "chart_dir",
    "checkout",
    "image_source",
    "node_build_script",
    "package_dir",
    "required_files",
]

#: what ``helm install`` needs of the chart (its templates are read as a folder)
CHART_FILES = ("Chart.yaml", "values.yaml", "values.schema.json", "templates/deployment.yaml")
#: what the Dockerfile builds declop's image from, besides the package (paths as in a checkout)
IMAGE_FILES = (
    "Dockerfile",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "requirements/image.lock",
    "requirements/build.lock",
)
#: the node's build: the script, the wrapper Go modules it builds from, the sandbox's source
NODE_FILES = ("build.sh", "go.mod", "go.sum", "pause.c", "buildkit/go.mod", "buildkit/go.sum")
_STAGED_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def package_dir() -> Path:
    """The folder of the imported ``declop`` package."""
    return Path(__file__).resolve().parents[1]


def _assets() -> Path:
    return Path(__file__).resolve().parent


def checkout() -> Path | None:
    """The source checkout declop is imported from (an editable install, PYTHONPATH), else None."""
    root = package_dir().parent
    if (root / "setup.cfg").is_file() and (root / "Dockerfile").is_file():
        return root
    return None


def _require(folder: Path, names: tuple[str, ...], what: str) -> Path:
    lacking = [n for n in names if not (folder / n).is_file()]
    if lacking:
        raise ConfigError(
            f"declop's {what} is incomplete ({folder} lacks {', '.join(lacking)}); reinstall declop"
        )
    return folder


def chart_dir() -> Path:
    """declop's Helm chart (``charts/declop`` in a checkout), for ``helm install``."""
    return _require((_assets() / "chart").resolve(), CHART_FILES, "Helm chart")


def node_build_script() -> Path:
    """The local node's build script (``tools/node/build.sh`` in a checkout); run it with bash."""
    return _require((_assets() / "node").resolve(), NODE_FILES, "node build") / "build.sh"


def build_node(*, stderr: IO[str] | None = None) -> str:
    """Run :func:`node_build_script` (``declop assets build --node``): build the node's binaries
    once (or find them built) and return their folder. Its progress goes to ``stderr``.

    Raises:
        DeclopError: the script failed (not root for a missing Debian package, no Go, a build
            error); its lines above say why.
    """
    err = stderr if stderr is not None else sys.stderr
    script = node_build_script()
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stderr:  # progress as it happens; stdout is one line, it cannot fill its pipe
        err.write(line)
        err.flush()
    lines = proc.stdout.read().strip().splitlines()
    returncode = proc.wait()
    if returncode != 0 or not lines:
        raise DeclopError(f"building the node's binaries failed ({script} exited {returncode}); its lines above say why")
    return lines[-1]


def required_files() -> dict[str, Path]:
    """Every file ``declop dev --node`` reads from declop itself, by what it is (for checks)."""
    image = _assets() / "image"
    found = {f"chart/{n}": _assets() / "chart" / n for n in CHART_FILES}
    found |= {f"image/{n}": image / n for n in IMAGE_FILES}
    found |= {f"node/{n}": _assets() / "node" / n for n in NODE_FILES}
    return found


@contextmanager
def image_source() -> Iterator[Path]:
    """A folder the Dockerfile builds ``declop:<version>`` from (see the module docstring).

    Yields the checkout when declop runs from one; otherwise a temporary tree holding the
    shipped :data:`IMAGE_FILES` and a copy of the installed package, removed afterwards.
    """
    root = checkout()
    if root is not None:
        yield root
        return
    image = _require(_assets() / "image", IMAGE_FILES, "image build")
    with tempfile.TemporaryDirectory(prefix="declop-image-source-") as work:
        staged = Path(work)
        for name in IMAGE_FILES:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image / name, staged / name)
        shutil.copytree(package_dir(), staged / "declop", ignore=_STAGED_IGNORE, symlinks=False)
        yield staged
