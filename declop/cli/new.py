"""``declop new``: a small operator project for a new custom resource kind."""

from __future__ import annotations

import click

from declop.cli.help import Command

__all__ = ["new"]


@click.command(cls=Command)
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
