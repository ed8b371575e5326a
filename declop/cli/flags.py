"""The flags of ``declop run`` and ``declop dev``, generated from :class:`~declop.manager.options.Options`.

Each option field whose metadata carries a :class:`~declop.manager.options.Flag` becomes one
click option (its ``DECLOP_*`` variable named after it), in field order, after the flags that
choose what to run and how to log; :func:`options_from` turns the parsed flags back into
``Options``. The checks here are the ones no single flag can make: Lease timings that contradict
each other, ``--shards`` with ``--leader-elect``.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Callable

import click

from declop.cli.exits import BadOptions
from declop.cli.help import env
from declop.kube.kubeconfig import pod_namespace
from declop.leases.leader import LEASE_TIMINGS, LeaseTimings
from declop.manager.options import Flag, Options
from declop.version import __version__

__all__ = ["MAX_SHARDS", "check_lease_timings", "options_from", "rbac_command", "run_options"]

#: --shards above this is refused: one Lease write per range per retry period, one LIST of them all
MAX_SHARDS = 1024

_TYPES: dict[str, Callable[[Flag], Any]] = {
    "str": lambda f: None,
    "int": lambda f: int,
    "float": lambda f: float,
    "bool": lambda f: click.BOOL,
    "switch": lambda f: None,
    "path": lambda f: click.Path(),
    "choice": lambda f: click.Choice(list(f.choices)),
    "range": lambda f: click.IntRange(min=f.low, max=f.high) if isinstance(f.low, int) else click.FloatRange(min=f.low, max=f.high),
}


def _param(field: dataclasses.Field[Any], flag: Flag) -> str:
    """The keyword the command receives for ``field`` (and its variable's name)."""
    return flag.param or (flag.name.lstrip("-").replace("-", "_") if flag.name else field.name)


def _option(field: dataclasses.Field[Any]) -> Callable[[Any], Any]:
    flag: Flag = field.metadata["flag"]
    long = flag.name or "--" + field.name.replace("_", "-")
    param = _param(field, flag)
    decls = [d for d in (flag.short, f"{long}/--no-{long[2:]}" if flag.kind == "switch" else long, param) if d]
    kw: dict[str, Any] = {"envvar": env(param.upper()), "help": flag.help}
    if flag.multiple:
        kw["multiple"] = True
    else:
        kw["default"] = field.default if flag.unset is ... else flag.unset
    kind = _TYPES[flag.kind](flag)
    if kind is not None:
        kw["type"] = kind
    if flag.show_default:
        kw["show_default"] = True
    return click.option(*decls, **kw)


def _flagged() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Options) if "flag" in f.metadata]


