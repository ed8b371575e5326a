"""How ``declop --help`` and each command's help read: the ``DECLOP_*`` variables listed from the
options themselves, verbatim examples, and each command's whole first paragraph in the listing."""

from __future__ import annotations

from typing import Any, Sequence

import click

__all__ = ["Command", "Group", "env"]


def env(name: str) -> str:
    """The environment variable of an option: ``DECLOP_<NAME>``."""
    return f"DECLOP_{name}"


class Command(click.Command):
    """A command whose help ends with the environment variables it reads and its examples.

    The variables are listed from the parameters themselves (their ``envvar``), so the list
    cannot drift from the options; ``examples`` are shown verbatim, one command per line."""

    def __init__(self, *args: Any, examples: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.examples = tuple(examples)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
            what = "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
            if isinstance(param, click.Option) and param.secondary_opts:
                what += "/" + "/".join(param.secondary_opts)
            if param.multiple or (isinstance(param, click.Argument) and param.nargs == -1):
                what += " (several: separated by spaces)"
            elif isinstance(param, click.Option) and (param.is_flag or param.type is click.BOOL) and not param.count:
                what += " (true or false)"
            rows.extend((name, what) for name in names)
        if rows:
            with formatter.section("Environment variables (each sets the option it names)"):
                formatter.write_dl(rows)
        if self.examples:
            with formatter.section("Examples"):
                for line in self.examples:  # verbatim: click would re-wrap a paragraph
                    formatter.write(f"{'':{formatter.current_indent}}{line}\n")
        super().format_epilog(ctx, formatter)


class Group(click.Group):
    """The ``declop`` group: its commands are :class:`Command` (sub-groups are ``Group``), and
    ``declop --help`` shows each command's whole first paragraph, wrapped: never cut with "...",
    nor at a period inside it ("e.g.")."""

    command_class = Command
    group_class = type  # sub-groups are Group too

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                first = (cmd.help or "").strip().split("\n\n")[0].replace("\b", "")
                rows.append((name, cmd.short_help or " ".join(first.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
