"""declop.cli: option parsing into manager Options (no cluster: the manager is not started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from declop import cli
from declop.manager import Options


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[Options], Path]:
    seen: list[Options] = []
    monkeypatch.setattr(cli, "_run_manager", lambda configuration, options: seen.append(options))
    monkeypatch.setattr(cli, "load_configuration", lambda *a, **kw: object())
    monkeypatch.setattr(cli, "_setup_logging", lambda *a: None)
    monkeypatch.setattr(cli, "load", lambda paths, modules: None)
    monkeypatch.setattr(cli, "_require_registrations", lambda kw: None)
    handlers = tmp_path / "h.py"
    handlers.write_text("")
    return seen, handlers


@pytest.mark.parametrize(
    ("args", "env", "mode"),
    [
        ((), {}, "auto"),
        (("--list-mode", "paged"), {}, "paged"),
        (("--list-mode=stream",), {}, "stream"),
        ((), {"DECLOP_LIST_MODE": "paged"}, "paged"),
    ],
)
def test_list_mode_from_flag_or_environment(
    captured: tuple[list[Options], Path], args: tuple[str, ...], env: dict[str, str], mode: str
) -> None:
    seen, handlers = captured
    result = CliRunner().invoke(cli.cli, ["run", str(handlers), *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen[-1].list_mode == mode


def test_unknown_list_mode_is_one_clear_error(captured: tuple[list[Options], Path]) -> None:
    _, handlers = captured
    result: Any = CliRunner().invoke(cli.cli, ["run", str(handlers), "--list-mode", "fast"])
    assert result.exit_code == 2
    assert "Invalid value for '--list-mode': 'fast' is not one of 'auto', 'stream', 'paged'." in result.output
