"""Shared fixtures of the integration tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Mark a test whose body failed (``item.declop_failed``), so a fixture can add what only it
    knows — e.g. the operator processes' logs — to the report while it tears down."""
    report = yield
    if report.when == "call" and report.failed:
        item.declop_failed = True  # type: ignore[attr-defined]
    return report
