"""``declop crd``: the CustomResourceDefinitions of the typed models handler files define or import."""

from __future__ import annotations

import click

from declop.cli.help import Command, env
from declop.errors import ConfigError
from declop.loader import load
from declop.registry import default_registry

__all__ = ["crd"]


@click.command(
    cls=Command,
    examples=(
        "declop crd handlers.py                           # the CRDs of the models handlers.py defines or imports",
        "declop crd handlers.py | kubectl apply -f -      # install them",
        "declop crd handlers/ -o crds.yaml                # every .py file in handlers/, into a file",
        "declop crd handlers.py --webhook-service operators/widget-operator-webhook   # conversion via this Service",
    )
)
@click.argument("paths", nargs=-1, type=click.Path(), envvar=env("PATHS"))
@click.option("-m", "--module", "modules", multiple=True, envvar=env("MODULES"), help="Import models and handlers from a module (repeatable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, envvar=env("CRD_OUTPUT"), help="Write the YAML to this file instead of stdout.")
@click.option("--webhook-service", default=None, envvar=env("WEBHOOK_SERVICE"), help="NAMESPACE/NAME[:PORT]: the Service the apiserver calls a kind's conversion webhook through (as for declop run).")
@click.option("--webhook-url", default=None, envvar=env("WEBHOOK_URL"), help="Base URL of the conversion webhook when there is no --webhook-service (default: https://127.0.0.1:PORT).")
@click.option("--webhook-port", type=int, default=9443, show_default=True, envvar=env("WEBHOOK_PORT"), help="The PORT of the default --webhook-url.")
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
