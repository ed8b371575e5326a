"""Logging set-up and exit codes: the only place ``declop`` configures logging and exits.

- a :class:`~declop.errors.ConfigError` (anything the user can fix) prints one line
  ``declop: error: <what is wrong and what to do>`` on stderr and exits 1 (2 for usage errors:
  contradictory options, a malformed kubeconfig); ``-v`` adds the traceback;
- a command's own exit status (1 after a lost Lease) is :data:`state`'s ``exit_code``;
- every exit goes through :func:`exit_now`: flush the logs, then exit (``os._exit`` when stuck
  handler threads would block it, so the process is gone in time after a lost Lease).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from typing import Any, Sequence

import click

from declop.errors import ConfigError, DeclopError
from declop.logs import configure

__all__ = ["BadOptions", "main", "setup_logging", "state"]

#: ``verbose``: tracebacks on errors; ``exit_code``: the status a command ended with
state: dict[str, Any] = {"verbose": 0, "exit_code": 0}


def setup_logging(log_format: str, verbose: int, quiet: bool) -> None:
    state["verbose"] = verbose
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    configure(log_format, level)


class BadOptions(ConfigError):
    """Options that contradict each other: one line, exit 2 (a usage error)."""

    exit_code = 2


def main(group: click.Group, argv: Sequence[str] | None) -> None:
    """Run ``group`` and map errors to one line and an exit code."""
    try:
        group.main(args=list(argv) if argv is not None else None, prog_name="declop", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (ConfigError, DeclopError) as exc:
        _fail(exc)
    except KeyboardInterrupt:
        exit_now(130)
    exit_now(int(state.get("exit_code") or 0))


def _fail(exc: BaseException) -> None:
    if state["verbose"]:
        traceback.print_exception(exc, file=sys.stderr)
    click.echo(f"declop: error: {exc}", err=True)
    exit_now(int(getattr(exc, "exit_code", 1)))


def exit_now(code: int) -> None:
    """Exit now, even if a sync handler is stuck in a worker thread (past the grace period, or
    after a lost Lease): flush the logs, then exit."""
    stuck = [t for t in threading.enumerate() if t.name.startswith("declop-handler") and t.is_alive()]
    if stuck:
        logging.shutdown()  # flushes every handler
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
