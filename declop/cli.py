"""The ``declop`` command: ``run`` handlers against a cluster, or ``dev`` against a local control plane.

This is the only module that configures logging and turns errors into exit codes:

- a :class:`~declop.errors.ConfigError` (anything the user can fix) prints one line
  ``declop: error: <what is wrong and what to do>`` on stderr and exits 1 (2 for usage errors:
  contradictory options, a malformed kubeconfig); ``-v`` adds the traceback;
- SIGTERM/SIGINT stop intake, let in-flight reconciles finish within ``--grace-period`` (the
  leader Lease is renewed meanwhile and released after) and exit 0;
- a lost leader Lease (or a range lost under a running reconcile) exits 1 within 2 s, even with
  a plain handler stuck in its thread, a stuck shutdown hook or a background task that ignores
  its cancellation: the manager's clean-up is bounded, and a :class:`~declop.leases.watchdog.Watchdog`
  armed at the loss ends the process with ``os._exit`` if anything still holds it;
- every exit goes through :func:`_exit`: flush the logs, then exit (``os._exit`` when stuck
  handler threads would block it). No credential file exists to be left behind: declop reads
  the kubeconfig itself and keeps certificates in memory (:mod:`declop.kube.kubeconfig`).

Every option also reads a ``DECLOP_*`` environment variable (named next to it in ``--help``).
"""

# size: one piece: the click command tree (run, dev, crd, new, assets), the flag-to-Options checks and
# the one exit path; the option decorators and their ``DECLOP_*`` variables must sit on the
# commands, and logging and exit codes are configured nowhere else.

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, Sequence

import click

from declop.version import __version__
from declop.leases.watchdog import EXIT_BOUND, Watchdog
from declop.errors import ConfigError, DeclopError
from declop.loader import expand, load
from declop.logs import configure
from declop.manager import Manager, Options
from declop.registry import default_registry
from declop.kube.transport import load_configuration

if TYPE_CHECKING:
    # `declop run` never needs these: the dev loop and the CRD generator load pydantic and YAML
    # (~8 MiB of a run's baseline), so the commands that use them import them when they run
    from declop.dev.loop import Sources

__all__ = ["main"]

log = logging.getLogger("declop.cli")

_state: dict[str, Any] = {"verbose": 0, "exit_code": 0}


def _env(name: str) -> str:
    return f"DECLOP_{name}"


class _Command(click.Command):
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


class _Group(click.Group):
    """The ``declop`` group: its commands are :class:`_Command` (sub-groups are ``_Group``), and
    ``declop --help`` shows each command's whole first paragraph, wrapped: never cut with "...",
    nor at a period inside it ("e.g.")."""

    command_class = _Command
    group_class = type  # sub-groups are _Group too

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


