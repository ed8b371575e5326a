"""``declop run``: load handler files and modules, then reconcile until stopped.

SIGTERM/SIGINT stop intake, let in-flight reconciles finish within ``--grace-period`` (the
leader Lease is renewed meanwhile and released after) and exit 0. A lost leader Lease (or a
range lost under a running reconcile) exits 1 within :data:`~declop.leases.watchdog.EXIT_BOUND`,
even with a plain handler stuck in its thread, a stuck shutdown hook or a background task that
ignores its cancellation: the manager's clean-up is bounded, and a
:class:`~declop.leases.watchdog.Watchdog` armed at the loss ends the process if anything still
holds it. No credential file is left behind: declop reads the kubeconfig itself and keeps
certificates in memory (:mod:`declop.kube.kubeconfig`).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import click

from declop.cli.exits import setup_logging, state
from declop.cli.flags import check_lease_timings, options_from, run_options
from declop.cli.help import Command, env
from declop.errors import ConfigError
from declop.kube.transport import load_configuration
from declop.leases.watchdog import EXIT_BOUND, Watchdog
from declop.loader import load
from declop.manager import Manager, Options
from declop.registry import Registry, default_registry

__all__ = ["require_registrations", "run", "run_manager"]


async def serve(configuration: Any, options: Options, stop: asyncio.Event | None = None) -> int:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    manager = Manager(configuration, default_registry, options)
    manager.on_lost = Watchdog(EXIT_BOUND).arm  # gone within the exit bound of a loss, whatever still runs
    await manager.run(stop)
    return manager.exit_code


def require_registrations(kw: dict[str, Any], registry: Registry = default_registry) -> None:
    """One line when the loaded PATHS and -m modules registered nothing."""
    if not len(registry) and not registry.webhooks:
        what = ", ".join([*kw["paths"], *(f"-m {m}" for m in kw["modules"])])
        raise ConfigError(
            f"no reconciler is registered by {what}; decorate a function with @declop.reconciler(\"pods\")"
        )


def run_manager(configuration: Any, options: Options) -> int:
    """Run the manager to its end; return the exit code (1 after a lost Lease).

    Never raises ``SystemExit``: that would skip :func:`~declop.cli.exits.exit_now`, and the
    interpreter's exit would then wait for stuck handler threads."""
    code = asyncio.run(serve(configuration, options))
    state["exit_code"] = code
    return code


@click.command(
    cls=Command,
    examples=(
        "declop run handlers.py                       # current kubeconfig context, all namespaces",
        "declop run handlers/ -n team-a -n team-b     # every .py file in handlers/, two namespaces",
        "declop run -m mypackage.handlers --context prod --log-format json",
        "DECLOP_NAMESPACES='team-a team-b' declop run handlers.py   # the same as two -n options",
    ),
)
@run_options
@click.option("--kubeconfig", type=click.Path(), default=None, envvar=env("KUBECONFIG"), help="Kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config).")
@click.option("--context", "context", default=None, envvar=env("CONTEXT"), help="Kubeconfig context to use.")
def run(**kw: Any) -> None:
    """Load handler PATHS (files or directories) and -m modules, then reconcile until stopped."""
    setup_logging(kw["log_format"], kw["verbose"], kw["quiet"])
    check_lease_timings(kw)
    if not kw["paths"] and not kw["modules"]:
        raise ConfigError("nothing to run: pass handler files (declop run handlers.py) or -m module")
    load(kw["paths"], kw["modules"])
    require_registrations(kw)
    # an @declop.on_login function is asked for the credentials instead (declop.kube.login)
    logs_in = any(h.kind == "login" for h in default_registry.hooks)
    configuration = None if logs_in else load_configuration(kw["kubeconfig"], kw["context"])
    run_manager(configuration, options_from(kw))
