"""Fixtures for tests on a real node (``ControlPlane(node=True)``): marked ``node``, run serially.

They need root and the node's Debian packages and binaries (``tools/node/build.sh``); without
them the fixtures *fail* with the one-line ``ConfigError`` that says what is missing — they never
skip. ``make test-fast`` leaves them out (``-m "not node"``).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from declop.testing import ControlPlane
from declop.testing.cluster.image import BuildKit, BuiltImage, build_image, declop_image
from declop.testing.cluster.host import HOST_PATHS, SYSCTLS, cgroup_hierarchies
from declop.testing.cluster.runrecord import RECORDS_DIR

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)


@pytest.fixture(scope="module")
def builder() -> Iterator[BuildKit]:
    """One BuildKit daemon for the images of a module (it holds BuildKit's state lock)."""
    with BuildKit() as kit:
        yield kit


@pytest.fixture(scope="module")
def declop_image_built(builder: BuildKit, tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    """The repository's Dockerfile, built as ``make image`` builds it."""
    return declop_image(output=tmp_path_factory.mktemp("image") / "declop.tar", builder=builder)


@pytest.fixture(scope="module")
def operator_image(
    builder: BuildKit, declop_image_built: BuiltImage, tmp_path_factory: pytest.TempPathFactory
) -> BuiltImage:
    """README's second deployment mode: an image ``FROM`` the declop image, handlers baked in."""
    context = tmp_path_factory.mktemp("operator")
    (context / "pods.py").write_text((ROOT / "examples" / "pods.py").read_text())
    (context / "Dockerfile").write_text(
        f"FROM {declop_image_built.name}\nCOPY pods.py /app/handlers/pods.py\n"
    )
    return build_image(
        context,
        "pods-operator:1",
        output=context / "pods-operator.tar",
        contexts={declop_image_built.name: declop_image_built},
        builder=builder,
    )


@pytest.fixture(scope="module")
def cluster(declop_image_built: BuiltImage, operator_image: BuiltImage) -> Iterator[ControlPlane]:
    """A control plane with a real node, both images imported. One per module."""
    with ControlPlane(node=True) as cp:
        assert cp.node is not None
        cp.node.import_image(declop_image_built.tar)
        cp.node.import_image(operator_image.tar)
        yield cp


def _host_snapshot() -> dict[str, object]:
    """The host state a node touches, read with the usual tools (not with Node's own record)."""
    return {
        "iptables": sorted(
            line
            for tool in ("iptables-save", "ip6tables-save")
            for line in subprocess.run([tool], capture_output=True, text=True, check=False).stdout.splitlines()
            if not line.startswith("#")
        ),
        "nft tables": subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout,
        "links": sorted(p.name for p in Path("/sys/class/net").iterdir()),
        "sysctls": {name: Path("/proc/sys", name).read_text() for name in SYSCTLS},
        "paths": {path: os.path.lexists(path) for path in HOST_PATHS},
        "mounts": Path("/proc/self/mountinfo").read_text().count("\n"),
        "node processes": sorted(_node_processes()),
        "node folders": sorted(str(p) for p in Path(tempfile.gettempdir()).glob("declop-node-*")),
        "cgroups": sorted(str(c) for h in cgroup_hierarchies() for c in h.glob("declop-*")),
        "run records": sorted(p.name for p in RECORDS_DIR.glob("*")) if RECORDS_DIR.is_dir() else [],
    }


def _node_processes() -> list[str]:
    """Command lines naming a node's private folder (containerd, its shims, kubelet…)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "/declop-node-" in argv and entry.name != str(os.getpid()):
            found.append(argv)
    return found


@pytest.fixture
def host_snapshot() -> Callable[[], dict[str, object]]:
    """A function returning what the host looks like where a node changes it."""
    return _host_snapshot
