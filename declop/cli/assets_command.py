"""``declop assets``: build the control plane's binaries, or print their folder (a module name that
is not ``assets``, the package it drives)."""

from __future__ import annotations

import click

from declop.cli.help import Group

__all__ = ["assets"]


@click.group(cls=Group, short_help="Build the control plane's binaries, or print their folder.")
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
