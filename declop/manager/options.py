"""Options: the settings of one manager, each with its default — the one home of both.

A field whose metadata carries a :class:`Flag` is also a flag of ``declop run`` and ``declop
dev`` (and a ``DECLOP_*`` variable): :mod:`declop.cli.flags` builds the click options from these
fields, in field order, so a flag's name, help, type and default are written here only. The
Lease timings' defaults are :data:`~declop.leases.leader.LEASE_TIMINGS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from declop.leases.leader import LEASE_TIMINGS

__all__ = ["Flag", "Options"]


@dataclass(frozen=True)
class Flag:
    """How one option is set from the command line.

    ``kind``: "str", "int", "float", "bool" (a ``true``/``false`` value), "switch"
    (``--x/--no-x``), "path", "choice" (one of ``choices``) or "range" (``low`` ≤ value ≤ ``high``,
    int or float as ``low`` is). ``name`` is the long flag (default: the field's name with dashes);
    the ``DECLOP_*`` variable is named after ``param``, the keyword the command receives (default:
    the flag's name with underscores). ``unset``: the flag's default, when it is not the option's
    (None: "not given", then the command's default applies); ``to_option`` turns a given value into
    the option's."""

    help: str | None = None
    kind: str = "str"
    name: str = ""
    short: str = ""
    param: str = ""
    multiple: bool = False
    show_default: bool = False
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    unset: Any = ...
    to_option: Callable[[Any], Any] | None = None


def _flag(**kw: Any) -> dict[str, Flag]:
    return {"flag": Flag(**kw)}


def _mib(value: float | None) -> int | None:
    return None if value is None else int(value * 1024 * 1024)


@dataclass
class Options:
    """Settings of one manager; ``declop run`` fills them from flags and ``DECLOP_*`` variables."""

    namespaces: tuple[str, ...] = field(default=(), metadata=_flag(
        name="--namespace", short="-n", param="namespaces", multiple=True, help="Watch only this namespace (repeatable)."))
    grace_period: float = field(default=30.0, metadata=_flag(
        kind="float", show_default=True, help="Seconds in-flight reconciles get on shutdown."))
    health_port: int | None = field(default=None, metadata=_flag(kind="int", help="Serve /healthz and /readyz on this port."))
    metrics_port: int | None = field(default=None, metadata=_flag(kind="int", help="Serve /metrics on this port."))
    #: the address the probe, metrics and webhook servers listen on (None: every interface)
    bind_address: str | None = field(default=None, metadata=_flag(
        to_option=lambda v: v or None,
        help="Address the probe, metrics and webhook servers listen on (default: 0.0.0.0; 127.0.0.1 under 'declop dev')."))
    #: /metrics over HTTPS, callers checked with TokenReview + SubjectAccessReview (False: plain HTTP)
    metrics_secure: bool = field(default=True, metadata=_flag(
        kind="bool", unset=None,
        help="Serve /metrics over HTTPS, only to callers allowed 'get' on it (TokenReview + SubjectAccessReview); "
        "=false for plain HTTP. Default: true for run, false for dev (local use)."))
    #: tls.crt/tls.key for the metrics server (None: a self-signed pair generated at start)
    metrics_cert_dir: str | None = field(default=None, metadata=_flag(
        kind="path", help="Directory with tls.crt and tls.key for /metrics (default: self-signed, in memory)."))
    leader_elect: bool = field(default=False, metadata=_flag(kind="switch", help="Reconcile only while holding a Lease."))
    leader_election_id: str = field(default="declop", metadata=_flag(show_default=True))
    leader_election_namespace: str | None = field(default=None, metadata=_flag())
    lease_duration: float = field(default=LEASE_TIMINGS.lease_duration, metadata=_flag(
        kind="float", show_default=True, help="Seconds a standby waits before taking an unrenewed Lease."))
    renew_deadline: float = field(default=LEASE_TIMINGS.renew_deadline, metadata=_flag(
        kind="float", show_default=True, help="Seconds the leader keeps trying to renew before it gives up."))
    retry_period: float = field(default=LEASE_TIMINGS.retry_period, metadata=_flag(
        kind="float", show_default=True, help="Seconds between Lease attempts."))
    #: sharded mode: split every controller's hash space into this many ranges, one Lease each
    #: (0: off). The Leases live in ``leader_election_namespace`` and are named after
    #: ``leader_election_id``.
    shards: int = field(default=0, metadata=_flag(
        kind="int", unset=None,
        help="Split each controller's objects into N hash ranges, one Lease each; replicas share the ranges "
        "(replaces --leader-elect; docs/sharding.md)."))
    qps: float = field(default=20.0, metadata=_flag(kind="float", show_default=True, help="Client-side limit on API requests per second."))
    burst: int = field(default=30, metadata=_flag(kind="int", show_default=True, help="Requests allowed above --qps in a burst."))
    #: keep the last N reconciles per controller and serve them on /debug/reconciles (health
    #: port); 0: off
    debug_reconciles: int = field(default=0, metadata=_flag(
        kind="range", low=0, show_default=True,
        help="Keep the last N reconciles per controller (trigger, duration, outcome) and serve them on "
        "/debug/reconciles on the health port; 0: off."))
    #: HTTPS port of the webhook server (served only when webhooks are registered)
    webhook_port: int = field(default=9443, metadata=_flag(
        kind="int", show_default=True, help="HTTPS port of the admission/conversion webhook server (only when webhooks are registered)."))
    #: tls.crt/tls.key (and ca.crt) mounted for the webhook server; None: declop's own CA in a Secret
    webhook_cert_dir: str | None = field(default=None, metadata=_flag(
        kind="path",
        help="Directory with tls.crt, tls.key (and ca.crt) for webhooks, reloaded when they change "
        "(default: declop's CA, kept in a Secret)."))
    #: "namespace/name[:port]" of the Service in front of the operator (in-cluster); None: the URL form
    webhook_service: str | None = field(default=None, metadata=_flag(
        help="NAMESPACE/NAME[:PORT] of the Service the apiserver calls webhooks through (in-cluster)."))
    #: where the apiserver reaches this process, without the path (default https://127.0.0.1:<port>)
    webhook_url: str | None = field(default=None, metadata=_flag(
        help="Base URL the apiserver calls webhooks at when there is no --webhook-service (default: https://127.0.0.1:PORT)."))
    #: names the webhook configurations and the CA Secret (<name>-webhook-ca)
    webhook_name: str = field(default="declop", metadata=_flag(
        show_default=True, help="Name of the webhook configurations; the CA Secret is NAME-webhook-ca."))
    #: the operator's namespace: holds the CA Secret, excluded from admission (default: the
    #: Service's, else the Pod's; out of a cluster none is excluded and the Secret goes to "default")
    webhook_namespace: str | None = field(default=None, metadata=_flag(
        help="The operator's namespace: keeps the CA Secret, excluded from admission (default: the Service's, "
        "else the Pod's; out of a cluster none is excluded)."))
    #: seconds a generated serving certificate is valid; renewed after two thirds of it
    webhook_cert_validity: float = field(default=365 * 86400.0, metadata=_flag(
        kind="float", help="Seconds a generated webhook serving certificate is valid; renewed after two thirds."))
    #: bytes a webhook request body may have (None: 7 MiB admission, 8 MiB conversion); one
    #: such body is decoded at a time, and costs about five times its size in memory
    webhook_max_body: int | None = field(default=None, metadata=_flag(
        kind="range", name="--webhook-max-body-mib", low=0.0625, high=64, to_option=_mib,
        help="MiB a webhook request body may have (default: 7 for admission, 8 for conversion). One such body is "
        "decoded at a time and costs about 5x its size in memory: raise the memory limit with it."))
    #: ask the apiserver (SelfSubjectAccessReview) for every grant the registrations need before
    #: informers start; a missing one stops the start (docs/rbac.md)
    check_permissions: bool = field(default=True, metadata=_flag(
        kind="switch",
        help="At start, ask the apiserver (SelfSubjectAccessReview) for every permission the handlers need and stop, "
        "naming each missing one, before informers start (docs/rbac.md)."))
    #: how informers sync: "auto" (streaming list, logged fallback to paginated LIST when the
    #: apiserver refuses it), "stream" or "paged" (forced)
    list_mode: str = field(default="auto", metadata=_flag(
        kind="choice", choices=("auto", "stream", "paged"), show_default=True,
        help="How informers sync: streaming list with fallback to paginated LIST (auto), or force one."))
    user_agent: str = "declop"
    field_manager: str = "declop"
    handler_threads: int | None = None
    #: seconds a thread may keep the interpreter while another waits for it
    #: (``sys.setswitchinterval``, process-wide, set at start; None: leave Python's 5 ms). The
    #: loop gives the interpreter up at every socket call and waits up to this long to get it
    #: back while a thread (a plain ``def`` handler, a large webhook body) computes: under load,
    #: tens of such waits a second stall the loop (docs/webhooks.md, "Limits")
    switch_interval: float | None = 0.001
    #: the command that prints the RBAC the handlers need, named when a permission is missing
    rbac_command: str = "declop rbac <your handler files>"
    extra: dict[str, Any] = field(default_factory=dict)
