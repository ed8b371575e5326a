"""declop.cli: option parsing into manager Options (no cluster: the manager is not started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from declop import cli
from declop.cli import dev as dev_command, run as run_command
from declop.errors import ConfigError
from declop.manager import Options


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[Options], Path]:
    seen: list[Options] = []
    monkeypatch.setattr(run_command, "run_manager", lambda configuration, options: seen.append(options))
    monkeypatch.setattr(run_command, "load_configuration", lambda *a, **kw: object())
    monkeypatch.setattr(run_command, "setup_logging", lambda *a: None)
    monkeypatch.setattr(run_command, "load", lambda paths, modules: None)
    monkeypatch.setattr(run_command, "require_registrations", lambda kw: None)
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


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, None),
        (("--webhook-max-body-mib", "12"), {}, 12 * 1024 * 1024),
        ((), {"DECLOP_WEBHOOK_MAX_BODY_MIB": "0.5"}, 512 * 1024),
    ],
)
def test_webhook_max_body_from_flag_or_environment(
    captured: tuple[list[Options], Path], args: tuple[str, ...], env: dict[str, str], expected: int | None
) -> None:
    seen, handlers = captured
    result = CliRunner().invoke(cli.cli, ["run", str(handlers), *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen[-1].webhook_max_body == expected


def test_a_webhook_body_limit_out_of_range_is_one_clear_error(captured: tuple[list[Options], Path]) -> None:
    _, handlers = captured
    result: Any = CliRunner().invoke(cli.cli, ["run", str(handlers), "--webhook-max-body-mib", "500"])
    assert result.exit_code == 2 and "Invalid value for '--webhook-max-body-mib'" in result.output


# -- declop dev: what is refused before a control plane starts ---------------------------------


@pytest.fixture()
def no_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    import declop.testing.cluster.controlplane as controlplane

    def refuse(*a: Any, **kw: Any) -> None:
        raise AssertionError("no control plane may start for a refused command")

    monkeypatch.setattr(controlplane, "ControlPlane", refuse)
    monkeypatch.setattr(dev_command, "setup_logging", lambda *a: None)


def test_dev_refuses_reload_with_node(no_control_plane: None, tmp_path: Path) -> None:
    result: Any = CliRunner().invoke(cli.cli, ["dev", "--node", "--reload", str(tmp_path / "h.py")], standalone_mode=False)
    assert isinstance(result.exception, ConfigError) and getattr(result.exception, "exit_code", 1) == 2
    assert str(result.exception) == "--reload restarts handlers in this process; with --node they run in-cluster: drop --reload (or --node)"


def test_dev_names_a_missing_manifest_before_starting(no_control_plane: None, tmp_path: Path) -> None:
    handlers = tmp_path / "h.py"
    handlers.write_text("")
    result: Any = CliRunner().invoke(cli.cli, ["dev", str(handlers), "-f", str(tmp_path / "crd.yaml")], standalone_mode=False)
    assert str(result.exception) == f"no such file: {tmp_path / 'crd.yaml'}; -f takes a YAML file or a folder of them"


def test_dev_names_a_missing_handler_file_before_starting_even_with_reload(no_control_plane: None, tmp_path: Path) -> None:
    result: Any = CliRunner().invoke(cli.cli, ["dev", str(tmp_path / "handlers.py")], standalone_mode=False)
    assert str(result.exception).startswith(f"no such file: {tmp_path / 'handlers.py'}")


def test_dev_without_watchfiles_says_what_to_install(no_control_plane: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "watchfiles" else real(name, *a))
    handlers = tmp_path / "h.py"
    handlers.write_text("")
    result: Any = CliRunner().invoke(cli.cli, ["dev", str(handlers)], standalone_mode=False)
    assert str(result.exception) == (
        "declop dev restarts the operator on save with the watchfiles package, which is not installed: "
        "pip install 'declop[dev]' (or pass --no-reload)"
    )


def test_dev_names_a_missing_module_before_starting(no_control_plane: None) -> None:
    result: Any = CliRunner().invoke(cli.cli, ["dev", "-m", "no_such_pkg.handlers"], standalone_mode=False)
    assert str(result.exception) == "no module named 'no_such_pkg.handlers'; is it installed or on PYTHONPATH?"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--clean"], "--clean removes what a killed local node left: give it with --node (declop dev --node --clean)"),
        (["--node", "--clean", "h.py"], "--clean only cleans up and starts nothing: drop PATHS, -m and -f"),
    ],
)
def test_dev_clean_is_refused_beside_what_it_does_not_do(no_control_plane: None, args: list[str], line: str) -> None:
    result: Any = CliRunner().invoke(cli.cli, ["dev", *args], standalone_mode=False)
    assert isinstance(result.exception, ConfigError) and getattr(result.exception, "exit_code", 1) == 2
    assert str(result.exception) == line


def test_dev_clean_without_root_says_so(no_control_plane: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev_command.os, "geteuid", lambda: 1000)
    result: Any = CliRunner().invoke(cli.cli, ["dev", "--node", "--clean"], standalone_mode=False)
    assert str(result.exception).startswith("cleaning up after a local node needs root")


def test_dev_clean_only_cleans_up_and_says_when_there_was_nothing(no_control_plane: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from declop.testing.cluster import recovery

    calls: list[object] = []
    monkeypatch.setattr(dev_command.os, "geteuid", lambda: 0)
    monkeypatch.setattr(recovery, "recover", lambda echo: calls.append(echo) or 0)
    result: Any = CliRunner().invoke(cli.cli, ["dev", "--node", "--clean"])
    assert result.exit_code == 0 and len(calls) == 1  # no control plane (the fixture refuses one)
    assert result.output == "Nothing to clean up: no killed declop node left anything on this host.\n"


def test_run_with_an_on_login_function_reads_no_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An @declop.on_login function replaces the kubeconfig: `declop run` does not look for one
    (the manager asks the function at start), without one it does."""
    from declop import registry as registry_package
    from declop.registry import Registry

    configurations: list[Any] = []
    monkeypatch.setattr(run_command, "run_manager", lambda configuration, options: configurations.append(configuration))
    monkeypatch.setattr(run_command, "setup_logging", lambda *a: None)
    monkeypatch.setattr(run_command, "load", lambda paths, modules: None)
    monkeypatch.setattr(run_command, "require_registrations", lambda kw: None)
    monkeypatch.setattr(run_command, "load_configuration", lambda *a, **kw: "from the kubeconfig")
    handlers = tmp_path / "h.py"
    handlers.write_text("")
    for logs_in in (False, True):
        registry = Registry()
        if logs_in:
            registry.hook("login", lambda: {"server": "https://k8s:6443", "token": "t"})
        monkeypatch.setattr(registry_package, "default_registry", registry)
        monkeypatch.setattr(run_command, "default_registry", registry)
        result = CliRunner().invoke(cli.cli, ["run", str(handlers)])
        assert result.exit_code == 0, result.output
    assert configurations == ["from the kubeconfig", None]
