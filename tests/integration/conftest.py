"""Shared fixtures of the integration tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

NODE_BUILD = Path(__file__).resolve().parents[2] / "tools" / "node" / "build.sh"


@pytest.fixture(scope="session")
def node_assets() -> Path:
    """The folder tools/node/build.sh prints (building the node's binaries if needed)."""
    result = subprocess.run(
        [str(NODE_BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])