def _common_run_options(fn: Any) -> Any:
    options = [
        click.argument("paths", nargs=-1, type=click.Path(), envvar=_env("PATHS")),
        click.option("-m", "--module", "modules", multiple=True, envvar=_env("MODULES"), help="Import handlers from a module (repeatable)."),
        click.option("-n", "--namespace", "namespaces", multiple=True, envvar=_env("NAMESPACES"), help="Watch only this namespace (repeatable)."),
        click.option("-A", "--all-namespaces", is_flag=True, envvar=_env("ALL_NAMESPACES"), help="Watch all namespaces (the default)."),
        click.option("--log-format", type=click.Choice(["plain", "json"]), default="plain", show_default=True, envvar=_env("LOG_FORMAT")),
        click.option("-v", "--verbose", count=True, envvar=_env("VERBOSE"), help="More logs; tracebacks on errors."),
        click.option("-q", "--quiet", is_flag=True, envvar=_env("QUIET"), help="Only warnings and errors."),
        click.option("--grace-period", type=float, default=30.0, show_default=True, envvar=_env("GRACE_PERIOD"), help="Seconds in-flight reconciles get on shutdown."),
        click.option("--health-port", type=int, default=None, envvar=_env("HEALTH_PORT"), help="Serve /healthz and /readyz on this port."),
        click.option("--metrics-port", type=int, default=None, envvar=_env("METRICS_PORT"), help="Serve /metrics on this port."),
        click.option("--bind-address", default=None, envvar=_env("BIND_ADDRESS"), help="Address the probe, metrics and webhook servers listen on (default: 0.0.0.0; 127.0.0.1 under 'declop dev')."),
        click.option("--metrics-secure", "metrics_secure", type=click.BOOL, default=None, envvar=_env("METRICS_SECURE"), help="Serve /metrics over HTTPS, only to callers allowed 'get' on it (TokenReview + SubjectAccessReview); =false for plain HTTP. Default: true for run, false for dev (local use)."),
        click.option("--metrics-cert-dir", default=None, type=click.Path(), envvar=_env("METRICS_CERT_DIR"), help="Directory with tls.crt and tls.key for /metrics (default: self-signed, in memory)."),
        click.option("--leader-elect/--no-leader-elect", default=False, envvar=_env("LEADER_ELECT"), help="Reconcile only while holding a Lease."),
        click.option("--leader-election-id", default="declop", envvar=_env("LEADER_ELECTION_ID"), show_default=True),
        click.option("--leader-election-namespace", default=None, envvar=_env("LEADER_ELECTION_NAMESPACE")),
        click.option("--lease-duration", type=float, default=15.0, show_default=True, envvar=_env("LEASE_DURATION"), help="Seconds a standby waits before taking an unrenewed Lease."),
        click.option("--renew-deadline", type=float, default=10.0, show_default=True, envvar=_env("RENEW_DEADLINE"), help="Seconds the leader keeps trying to renew before it gives up."),
        click.option("--retry-period", type=float, default=2.0, show_default=True, envvar=_env("RETRY_PERIOD"), help="Seconds between Lease attempts."),
        click.option("--shards", type=int, default=None, envvar=_env("SHARDS"), help="Split each controller's objects into N hash ranges, one Lease each; replicas share the ranges (replaces --leader-elect; docs/sharding.md)."),
        click.option("--qps", type=float, default=20.0, show_default=True, envvar=_env("QPS"), help="Client-side limit on API requests per second."),
        click.option("--burst", type=int, default=30, show_default=True, envvar=_env("BURST"), help="Requests allowed above --qps in a burst."),
        click.option("--debug-reconciles", type=click.IntRange(min=0), default=0, show_default=True, envvar=_env("DEBUG_RECONCILES"), help="Keep the last N reconciles per controller (trigger, duration, outcome) and serve them on /debug/reconciles on the health port; 0: off."),
        click.option("--webhook-port", type=int, default=9443, show_default=True, envvar=_env("WEBHOOK_PORT"), help="HTTPS port of the admission/conversion webhook server (only when webhooks are registered)."),
        click.option("--webhook-cert-dir", default=None, type=click.Path(), envvar=_env("WEBHOOK_CERT_DIR"), help="Directory with tls.crt, tls.key (and ca.crt) for webhooks, reloaded when they change (default: declop's CA, kept in a Secret)."),
        click.option("--webhook-service", default=None, envvar=_env("WEBHOOK_SERVICE"), help="NAMESPACE/NAME[:PORT] of the Service the apiserver calls webhooks through (in-cluster)."),
        click.option("--webhook-url", default=None, envvar=_env("WEBHOOK_URL"), help="Base URL the apiserver calls webhooks at when there is no --webhook-service (default: https://127.0.0.1:PORT)."),
        click.option("--webhook-name", default="declop", show_default=True, envvar=_env("WEBHOOK_NAME"), help="Name of the webhook configurations; the CA Secret is NAME-webhook-ca."),
        click.option("--webhook-namespace", default=None, envvar=_env("WEBHOOK_NAMESPACE"), help="The operator's namespace: keeps the CA Secret, excluded from admission (default: the Service's, else the Pod's; out of a cluster none is excluded)."),
        click.option("--webhook-cert-validity", type=float, default=365 * 86400.0, envvar=_env("WEBHOOK_CERT_VALIDITY"), help="Seconds a generated webhook serving certificate is valid; renewed after two thirds."),
        click.option("--webhook-max-body-mib", type=click.FloatRange(min=0.0625, max=64), default=None, envvar=_env("WEBHOOK_MAX_BODY_MIB"), help="MiB a webhook request body may have (default: 7 for admission, 8 for conversion). One such body is decoded at a time and costs about 5x its size in memory: raise the memory limit with it."),
        click.option("--check-permissions/--no-check-permissions", "check_permissions", default=True, envvar=_env("CHECK_PERMISSIONS"), help="At start, ask the apiserver (SelfSubjectAccessReview) for every permission the handlers need and stop, naming each missing one, before informers start (docs/rbac.md)."),
        click.option("--list-mode", type=click.Choice(["auto", "stream", "paged"]), default="auto", show_default=True, envvar=_env("LIST_MODE"), help="How informers sync: streaming list with fallback to paginated LIST (auto), or force one."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _setup_logging(log_format: str, verbose: int, quiet: bool) -> None:
    _state["verbose"] = verbose
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    configure(log_format, level)


class _BadOptions(ConfigError):
    """Options that contradict each other: one line, exit 2 (a usage error)."""

    exit_code = 2


#: --shards above this is refused: one Lease write per range per retry period, one LIST of them all
MAX_SHARDS = 1024


def _check_shards(kw: dict[str, Any]) -> None:
    """--shards: a positive count, never with --leader-elect."""
    shards = kw.get("shards")
    if shards is None:
        return
    if shards < 1:
        raise _BadOptions(f"--shards must be 1 or more (the number of hash ranges, e.g. 16), got {shards}")
    if shards > MAX_SHARDS:
        raise _BadOptions(
            f"--shards {shards} is more than {MAX_SHARDS}: each range is a Lease renewed every --retry-period by its "
            f"holder ({shards / 2:.0f} writes/s per controller at the default 2 s); use at most {MAX_SHARDS} "
            "(16-64 is typical: a few ranges per replica)"
        )
    if kw["leader_elect"]:
        raise _BadOptions(
            "--shards replaces --leader-elect: every replica reconciles its own ranges, each guarded by a Lease "
            "of its own; drop --leader-elect (see docs/sharding.md)"
        )


def _check_lease_timings(kw: dict[str, Any]) -> None:
    """client-go's rule, checked before anything connects: duration > deadline > 1.2 × retry."""
    _check_shards(kw)
    if not kw["leader_elect"] and not kw.get("shards"):
        return
    duration, deadline, retry = kw["lease_duration"], kw["renew_deadline"], kw["retry_period"]
    if not (duration > deadline > 1.2 * retry and retry > 0):
        raise _BadOptions(
            f"--lease-duration ({duration:g}) must be greater than --renew-deadline ({deadline:g}), which must be "
            f"greater than 1.2 × --retry-period ({retry:g} → {1.2 * retry:g}), which must be > 0; "
            "the defaults are 15, 10 and 2"
        )


def _options(kw: dict[str, Any], *, secure_by_default: bool = True) -> Options:
    namespaces = () if kw["all_namespaces"] else tuple(dict.fromkeys(n for n in kw["namespaces"] if n))
    return Options(
        namespaces=namespaces,
        grace_period=kw["grace_period"],
        health_port=kw["health_port"],
        metrics_port=kw["metrics_port"],
        bind_address=kw.get("bind_address") or None,
        metrics_secure=secure_by_default if kw["metrics_secure"] is None else kw["metrics_secure"],
        metrics_cert_dir=kw["metrics_cert_dir"],
        leader_elect=kw["leader_elect"],
        leader_election_id=kw["leader_election_id"],
        leader_election_namespace=kw["leader_election_namespace"],
        user_agent=f"declop/{__version__}",
        lease_duration=kw["lease_duration"],
        renew_deadline=kw["renew_deadline"],
        retry_period=kw["retry_period"],
        shards=kw.get("shards") or 0,
        qps=kw["qps"],
        burst=kw["burst"],
        list_mode=kw["list_mode"],
        debug_reconciles=kw["debug_reconciles"],
        webhook_port=kw["webhook_port"],
        webhook_cert_dir=kw["webhook_cert_dir"],
        webhook_service=kw["webhook_service"],
        webhook_url=kw["webhook_url"],
        webhook_name=kw["webhook_name"],
        webhook_namespace=kw["webhook_namespace"],
        webhook_cert_validity=kw["webhook_cert_validity"],
        webhook_max_body=None if kw["webhook_max_body_mib"] is None else int(kw["webhook_max_body_mib"] * 1024 * 1024),
        check_permissions=kw.get("check_permissions", True),
        rbac_command=_rbac_command(kw),
    )


def _rbac_command(kw: dict[str, Any]) -> str:
    """The ``declop rbac`` command printing the RBAC of the handlers and options of this run."""
    args = ["declop", "rbac", *kw.get("paths", ())]
    for module in kw.get("modules", ()):
        args += ["-m", module]
    if not kw.get("all_namespaces"):
        for namespace in dict.fromkeys(n for n in kw.get("namespaces", ()) if n):
            args += ["-n", namespace]
    if kw.get("leader_elect"):
        args.append("--leader-elect")
    if kw.get("shards"):
        args += ["--shards", str(kw["shards"])]
    if (kw.get("leader_elect") or kw.get("shards")) and kw.get("leader_election_namespace"):
        args += ["--leader-election-namespace", kw["leader_election_namespace"]]
    return shlex.join(args)


async def _serve(configuration: Any, options: Options, stop: asyncio.Event | None = None) -> int:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    manager = Manager(configuration, default_registry, options)
    manager.on_lost = Watchdog(EXIT_BOUND).arm  # gone within 2 s of a loss, whatever still runs
    await manager.run(stop)
    return manager.exit_code


def _require_registrations(kw: dict[str, Any]) -> None:
    if not len(default_registry) and not default_registry.webhooks:
        what = ", ".join([*kw["paths"], *(f"-m {m}" for m in kw["modules"])])
        raise ConfigError(
            f"no reconciler is registered by {what}; decorate a function with @declop.reconciler(\"pods\")"
        )


def _run_manager(configuration: Any, options: Options) -> int:
    """Run the manager to its end; return the exit code (1 after a lost Lease).

    Never raises ``SystemExit``: that would skip :func:`_exit`, and the interpreter's exit would
    then wait for stuck handler threads (``concurrent.futures`` joins them at exit)."""
    code = asyncio.run(_serve(configuration, options))
    _state["exit_code"] = code
    return code


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="declop")
def cli() -> None:
    """declop: level-triggered Kubernetes operators in plain Python."""


@cli.command(
    examples=(
        "declop run handlers.py                       # current kubeconfig context, all namespaces",
        "declop run handlers/ -n team-a -n team-b     # every .py file in handlers/, two namespaces",
        "declop run -m mypackage.handlers --context prod --log-format json",
        "DECLOP_NAMESPACES='team-a team-b' declop run handlers.py   # the same as two -n options",
    )
)
@_common_run_options
@click.option("--kubeconfig", type=click.Path(), default=None, envvar=_env("KUBECONFIG"), help="Kubeconfig file (default: $KUBECONFIG, then in-cluster, then ~/.kube/config).")
@click.option("--context", "context", default=None, envvar=_env("CONTEXT"), help="Kubeconfig context to use.")
def run(**kw: Any) -> None:
    """Load handler PATHS (files or directories) and -m modules, then reconcile until stopped."""
    _setup_logging(kw["log_format"], kw["verbose"], kw["quiet"])
    _check_lease_timings(kw)
    if not kw["paths"] and not kw["modules"]:
        raise ConfigError("nothing to run: pass handler files (declop run handlers.py) or -m module")
    load(kw["paths"], kw["modules"])
    _require_registrations(kw)
    configuration = load_configuration(kw["kubeconfig"], kw["context"])
    _run_manager(configuration, _options(kw))


@cli.command(
    examples=(
        "declop dev                          # only the control plane; prints export KUBECONFIG=...",
        "declop dev examples/pods.py         # the control plane and the seed's handlers on it",
        "declop dev examples/greeting/handlers.py -f examples/greeting/crd.yaml   # apply the CRD first; reload on save",
        "declop dev examples/pods.py --metrics-port 8080   # curl localhost:8080/metrics",
        "sudo -E declop dev --node examples/pods.py        # with a real node; handlers in-cluster",
    )
)
@_common_run_options
@click.option("-f", "--file", "files", multiple=True, type=click.Path(), envvar=_env("DEV_FILES"), help="Apply this YAML file or folder of them (multi-document) before the operator starts; CRDs are Established first (repeatable).")
@click.option("--reload/--no-reload", "reload", default=None, envvar=_env("DEV_RELOAD"), help="Restart the operator when a .py file of PATHS (or in their folders) is saved, re-apply -f files when they change. On by default; not with --node.")
@click.option("--kubeconfig-out", type=click.Path(), default=".declop/kubeconfig", show_default=True, envvar=_env("KUBECONFIG_OUT"), help="Where to write the admin kubeconfig.")
@click.option("--no-controller-manager", is_flag=True, envvar=_env("NO_CONTROLLER_MANAGER"), help="Run only etcd and kube-apiserver (faster start, no GC).")
@click.option("--node", is_flag=True, envvar=_env("DEV_NODE"), help="Also run a real node (containerd + kubelet; needs root) and run PATHS in-cluster: declop's image (and yours FROM it, when a Dockerfile sits beside PATHS), Helm chart, handlers from a ConfigMap; RBAC from the rbac-values.yaml beside PATHS (declop rbac --values), else everything.")
def dev(**kw: Any) -> None:
    """Start a local control plane (etcd + kube-apiserver + controller-manager), apply -f files and
    the CRDs of the typed models in PATHS, and run PATHS on it, restarting them when you save a
    handler file.

    \b
        declop dev handlers.py -f crd.yaml      # edit handlers.py, save: the operator restarts

    The CRDs of the CustomResource models PATHS define or import need no -f: they are applied
    first, and again on a save that changed them (docs/typed.md). A syntax error on save prints
    one line and waits for the next save. With no PATHS only the
    control plane runs (and -f files are applied). With --node, a real node joins it and PATHS
    run in-cluster as the chart's Pod (follow them with kubectl logs); --reload does not apply
    there. Ctrl-C stops everything. See docs/dev.md.
    """
    _setup_logging(kw["log_format"], kw["verbose"], kw["quiet"])
    if not kw["verbose"]:
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # not a line per saved file
    _check_lease_timings(kw)
    from declop.dev.loop import DevLoop, Sources
    from declop.dev.manifests import from_models, read as read_manifests
    from declop.testing.controlplane import ControlPlane

    if kw["node"]:
        if kw["reload"]:
            raise _BadOptions("--reload restarts handlers in this process; with --node they run in-cluster: drop --reload (or --node)")
        if kw["no_controller_manager"]:
            raise _BadOptions("--node needs the controller-manager (ServiceAccounts, ReplicaSets); drop --no-controller-manager")
        if kw["modules"]:
            raise _BadOptions("--node runs handler files from a ConfigMap; -m modules belong in your own image (docs/deploy.md)")
        from declop.testing.node import Node

        Node(ControlPlane()).check()  # no root, no packages: one line before anything starts

    reload = not kw["node"] if kw["reload"] is None else kw["reload"]
    runs = bool(kw["paths"] or kw["modules"])
    read_manifests(kw["files"])  # a missing or malformed file: one line before anything starts
    if reload and (runs or kw["files"]) and importlib.util.find_spec("watchfiles") is None:
        raise ConfigError("declop dev restarts the operator on save with the watchfiles package, which is not installed: pip install 'declop[dev]' (or pass --no-reload)")
    if reload:
        expand(kw["paths"])  # a missing path or module fails now; load errors wait for the next save
        for name in kw["modules"]:
            if _find_module(name) is None:
                raise ConfigError(f"no module named {name!r}; is it installed or on PYTHONPATH?")
    loaded: list[Any] = []
    crds: list[Any] = []
    if not reload:
        loaded = load(kw["paths"], kw["modules"])
        if runs:
            _require_registrations(kw)
        # a model the CRD cannot be made of: one line before anything starts
        crds = from_models(loaded, default_registry, webhook_service=kw["webhook_service"], webhook_url=kw["webhook_url"], webhook_port=kw["webhook_port"])
    out = os.path.abspath(kw["kubeconfig_out"])
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    started = False
    try:
        what = "kube-controller-manager, and a node: containerd, kubelet, kube-proxy, kube-scheduler" if kw["node"] else "kube-controller-manager"
        click.echo(f"Starting a local control plane (etcd, kube-apiserver, {what})…", err=True)
        image = _dev_image(kw) if kw["node"] and kw["paths"] else None
        with ControlPlane(controller_manager=not kw["no_controller_manager"], node=kw["node"]) as cp:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            shutil.copyfile(cp.kubeconfig_path, out)
            os.chmod(out, 0o600)
            click.echo(f"Control plane ready in {cp.startup_seconds:.1f} s at {cp.host}", err=True)
            click.echo(f"export KUBECONFIG={out}")
            click.echo(f"# kubectl and helm built for it: export PATH={cp.assets_dir}:$PATH", err=True)
            sys.stdout.flush()
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            configuration = load_configuration(out, None)
            sources = Sources(tuple(kw["paths"]), tuple(kw["modules"]), tuple(kw["files"]))
            started = True
            if kw["node"]:
                if kw["files"] or crds:
                    _apply_once(configuration, kw, sources, loaded)
                if kw["paths"]:
                    _run_in_cluster(cp, kw, image)
            elif runs or (kw["files"] and reload):
                # local use: plain HTTP metrics (curl localhost:PORT/metrics) unless asked otherwise
                devloop = DevLoop(
                    configuration, _options(kw, secure_by_default=False), sources, reload=reload, loaded=not reload, modules=loaded, echo=_echo
                )
                _state["exit_code"] = asyncio.run(_serve_until_signal(devloop.run))
                return
            elif kw["files"] or crds:
                _apply_once(configuration, kw, sources, loaded)
            click.echo("Press Ctrl-C to stop.", err=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if started:  # also after an error: its one line follows this one
            click.echo("Control plane stopped.", err=True)


def _find_module(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package is missing, or a malformed name
        return None


def _apply_once(configuration: Any, kw: dict[str, Any], sources: Sources, loaded: Sequence[Any]) -> None:
    """Apply the -f files and the CRDs of the models of the ``loaded`` handler modules."""
    from declop.dev.loop import DevLoop

    devloop = DevLoop(configuration, _options(kw), sources, reload=False, loaded=True, modules=loaded, echo=_echo)
    asyncio.run(devloop.apply_manifests())


def _echo(line: str) -> None:
    click.echo(line, err=True)


async def _serve_until_signal(run: Any) -> int:
    """``await run(stop)`` with SIGTERM/SIGINT setting ``stop``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    result: int = await run(stop)
    return result


@cli.command(
    examples=(
        "declop crd handlers.py                           # the CRDs of the models handlers.py defines or imports",
        "declop crd handlers.py | kubectl apply -f -      # install them",
        "declop crd handlers/ -o crds.yaml                # every .py file in handlers/, into a file",
        "declop crd handlers.py --webhook-service operators/widget-operator-webhook   # conversion via this Service",
    )
)
@click.argument("paths", nargs=-1, type=click.Path(), envvar=_env("PATHS"))
@click.option("-m", "--module", "modules", multiple=True, envvar=_env("MODULES"), help="Import models and handlers from a module (repeatable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, envvar=_env("CRD_OUTPUT"), help="Write the YAML to this file instead of stdout.")
@click.option("--webhook-service", default=None, envvar=_env("WEBHOOK_SERVICE"), help="NAMESPACE/NAME[:PORT]: the Service the apiserver calls a kind's conversion webhook through (as for declop run).")
@click.option("--webhook-url", default=None, envvar=_env("WEBHOOK_URL"), help="Base URL of the conversion webhook when there is no --webhook-service (default: https://127.0.0.1:PORT).")
@click.option("--webhook-port", type=int, default=9443, show_default=True, envvar=_env("WEBHOOK_PORT"), help="The PORT of the default --webhook-url.")
def crd(paths: tuple[str, ...], modules: tuple[str, ...], output: str | None, webhook_service: str | None, webhook_url: str | None, webhook_port: int) -> None:
    """Print the CustomResourceDefinitions of the typed models (CustomResource classes) that
    handler PATHS and -m modules define or import, as YAML documents.

    One CRD per kind, one version per model class, exactly one of them storage=True. A kind
    with a @declop.converter gets spec.conversion pointing where the operator serves it (the
    operator adds the caBundle when it starts). The output is the same, byte for byte, for the
    same models. See docs/typed.md.
    """
    if not paths and not modules:
        raise ConfigError("nothing to read: pass handler files (declop crd handlers.py) or -m module")
    from declop.dev.manifests import from_models

    loaded = load(paths, modules)
    manifests = from_models(loaded, default_registry, webhook_service=webhook_service, webhook_url=webhook_url, webhook_port=webhook_port)
    if not manifests:
        what = ", ".join([*paths, *(f"-m {m}" for m in modules)])
        raise ConfigError(
            f"no typed model in {what}: subclass declop.typed.model.CustomResource with group=, version= and kind= (docs/typed.md)"
        )
    from declop.typed.crd import dump

    text = dump(m.obj for m in manifests)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"Wrote {len(manifests)} CRD{'s' if len(manifests) != 1 else ''} to {output}: {', '.join(m.name for m in manifests)}", err=True)


@cli.command(
    examples=(
        "declop sim handlers.py --replicas 3 --seeds 1000     # 1000 fault schedules; prints each failing seed",
        "declop sim handlers.py --seed 17                     # one schedule: its faults and first violation",
        "declop sim handlers.py --mode sharded --shards 4 --seeds 100",
    )
)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-m", "--module", "modules", multiple=True, help="Import handlers from a module (repeatable).")
@click.option("--replicas", type=int, default=3, show_default=True, help="Replicas (managers) in the simulated cluster.")
@click.option("--seeds", type=int, default=100, show_default=True, help="Schedules to run (seeds from --start).")
@click.option("--start", type=int, default=0, show_default=True, help="The first seed.")
@click.option("--seed", type=int, default=None, help="Run this one seed and print its faults and first violation.")
@click.option("--mode", type=click.Choice(["leader", "sharded"]), default="leader", show_default=True, help="Leader election, or --shards ranges.")
@click.option("--shards", type=int, default=4, show_default=True, help="Hash ranges with --mode sharded.")
@click.option("--objects", type=int, default=200, show_default=True, help="Objects of the primary resource the workload creates.")
@click.option("--duration", type=float, default=60.0, show_default=True, help="Virtual seconds of workload and faults.")
@click.option("--faults", default=None, help="Fault kinds to draw from, comma-separated (default: all).")
@click.option("-v", "--verbose", is_flag=True, help="Print declop's log lines.")
def sim(paths: tuple[str, ...], modules: tuple[str, ...], replicas: int, seeds: int, start: int, seed: int | None, mode: str,
        shards: int, objects: int, duration: float, faults: str | None, verbose: bool) -> None:  # fmt: skip
    """Run handler PATHS and -m modules in a simulated cluster: several replicas, on virtual
    time, under faults drawn from each seed (partitions, pauses, crashes, compaction), with a
    workload of creates, updates, deletes and re-creates; check the invariants (no two replicas
    reconcile one object at once, every change reconciled, every deletion delivered, finalizers
    released only after a successful cleanup). Prints each failing seed's repro line and the
    schedules per second; exit 1 if any failed. See docs/simulation.md.
    """
    from declop.dev.manifests import from_models
    from declop.testing import simworld

    if not paths and not modules:
        raise ConfigError("nothing to simulate: pass handler files (declop sim handlers.py) or -m module")
    if verbose:
        _setup_logging("text", 1, False)
    else:
        logging.getLogger("declop").setLevel(logging.CRITICAL + 1)  # the faults make errors on purpose
    loaded = load(paths, modules)
    _require_registrations({"paths": paths, "modules": modules})
    crds = [m.obj for m in from_models(loaded, default_registry)]
    kinds = tuple(k for k in (faults or ",".join(simworld.WORLD_FAULTS)).split(",") if k)
    unknown = sorted(set(kinds) - set(simworld.WORLD_FAULTS))
    if unknown:
        raise ConfigError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(simworld.WORLD_FAULTS)}")
    world = simworld.World(mode=mode, replicas=replicas, shards=shards, objects=objects, duration=duration, kinds=kinds,
                           handlers=" ".join([*paths, *(f"-m {m}" for m in modules)]))  # fmt: skip
    if seed is not None:
        result = simworld.run(world, seed, default_registry, crds)
        click.echo(result.report())
        sys.exit(0 if result.ok else 1)
    failed = simworld.run_seeds(world, range(start, start + seeds), default_registry, crds=crds)
    sys.exit(1 if failed else 0)


@cli.command(
    examples=(
        "declop rbac handlers.py                          # a ClusterRole: watching all namespaces",
        "declop rbac handlers.py -n team-a --leader-elect # a Role in team-a, and one for the Lease",
        "declop rbac handlers.py --service-account ops:my-operator | kubectl apply -f -   # with bindings",
        "declop rbac handlers.py --values rbac-values.yaml   # helm install ... -f rbac-values.yaml",
    )
)
@click.argument("paths", nargs=-1, type=click.Path(), envvar=_env("PATHS"))
@click.option("-m", "--module", "modules", multiple=True, envvar=_env("MODULES"), help="Import handlers from a module (repeatable).")
@click.option("-n", "--namespace", "namespaces", multiple=True, envvar=_env("NAMESPACES"), help="The operator watches only this namespace (repeatable): a Role in each instead of a ClusterRole.")
@click.option("--leader-elect/--no-leader-elect", default=False, envvar=_env("LEADER_ELECT"), help="Grant the leader-election Lease.")
@click.option("--leader-election-id", default="declop", envvar=_env("LEADER_ELECTION_ID"), show_default=True, help="The Lease name (granted by name).")
@click.option("--leader-election-namespace", default=None, envvar=_env("LEADER_ELECTION_NAMESPACE"), help="The Leases' namespace (default: the service account's, else default).")
@click.option("--shards", type=int, default=None, envvar=_env("SHARDS"), help="Grant the sharding Leases (declop run --shards).")
@click.option("--webhook-name", default="declop", show_default=True, envvar=_env("WEBHOOK_NAME"), help="Name of the webhook configurations (granted by name) and of the CA Secret NAME-webhook-ca.")
@click.option("--webhook-namespace", default=None, envvar=_env("WEBHOOK_NAMESPACE"), help="Namespace of the webhook CA Secret (default: the service account's, else default).")
@click.option("--webhook-cert-dir", default=None, envvar=_env("WEBHOOK_CERT_DIR"), help="Webhook certificates are mounted: no CA Secret is granted.")
@click.option("--metrics-secure", "metrics_secure", is_flag=True, envvar=_env("RBAC_METRICS_SECURE"), help="Grant what secure metrics check callers with (declop run --metrics-port, HTTPS by default): create on tokenreviews and subjectaccessreviews.")
@click.option("--name", "role_name", default="declop", show_default=True, envvar=_env("RBAC_NAME"), help="Name of the Roles/ClusterRoles (and bindings).")
@click.option("--service-account", default=None, envvar=_env("RBAC_SERVICE_ACCOUNT"), help="NAMESPACE:NAME of the ServiceAccount to bind the roles to (default: no bindings).")
@click.option("--values", "values_file", default=None, type=click.Path(), envvar=_env("RBAC_VALUES"), help="Write Helm values for charts/declop (rbac.generated, and webhooks) to this file instead of printing manifests.")
def rbac(**kw: Any) -> None:
    """Print the RBAC the handlers need as YAML: exactly the verbs declop sends, per resource.

    Every source (primary, owns=, watches=, indexes) gets get/list/watch; the primary patch with a
    finalizer and /status patch/update when it is a custom resource; owns= children
    create/update/patch/delete (and the primary's /finalizers update for blockOwnerDeletion);
    Events create/patch; Leases, webhook configurations and the CA Secret by name; and each
    permissions= entry. See docs/rbac.md.
    """
    from declop.kube.rbac import manifests, reasons, to_yaml, values_yaml

    _setup_logging("plain", 0, True)
    if not kw["paths"] and not kw["modules"]:
        raise ConfigError("no handlers: pass handler files (declop rbac handlers.py) or -m module")
    load(kw["paths"], kw["modules"])
    _require_registrations(kw)
    account = None
    if kw["service_account"]:
        sa_ns, colon, sa_name = kw["service_account"].partition(":")
        if not (colon and sa_ns and sa_name):
            raise _BadOptions(f"--service-account must be NAMESPACE:NAME, e.g. ops:my-operator, got {kw['service_account']!r}")
        account = (sa_ns, sa_name)
    own = account[0] if account else "default"
    lease_ns = kw["leader_election_namespace"] or own
    grants = default_registry.grants(
        leader=(lease_ns, kw["leader_election_id"]) if kw["leader_elect"] else None,
        shards=lease_ns if kw["shards"] else None,
        webhook_name=kw["webhook_name"],
        ca_secret_namespace=None if kw["webhook_cert_dir"] else (kw["webhook_namespace"] or own),
        metrics_auth=kw["metrics_secure"],
    )
    command = " ".join(["declop", "rbac", *kw["paths"], *(f"-m {m}" for m in kw["modules"])])
    if kw["values_file"]:
        text = values_yaml(grants, webhooks=bool(default_registry.webhooks), command=command)
        with open(kw["values_file"], "w") as f:
            f.write(text)
        click.echo(f"wrote {kw['values_file']}", err=True)
        return
    namespaces = tuple(dict.fromkeys(n for n in kw["namespaces"] if n))
    docs = manifests(grants, name=kw["role_name"], namespaces=namespaces, service_account=account)
    header = f"Generated by `{command}`: the RBAC of these handlers; see docs/rbac.md."
    click.echo(to_yaml(docs, header=header, notes=reasons(grants)), nl=False)


@cli.command()
@click.argument("kind")
@click.option("--group", required=True, help="API group: a DNS subdomain you own, e.g. example.com.")
@click.option("--version", "version", default="v1", show_default=True, help="API version: v1, v1alpha1, v2beta3 …")
@click.option("--plural", default=None, help="Plural resource name (default: derived from KIND, e.g. policies).")
@click.option("--dir", "directory", type=click.Path(), default=None, help="Folder to create (default: ./<kind>-operator); must be new or empty.")
def new(kind: str, group: str, version: str, plural: str | None, directory: str | None) -> None:
    """Write a small operator project for a new custom resource KIND (CamelCase, e.g. Widget).

    The project has a handler module with KIND as a typed model (its CRD is `declop crd
    handlers.py`) and a reconciler (finalizer, an owned ConfigMap, a Ready condition), unit and
    integration tests, Helm chart values, the RBAC its handlers need (rbac-values.yaml, from
    `declop rbac handlers.py --values rbac-values.yaml`), a Dockerfile and a README.

    \b
    Example:
      declop new Widget --group example.com
      cd widget-operator && declop dev handlers.py
    """
    from declop.dev.scaffold import create, names_for, warnings_for

    names = names_for(kind, group, version, plural)
    target, files = create(names, directory)
    for warning in warnings_for(names):
        click.echo(f"declop: warning: {warning}", err=True)
    click.echo(f"Created {names.crd_name} ({names.api_version}, Kind {names.kind}) in {target}/:")
    for path in files:
        click.echo(f"  {path.relative_to(target)}")
    click.echo(f"Next:\n  cd {target}\n  declop dev handlers.py\n  pytest")


@cli.group(short_help="Build the control plane's binaries, or print their folder.")
def assets() -> None:
    """The control plane's binaries (kube-apiserver, etcd, kubectl, kube-controller-manager, helm).

    \b
    declop assets build   build them once from the Go module proxy (needs Go >= 1.26), or find them
    declop assets path    print their folder, for KUBEBUILDER_ASSETS or DECLOP_ASSETS_DIR:
                          export KUBEBUILDER_ASSETS=$(declop assets path)
    """


@assets.command("build", short_help="Build the binaries once (or find them built); print their folder.")
@click.option("--node", is_flag=True, help="Build the local node's binaries instead (kubelet, kube-proxy, kube-scheduler, BuildKit, pause; declop dev --node), installing its Debian packages when missing (root).")
def assets_build(node: bool) -> None:
    """Build the binaries that are missing (~15 min the first time on 2 cores, then instant).

    Progress goes to stderr; the folder is the last line of stdout. Builds into
    $DECLOP_ASSETS_DIR when set, else ~/.cache/declop/controlplane/<version>-<key>.
    With --node: into $DECLOP_NODE_ASSETS_DIR when set, else ~/.cache/declop/node/<version>-<key>.
    """
    if node:
        from declop.assets import files

        click.echo(files.build_node())
        return
    from declop import assets as assets_module

    click.echo(assets_module.build())


@assets.command("path", short_help="Print their folder (KUBEBUILDER_ASSETS); fail if not built.")
@click.option("--chart", is_flag=True, help="Print the folder of declop's Helm chart instead (helm install NAME $(declop assets path --chart)).")
def assets_path(chart: bool) -> None:
    """Print the folder the test kit's control plane uses; fail if nothing is built.

    Looks at $KUBEBUILDER_ASSETS, $DECLOP_ASSETS_DIR, then declop's cache. With --chart, print
    the Helm chart shipped with this declop (a checkout's charts/declop, or the installed copy).
    """
    if chart:
        from declop.assets import files

        click.echo(files.chart_dir())
        return
    from declop import assets as assets_module

    click.echo(assets_module.find())


def _dev_image(kw: dict[str, Any]) -> Any:
    """The images for ``dev --node``: declop's (built once per content, from this checkout or the
    installed package) and the project's own ``FROM`` it when a Dockerfile sits beside PATHS."""
    from declop.testing.incluster import dev_images

    return dev_images(kw["paths"], echo=_echo)


def _run_in_cluster(cp: Any, kw: dict[str, Any], images: Any) -> None:
    """Import the images, helm install the chart with PATHS as handlers, follow the operator's logs."""
    import subprocess

    from declop.assets.files import chart_dir
    from declop.testing.incluster import handler_files, install_operator, project_rbac

    assert cp.node is not None and images is not None
    for tar in images.tars:
        cp.node.import_image(tar)
    rbac = project_rbac(kw["paths"])
    granted = f"RBAC from {rbac}" if rbac is not None else "RBAC: everything (no rbac-values.yaml beside the handlers)"
    click.echo(f"Installing the chart (release declop, namespace declop-system, image {images.runs}, {granted}) and waiting for the Pod to be Ready…", err=True)
    install_operator(cp, chart_dir(), handler_files(kw["paths"]), image=images.runs, rbac_values=rbac)
    click.echo("Operator running in-cluster; its logs follow (kubectl logs -n declop-system deploy/declop -f). Ctrl-C stops everything.", err=True)
    sys.stdout.flush()
    follow = ["kubectl", "logs", "-n", "declop-system", "deploy/declop", "-f"]
    while True:  # a container restart ends `logs -f`: follow the new container
        subprocess.run(follow, env=cp.env(), check=False)
        threading.Event().wait(1.0)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: run the click group and map errors to one line + exit code."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="declop", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ConfigError as exc:
        _fail(exc)
    except DeclopError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        _exit(130)
    _exit(int(_state.get("exit_code") or 0))


def _fail(exc: BaseException) -> None:
    if _state["verbose"]:
        traceback.print_exception(exc, file=sys.stderr)
    click.echo(f"declop: error: {exc}", err=True)
    _exit(int(getattr(exc, "exit_code", 1)))


def _exit(code: int) -> None:
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
