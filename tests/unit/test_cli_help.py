"""declop.cli's help: every DECLOP_* variable listed, examples that parse, summaries never cut.

The variables come from the options' own ``envvar`` (no hand-kept list), so these tests walk
every command of the group, whatever other commands are added later.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from declop import cli

WIDTHS = (40, 80, 200)


def commands(group: click.Group = cli.cli, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every (sub)command, with the words that reach it: ("run",), ("assets", "build"), …"""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))


def help_text(args: list[str], width: int = 80) -> str:
    result = CliRunner().invoke(cli.cli, [*args, "--help"], terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


def envvars(cmd: click.Command) -> list[str]:
    names: list[str] = []
    for param in cmd.params:
        if isinstance(param.envvar, str):
            names.append(param.envvar)
        elif param.envvar:
            names.extend(param.envvar)
    return names


@pytest.mark.parametrize("width", WIDTHS)
def test_every_command_help_lists_every_environment_variable_its_options_read(width: int) -> None:
    seen = 0
    for words, cmd in commands():
        text = help_text(list(words), width)
        section = text.split("Environment variables", 1)[-1] if envvars(cmd) else ""
        for name in envvars(cmd):
            assert re.search(rf"^\s+{re.escape(name)}\b", section, re.M), f"declop {' '.join(words)} --help lacks {name}:\n{text}"
            seen += 1
    assert seen >= 25  # run's and dev's options at least


def test_every_option_of_run_reads_a_declop_variable() -> None:
    """The README and the chart rely on it: each option of `declop run` has its DECLOP_* twin."""
    run = cli.cli.get_command(click.Context(cli.cli), "run")
    assert run is not None
    missing = [p.name for p in run.params if not p.envvar and p.name != "help"]
    assert missing == []
    assert all(name.startswith("DECLOP_") for name in envvars(run))


def test_a_multiple_option_from_its_variable_splits_on_spaces() -> None:
    """What the help says of DECLOP_NAMESPACES ("several: separated by spaces") is what click does."""
    run = cli.cli.get_command(click.Context(cli.cli), "run")
    assert run is not None
    ctx = run.make_context("run", ["h.py"], obj=None)
    assert ctx.params["namespaces"] == ()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DECLOP_NAMESPACES", "team-a team-b")
        ctx = run.make_context("run", ["h.py"])
    assert ctx.params["namespaces"] == ("team-a", "team-b")
    assert "-n/--namespace (several: separated by spaces)" in " ".join(help_text(["run"], 200).split())


@pytest.mark.parametrize("command", ["run", "dev", "sim"])
def test_run_and_dev_help_have_examples_that_parse(command: str) -> None:
    text = help_text([command], 200)
    examples = text.split("Examples:", 1)[1].strip().splitlines()
    assert len(examples) >= 3
    for line in examples:
        words = shlex.split(line, comments=True)
        while words and (words[0] in ("sudo", "-E") or re.match(r"^[A-Z_]+=", words[0])):
            words.pop(0)  # sudo -E, VAR=value prefixes
        assert words[:2] == ["declop", command], line
        sub = cli.cli.get_command(click.Context(cli.cli), command)
        assert sub is not None
        sub.make_context(command, words[2:])  # raises click.UsageError on an unknown option


@pytest.mark.parametrize("width", WIDTHS)
def test_declop_help_shows_each_commands_whole_first_paragraph(width: int) -> None:
    """click's default cuts a summary at ~45 characters with "..." and at the first ". " (so
    "e.g. Widget" was lost); the listing must carry the docstring's whole first paragraph."""
    text = help_text([], width)
    listing = " ".join(text.split("Commands:", 1)[1].split())
    assert "..." not in listing
    for words, cmd in commands():
        if len(words) > 1:
            continue
        summary = cmd.short_help or " ".join((cmd.help or "").strip().split("\n\n")[0].split())
        assert summary
        # click's wrapping may break a hyphenated word at its hyphen: compare without spaces
        assert summary.replace(" ", "") in listing.replace(" ", ""), f"{words[0]}: {summary!r} not in {listing!r}"
