"""``declop rbac``: the RBAC the loaded handlers need, as YAML manifests or the chart's values.

Names are read as ``declop run`` reads them (:class:`~declop.kube.catalog.Catalog`): against
the apiserver's discovery when the kubeconfig names one that answers, else against Kubernetes'
standard resources; typed models bring their own names and scope either way. A name neither
knows is refused in one line with the right spelling, exit 1.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

import click

from declop.cli.exits import BadOptions, setup_logging
from declop.cli.help import Command, env
from declop.cli.run import require_registrations
from declop.errors import ApiError, ConfigError
from declop.loader import load
from declop.registry import Registry, default_registry

if TYPE_CHECKING:
    from declop.kube.catalog import Catalog

__all__ = ["catalog", "rbac", "values_of"]


def catalog(
    kubeconfig: str | None = None, context: str | None = None, *, offline: bool = False,
    echo: Callable[[str], None] = lambda line: click.echo(line, err=True),
) -> Catalog:
    """The resources to read names against: the apiserver's (discovery, 5 s at most) when the
    kubeconfig names one that answers, else Kubernetes' standard ones — said on ``echo`` when a
    kubeconfig was found but its apiserver did not answer. ``offline``: never ask a cluster.

    Raises:
        ConfigError: ``kubeconfig`` or ``context`` was given and cannot be used.
    """
    from declop.kube.catalog import Catalog, discover
    from declop.kube.transport import load_configuration

    if offline:
        return Catalog.standard()
    try:
        configuration = load_configuration(kubeconfig, context)
    except ConfigError:
        if kubeconfig or context:
            raise
        return Catalog.standard()  # no cluster configured: nothing to ask
    try:
        resources = asyncio.run(discover(configuration))
    except (ApiError, TimeoutError) as exc:
        fallback = Catalog.standard()
        why = exc.reason if isinstance(exc, ApiError) and exc.status == 0 else (str(exc) or "no answer in 5 s")
        echo(f"declop rbac: the apiserver at {configuration.host} did not answer discovery ({why}); "
             f"names are read against {fallback.source} (--offline says so without asking)")  # fmt: skip
        return fallback
    return Catalog.served(resources, source=f"the apiserver at {configuration.host}")


def values_of(registry: Registry, names: Catalog, *, command: str) -> str:
    """What ``declop rbac ... --values`` writes for ``registry``'s handlers (``declop dev --node``
    installs the chart with it when no rbac-values.yaml sits beside the handlers)."""
    from declop.kube.rbac import values_yaml

    grants = registry.grants(names.resolve, cluster_scoped=names.cluster_scoped)
    return values_yaml(grants, webhooks=bool(registry.webhooks), command=command)


@click.command(
    cls=Command,
    examples=(
        "declop rbac handlers.py                          # a ClusterRole: watching all namespaces",
        "declop rbac handlers.py -n team-a --leader-elect # a Role in team-a, and one for the Lease",
        "declop rbac handlers.py --service-account ops:my-operator | kubectl apply -f -   # with bindings",
        "declop rbac handlers.py --values rbac-values.yaml   # helm install ... -f rbac-values.yaml",
    )
)
@click.argument("paths", nargs=-1, type=click.Path(), envvar=env("PATHS"))
@click.option("-m", "--module", "modules", multiple=True, envvar=env("MODULES"), help="Import handlers from a module (repeatable).")
@click.option("-n", "--namespace", "namespaces", multiple=True, envvar=env("NAMESPACES"), help="The operator watches only this namespace (repeatable): a Role in each instead of a ClusterRole.")
@click.option("--leader-elect/--no-leader-elect", default=False, envvar=env("LEADER_ELECT"), help="Grant the leader-election Lease.")
@click.option("--leader-election-id", default="declop", envvar=env("LEADER_ELECTION_ID"), show_default=True, help="The Lease name (granted by name).")
@click.option("--leader-election-namespace", default=None, envvar=env("LEADER_ELECTION_NAMESPACE"), help="The Leases' namespace (default: the service account's, else default).")
@click.option("--shards", type=int, default=None, envvar=env("SHARDS"), help="Grant the sharding Leases (declop run --shards).")
@click.option("--webhook-name", default="declop", show_default=True, envvar=env("WEBHOOK_NAME"), help="Name of the webhook configurations (granted by name) and of the CA Secret NAME-webhook-ca.")
@click.option("--webhook-namespace", default=None, envvar=env("WEBHOOK_NAMESPACE"), help="Namespace of the webhook CA Secret (default: the service account's, else default).")
@click.option("--webhook-cert-dir", default=None, envvar=env("WEBHOOK_CERT_DIR"), help="Webhook certificates are mounted: no CA Secret is granted.")
@click.option("--metrics-secure", "metrics_secure", is_flag=True, envvar=env("RBAC_METRICS_SECURE"), help="Grant what secure metrics check callers with (declop run --metrics-port, HTTPS by default): create on tokenreviews and subjectaccessreviews.")
@click.option("--name", "role_name", default="declop", show_default=True, envvar=env("RBAC_NAME"), help="Name of the Roles/ClusterRoles (and bindings).")
@click.option("--service-account", default=None, envvar=env("RBAC_SERVICE_ACCOUNT"), help="NAMESPACE:NAME of the ServiceAccount to bind the roles to (default: no bindings).")
@click.option("--kubeconfig", type=click.Path(), default=None, envvar=env("KUBECONFIG"), help="Kubeconfig whose apiserver's discovery reads the names (default: $KUBECONFIG, then in-cluster, then ~/.kube/config; none: Kubernetes' standard resources).")
@click.option("--context", "context", default=None, envvar=env("CONTEXT"), help="Kubeconfig context to use.")
@click.option("--offline", is_flag=True, envvar=env("RBAC_OFFLINE"), help="Ask no cluster: read names against Kubernetes' standard resources and the typed models.")
@click.option("--values", "values_file", default=None, type=click.Path(), envvar=env("RBAC_VALUES"), help="Write Helm values for charts/declop (rbac.generated, and webhooks) to this file instead of printing manifests.")
def rbac(**kw: Any) -> None:
    """Print the RBAC the handlers need as YAML: exactly the verbs declop sends, per resource.

    Every source (primary, owns=, watches=, indexes) gets get/list/watch; the primary patch with a
    finalizer and /status patch/update when it is a custom resource; owns= children
    create/update/patch/delete (and the primary's /finalizers update for blockOwnerDeletion);
    Events create/patch (in namespace default for a cluster-scoped primary, where its Events
    go); Leases, webhook configurations and the CA Secret by name; and each permissions= entry.
    Names are read as declop run reads them: from the apiserver's discovery when one answers,
    else from Kubernetes' standard resources; cluster-scoped ones (nodes, a typed model with
    scope="Cluster") go in a ClusterRole, also with -n. See docs/rbac.md.
    """
    from declop.kube.rbac import manifests, reasons, to_yaml

    setup_logging("plain", 0, True)
    if not kw["paths"] and not kw["modules"]:
        raise ConfigError("no handlers: pass handler files (declop rbac handlers.py) or -m module")
    load(kw["paths"], kw["modules"])
    require_registrations(kw, default_registry)
    account = None
    if kw["service_account"]:
        sa_ns, colon, sa_name = kw["service_account"].partition(":")
        if not (colon and sa_ns and sa_name):
            raise BadOptions(f"--service-account must be NAMESPACE:NAME, e.g. ops:my-operator, got {kw['service_account']!r}")
        account = (sa_ns, sa_name)
    own = account[0] if account else "default"
    lease_ns = kw["leader_election_namespace"] or own
    names = catalog(kw["kubeconfig"], kw["context"], offline=kw["offline"])
    command = " ".join(["declop", "rbac", *kw["paths"], *(f"-m {m}" for m in kw["modules"])])
    if kw["values_file"]:
        text = values_of(default_registry, names, command=command)
        with open(kw["values_file"], "w") as f:
            f.write(text)
        click.echo(f"wrote {kw['values_file']}", err=True)
        return
    grants = default_registry.grants(
        names.resolve,
        leader=(lease_ns, kw["leader_election_id"]) if kw["leader_elect"] else None,
        shards=lease_ns if kw["shards"] else None,
        webhook_name=kw["webhook_name"],
        ca_secret_namespace=None if kw["webhook_cert_dir"] else (kw["webhook_namespace"] or own),
        metrics_auth=kw["metrics_secure"],
        cluster_scoped=names.cluster_scoped,
    )
    namespaces = tuple(dict.fromkeys(n for n in kw["namespaces"] if n))
    docs = manifests(grants, name=kw["role_name"], namespaces=namespaces, service_account=account, cluster_scoped=names.cluster_scoped)
    header = f"Generated by `{command}`: the RBAC of these handlers; see docs/rbac.md."
    click.echo(to_yaml(docs, header=header, notes=reasons(grants)), nl=False)
