"""``declop dev``: a local control plane, the -f manifests and the typed models' CRDs applied,
and the handlers run on it — restarted in this process when a handler file is saved, or, with
``--node``, run in-cluster as the chart's Pod on a real node (docs/dev.md)."""

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import click

from declop.cli.exits import BadOptions, setup_logging, state
from declop.cli.flags import check_lease_timings, options_from, run_options
from declop.cli.help import Command, env
from declop.cli.run import require_registrations
from declop.errors import ConfigError
from declop.kube.transport import load_configuration
from declop.loader import expand, load
from declop.registry import Registry, default_registry

if TYPE_CHECKING:
    # `declop run` never needs these: the dev loop and the CRD generator load pydantic and YAML,
    # so the commands that use them import them when they run
    from declop.dev.loop import Sources

__all__ = ["dev", "node_rbac"]


@click.command(
    cls=Command,
    examples=(
        "declop dev                          # only the control plane; prints export KUBECONFIG=...",
        "declop dev examples/pods.py         # the control plane and the seed's handlers on it",
        "declop dev examples/greeting/handlers.py -f examples/greeting/crd.yaml   # apply the CRD first; reload on save",
        "declop dev examples/pods.py --metrics-port 8080   # curl localhost:8080/metrics",
        "sudo -E declop dev --node examples/pods.py        # with a real node; handlers in-cluster",
        "sudo declop dev --node --clean                    # only remove what a killed node left",
    ),
)
@run_options
@click.option("-f", "--file", "files", multiple=True, type=click.Path(), envvar=env("DEV_FILES"), help="Apply this YAML file or folder of them (multi-document) before the operator starts; CRDs are Established first (repeatable).")
@click.option("--reload/--no-reload", "reload", default=None, envvar=env("DEV_RELOAD"), help="Restart the operator when a .py file of PATHS (or in their folders) is saved, re-apply -f files when they change. On by default; not with --node.")
@click.option("--kubeconfig-out", type=click.Path(), default=".declop/kubeconfig", show_default=True, envvar=env("KUBECONFIG_OUT"), help="Where to write the admin kubeconfig.")
@click.option("--no-controller-manager", is_flag=True, envvar=env("NO_CONTROLLER_MANAGER"), help="Run only etcd and kube-apiserver (faster start, no GC).")
@click.option("--node", is_flag=True, envvar=env("DEV_NODE"), help="Also run a real node (containerd + kubelet; needs root) and run PATHS in-cluster: declop's image (and yours FROM it, when a Dockerfile sits beside PATHS), Helm chart, handlers from a ConfigMap; RBAC from the rbac-values.yaml beside PATHS, else the one `declop rbac PATHS --values` generates (least privilege).")
@click.option("--clean", is_flag=True, help="With --node: only remove what a killed `declop dev --node` (or `make run`) left on the host — its processes, mounts, links, iptables rules, sysctls and folders, one line each — then exit. Every --node start does this first.")
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
    setup_logging(kw["log_format"], kw["verbose"], kw["quiet"])
    if not kw["verbose"]:
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # not a line per saved file
    check_lease_timings(kw)
    from declop.dev.loop import DevLoop, Sources
    from declop.dev.manifests import from_models, read as read_manifests
    from declop.testing.cluster.controlplane import ControlPlane

    if kw["clean"]:
        _clean(kw)
        return
    if kw["node"]:
        if kw["reload"]:
            raise BadOptions("--reload restarts handlers in this process; with --node they run in-cluster: drop --reload (or --node)")
        if kw["no_controller_manager"]:
            raise BadOptions("--node needs the controller-manager (ServiceAccounts, ReplicaSets); drop --no-controller-manager")
        if kw["modules"]:
            raise BadOptions("--node runs handler files from a ConfigMap; -m modules belong in your own image (docs/deploy.md)")
        from declop.testing.cluster.node import Node

        from declop.testing.cluster import recovery

        Node(ControlPlane()).check()  # no root, no packages, another node: one line before anything starts
        recovery.recover(echo=_echo)  # what a killed node left, before minutes of image building

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
            require_registrations(kw, default_registry)
        # a model the CRD cannot be made of: one line before anything starts
        crds = from_models(loaded, default_registry, webhook_service=kw["webhook_service"], webhook_url=kw["webhook_url"], webhook_port=kw["webhook_port"])
    out = os.path.abspath(kw["kubeconfig_out"])
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()
        raise KeyboardInterrupt

    # SIGHUP too: a closed terminal stops the node as Ctrl-C does, undoing its changes to the host
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
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
            for sig in previous:
                signal.signal(sig, signal.default_int_handler)
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
                    configuration, options_from(kw, secure_by_default=False), sources, reload=reload, loaded=not reload, modules=loaded, echo=_echo
                )
                state["exit_code"] = asyncio.run(_serve_until_signal(devloop.run))
                return
            elif kw["files"] or crds:
                _apply_once(configuration, kw, sources, loaded)
            click.echo("Press Ctrl-C to stop.", err=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started:  # also after an error: its one line follows this one
            click.echo("Control plane stopped.", err=True)


def _clean(kw: dict[str, Any]) -> None:
    """``dev --node --clean``: undo what killed node runs left (one line each), start nothing."""
    if not kw["node"]:
        raise BadOptions("--clean removes what a killed local node left: give it with --node (declop dev --node --clean)")
    if kw["paths"] or kw["modules"] or kw["files"]:
        raise BadOptions("--clean only cleans up and starts nothing: drop PATHS, -m and -f")
    if os.geteuid() != 0:
        raise ConfigError("cleaning up after a local node needs root (its processes, mounts, iptables rules and sysctls are root's); run it as root")
    from declop.testing.cluster import recovery

    if recovery.recover(echo=_echo) == 0:
        _echo("Nothing to clean up: no killed declop node left anything on this host.")


def _find_module(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package is missing, or a malformed name
        return None


def _apply_once(configuration: Any, kw: dict[str, Any], sources: Sources, loaded: Sequence[Any]) -> None:
    """Apply the -f files and the CRDs of the models of the ``loaded`` handler modules."""
    from declop.dev.loop import DevLoop

    devloop = DevLoop(configuration, options_from(kw), sources, reload=False, loaded=True, modules=loaded, echo=_echo)
    asyncio.run(devloop.apply_manifests())


def _echo(line: str) -> None:
    click.echo(line, err=True)


async def _serve_until_signal(run: Any) -> int:
    """``await run(stop)`` with SIGTERM/SIGINT/SIGHUP setting ``stop``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    result: int = await run(stop)
    return result


def _dev_image(kw: dict[str, Any]) -> Any:
    """The images for ``dev --node``: declop's (built once per content, from this checkout or the
    installed package) and the project's own ``FROM`` it when a Dockerfile sits beside PATHS."""
    from declop.testing.cluster.incluster import dev_images

    return dev_images(kw["paths"], echo=_echo)


def node_rbac(cp: Any, paths: Sequence[str], registry: Registry | None = None) -> Path:
    """The chart values ``dev --node`` installs the operator's RBAC from: the ``rbac-values.yaml``
    beside the handlers, else what ``declop rbac PATHS --values`` writes for the handlers loaded
    in ``registry`` (the default one: ``dev --node`` loaded them), names read against the dev
    cluster as that command reads them — least privilege, never everything."""
    from declop.cli.rbac import catalog, values_of
    from declop.testing.cluster.incluster import RBAC_VALUES, project_rbac

    given = project_rbac(paths)
    if given is not None:
        return given
    command = shlex.join(["declop", "rbac", *paths])
    names = catalog(cp.kubeconfig_path, echo=_echo)
    generated = Path(cp.tmp_dir) / RBAC_VALUES
    generated.write_text(values_of(registry if registry is not None else default_registry, names, command=command))
    _echo(f"No {RBAC_VALUES} beside the handlers: the RBAC `{command} --values` generates ({generated})")
    return generated


def _run_in_cluster(cp: Any, kw: dict[str, Any], images: Any) -> None:
    """Import the images, helm install the chart with PATHS as handlers, follow the operator's logs."""
    import subprocess

    from declop.assets.files import chart_dir
    from declop.testing.cluster.incluster import handler_files, install_operator

    assert cp.node is not None and images is not None
    for tar in images.tars:
        cp.node.import_image(tar)
    rbac = node_rbac(cp, kw["paths"])
    click.echo(f"Installing the chart (release declop, namespace declop-system, image {images.runs}, RBAC from {rbac}) and waiting for the Pod to be Ready…", err=True)
    install_operator(cp, chart_dir(), handler_files(kw["paths"]), image=images.runs, rbac_values=rbac)
    click.echo("Operator running in-cluster; its logs follow (kubectl logs -n declop-system deploy/declop -f). Ctrl-C stops everything.", err=True)
    sys.stdout.flush()
    follow = ["kubectl", "logs", "-n", "declop-system", "deploy/declop", "-f"]
    while True:  # a container restart ends `logs -f`: follow the new container
        subprocess.run(follow, env=cp.env(), check=False)
        threading.Event().wait(1.0)