def run_options(fn: Any) -> Any:
    """The flags ``declop run`` and ``declop dev`` share: what to run, how to log, and every option."""
    namespaces, *rest = _flagged()
    assert namespaces.name == "namespaces"
    options = [
        click.argument("paths", nargs=-1, type=click.Path(), envvar=env("PATHS")),
        click.option("-m", "--module", "modules", multiple=True, envvar=env("MODULES"), help="Import handlers from a module (repeatable)."),
        _option(namespaces),
        click.option("-A", "--all-namespaces", is_flag=True, envvar=env("ALL_NAMESPACES"), help="Watch all namespaces (the default)."),
        click.option("--log-format", type=click.Choice(["plain", "json"]), default="plain", show_default=True, envvar=env("LOG_FORMAT")),
        click.option("-v", "--verbose", count=True, envvar=env("VERBOSE"), help="More logs; tracebacks on errors."),
        click.option("-q", "--quiet", is_flag=True, envvar=env("QUIET"), help="Only warnings and errors."),
        *(_option(f) for f in rest),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def options_from(kw: dict[str, Any], *, secure_by_default: bool = True) -> Options:
    """The manager's options from a command's parsed flags (``secure_by_default``: /metrics over
    HTTPS unless ``--metrics-secure`` says otherwise — ``declop dev`` serves plain HTTP)."""
    unset_defaults = {"metrics_secure": secure_by_default}
    values: dict[str, Any] = {}
    for field in _flagged():
        flag: Flag = field.metadata["flag"]
        value = kw.get(_param(field, flag))
        if field.name == "namespaces":
            value = () if kw["all_namespaces"] else tuple(dict.fromkeys(n for n in value if n))
        elif value is None and flag.unset is None:
            value = unset_defaults.get(field.name, field.default)
        elif flag.to_option is not None:
            value = flag.to_option(value)
        values[field.name] = value
    return Options(**values, user_agent=f"declop/{__version__}", rbac_command=rbac_command(kw))


def rbac_command(kw: dict[str, Any]) -> str:
    """The ``declop rbac`` command printing the RBAC of the handlers and options of this run: every
    option that changes a grant the start-up check reviews (the Lease's name and namespace — the
    Pod's when not given, as ``declop run`` takes it —, the webhooks' names and CA Secret, the
    cluster asked for names), so running it prints what makes that check pass. In a Pod the check
    adds ``--service-account`` (:func:`declop.manager.preflight.advice`)."""
    args = ["declop", "rbac", *kw.get("paths", ())]
    for module in kw.get("modules", ()):
        args += ["-m", module]
    if not kw.get("all_namespaces"):
        for namespace in dict.fromkeys(n for n in kw.get("namespaces", ()) if n):
            args += ["-n", namespace]
    if kw.get("leader_elect"):
        args.append("--leader-elect")
        if kw.get("leader_election_id") not in (None, "declop"):
            args += ["--leader-election-id", kw["leader_election_id"]]
    if kw.get("shards"):
        args += ["--shards", str(kw["shards"])]
    if kw.get("leader_elect") or kw.get("shards"):
        lease_ns = kw.get("leader_election_namespace") or pod_namespace()
        if lease_ns != "default":  # declop rbac's own default
            args += ["--leader-election-namespace", lease_ns]
    if kw.get("webhook_name") not in (None, "declop"):
        args += ["--webhook-name", kw["webhook_name"]]
    if kw.get("webhook_cert_dir"):
        args += ["--webhook-cert-dir", kw["webhook_cert_dir"]]
    else:
        service = kw.get("webhook_service") or ""
        ca_ns = kw.get("webhook_namespace") or (service.partition("/")[0] if "/" in service else None)
        if ca_ns:
            args += ["--webhook-namespace", ca_ns]
    for flag in ("kubeconfig", "context"):
        if kw.get(flag):
            args += [f"--{flag}", kw[flag]]
    return shlex.join(args)


def _check_shards(kw: dict[str, Any]) -> None:
    """--shards: a positive count, never with --leader-elect."""
    shards = kw.get("shards")
    if shards is None:
        return
    if shards < 1:
        raise BadOptions(f"--shards must be 1 or more (the number of hash ranges, e.g. 16), got {shards}")
    if shards > MAX_SHARDS:
        retry = LEASE_TIMINGS.retry_period
        raise BadOptions(
            f"--shards {shards} is more than {MAX_SHARDS}: each range is a Lease renewed every --retry-period by its "
            f"holder ({shards / retry:.0f} writes/s per controller at the default {retry:g} s); use at most {MAX_SHARDS} "
            "(16-64 is typical: a few ranges per replica)"
        )
    if kw["leader_elect"]:
        raise BadOptions(
            "--shards replaces --leader-elect: every replica reconciles its own ranges, each guarded by a Lease "
            "of its own; drop --leader-elect (see docs/sharding.md)"
        )


def check_lease_timings(kw: dict[str, Any]) -> None:
    """client-go's rule (:meth:`~declop.leases.leader.LeaseTimings.valid`), checked before
    anything connects; and ``--shards``'s own."""
    _check_shards(kw)
    if not kw["leader_elect"] and not kw.get("shards"):
        return
    timings = LeaseTimings(kw["lease_duration"], kw["renew_deadline"], kw["retry_period"])
    if not timings.valid():
        duration, deadline, retry = timings.lease_duration, timings.renew_deadline, timings.retry_period
        d = LEASE_TIMINGS
        raise BadOptions(
            f"--lease-duration ({duration:g}) must be greater than --renew-deadline ({deadline:g}), which must be "
            f"greater than 1.2 × --retry-period ({retry:g} → {1.2 * retry:g}), which must be > 0; "
            f"the defaults are {d.lease_duration:g}, {d.renew_deadline:g} and {d.retry_period:g}"
        )
