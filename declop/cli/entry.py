"""The ``declop`` group: every command of its own module, and the console entry point.

Every option also reads a ``DECLOP_*`` environment variable (named next to it in ``--help``).
"""

from __future__ import annotations

from typing import Sequence

import click

from declop.cli import exits
from declop.cli.assets_command import assets
from declop.cli.crd import crd
from declop.cli.dev import dev
from declop.cli.help import Group
from declop.cli.new import new
from declop.cli.rbac import rbac
from declop.cli.run import run
from declop.cli.sim import sim
from declop.version import __version__

__all__ = ["cli", "main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="declop")
def cli() -> None:
    """declop: level-triggered Kubernetes operators in plain Python."""


for _command in (run, dev, crd, sim, rbac, new, assets):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: run the click group and map errors to one line + exit code."""
    exits.main(cli, argv)
