"""The import layering of declop: each module may import only modules listed above it, and
each package's modules sit together in that list, so packages form layers too.

Every import counts — relative (``from .x import y``, ``from . import x``, ``from ..x import y``)
and absolute (``import declop.x``, ``from declop.x import y``), at module level or inside a
function or an ``if TYPE_CHECKING:`` block. ``from . import name`` where ``name`` is not a module
(``from . import __version__``) is an import of the package ``__init__`` itself.

Packages: a subpackage (``declop/queue/``) is listed by its name, then its modules; the entries of
one package are contiguous, so no module of a lower package imports one of a higher package and
no two packages import each other. A package's ``__init__`` holds its docstring (what it owns and
what it may import) and no imports — except a package that took the place of a module users
import from (:data:`FACADES`: ``from declop.manager import Manager`` stays the import): its
``__init__`` re-exports its ``__all__`` from the package's own modules, and imports nothing else.

Exceptions: the ``testing`` slot (any module of ``declop/testing/`` not listed by name, including
its ``__init__``) may import anything above ``cli`` plus every ``declop.testing`` module; the
top-level package ``__init__`` and ``__main__`` may import anything. Every module that exists must
be listed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import declop

PACKAGE_DIR = Path(declop.__file__).parent

#: top to bottom: a module may import only what is listed above it
ORDER = [
    # the base: no declop imports but each other's
    "version",
    "errors",
    "hints",
    "clock",
    "collector",
    "logs",
    "typed",
    "typed.dump",
    "typed.model",
    "typed.condition",
    "typed.schema",
    "typed.crd",
    "typed.view",
    "typed.status",
    "conditions",
    "queue",
    "queue.ratelimit",
    "queue.stats",
    "queue.workqueue",
    "queue.priority",
    "queue.batches",
    "kube",
    "kube.labels",
    "kube.fields",
    "kube.keys",
    "kube.resource",
    "kube.credentials",
    "kube.truststore",
    "kube.proxy",
    "kube.fencing",
    "kube.restconfig",
    "kube.kubeconfig",
    "kube.login",
    "kube.transport",
    "kube.discovery",
    "kube.apiresources",
    "kube.catalog",
    "kube.rbac",
    "kube.access",
    "leases",
    "leases.hashing",
    "leases.leader",
    "leases.ranges",
    "leases.members",
    "leases.shards",
    "leases.watchdog",
    "cache",
    "cache.store",
    "cache.backoff",
    "cache.stats",
    "cache.sharding",
    "cache.listing",
    "cache.watch",
    "cache.informer",
    "reconcile",
    "reconcile.result",
    "reconcile.trigger",
    "reconcile.predicates",
    "reconcile.mapping",
    "reconcile.finalizers",
    "reconcile._reads",
    "reconcile.client",
    "reconcile.ownership",
    "reconcile.events",
    "reconcile.registration",
    "reconcile._filters",
    "reconcile._keys",
    "reconcile._fence",
    "reconcile._call",
    "reconcile._preparation",
    "reconcile._outcome",
    "reconcile._run",
    "reconcile._leaving",
    "reconcile.controller",
    "lifecycle",
    "handlers",
    "handlers.changes",
    "handlers.returns",
    "handlers.timers",
    "handlers.daemons",
    "handlers.steps",
    "handlers.probing",
    "serving",
    "serving.http",
    "serving.probes",
    "serving.metricsauth",
    "serving.cert",
    "serving.metrics",
    "webhooks",
    "webhooks.decode",
    "webhooks.patch",
    "webhooks.admission",
    "webhooks.conversion",
    "webhooks.typed",
    "webhooks.declaration",
    "webhooks.configuration",
    "webhooks.certs",
    "webhooks.server",
    "webhooks.endpoint",
    "registry",
    "registry.options",
    "registry.calls",
    "registry.signatures",
    "registry.registry",
    "registry.decorators",
    "manager",
    "manager.options",
    "manager.loss",
    "manager.runnables",
    "manager.preflight",
    "manager.wiring",
    "manager.leadership",
    "manager.shutdown",
    "manager.process",
    "manager.embedded",
    "loader",
    "dev",
    "dev.manifests",
    "dev.loop",
    "dev.scaffold",
    "assets",
    "assets.files",
    # declop.testing: the fakes, then the real-cluster kit, then the simulation (the "testing" slot)
    "testing.fakes",
    "testing.fakes.resources",
    "testing.fakes.apiserver",
    "testing.fakes.client",
    "testing.fakes.listwatch",
    "testing.cluster",
    "testing.cluster.certs",
    "testing.cluster.process",
    "testing.cluster.faults",
    "testing.cluster.buildkit",
    "testing.cluster.image",
    "testing.cluster.image_cli",
    "testing.cluster.host",
    "testing.cluster.runrecord",
    "testing.cluster.recovery",
    "testing.cluster.node",
    "testing.cluster.controlplane",
    "testing.cluster.incluster",
    "testing.cluster.runner",
    "testing.cluster.plugin",
    "testing",  # the simulation (declop/testing/simulation/) and the testing package itself
    "cli",
    "cli.help",
    "cli.exits",
    "cli.flags",
    "cli.run",
    "cli.rbac",
    "cli.dev",
    "cli.crd",
    "cli.sim",
    "cli.new",
    "cli.assets_command",
    "cli.entry",
    "__init__",
    "__main__",
]
RANK = {name: i for i, name in enumerate(ORDER)}
UNRESTRICTED = {"__init__", "__main__"}
#: packages that replaced a module of the same import path: their ``__init__`` re-exports the
#: public names from the package's own modules (and imports nothing else)
FACADES = {"manager", "cli", "registry"}


def module_name(path: Path) -> str:
    """``declop/x.py`` → ``"declop.x"``; ``declop/testing/__init__.py`` → ``"declop.testing"``."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def module_exists(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    base = PACKAGE_DIR / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def slot(dotted: str) -> str | None:
    """The ORDER entry of a ``declop`` module, or None when it is not listed."""
    if dotted == "declop":
        return "__init__"
    rest = dotted.removeprefix("declop.")
    if rest in RANK and rest != "testing":
        return rest
    if rest == "testing" or rest.startswith("testing."):
        return "testing"
    return None


def imported_modules(source: str, this: str, package: bool) -> list[tuple[int, str]]:
    """``(line, dotted module)`` for every declop import in ``source`` (module ``this``)."""
    pkg = this if package else this.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "declop" or alias.name.startswith("declop."):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
            else:
                base = ""
            target = ".".join(p for p in (base, node.module or "") if p)
            if not (target == "declop" or target.startswith("declop.")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # `from . import x` / `from .pkg import mod` import the submodule when it is one
                found.append(
                    (node.lineno, sub if alias.name != "*" and module_exists(sub) else target)
                )
    return found


def declop_modules() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def allowed(importer: str, imported: str) -> bool:
    if importer in UNRESTRICTED:
        return True
    if importer in FACADES and imported.startswith(importer + "."):
        return True  # the package's __init__ re-exporting its own modules' names
    if importer == "testing":
        return RANK[imported] < RANK["testing"] or imported.startswith("testing")
    return RANK[imported] < RANK[importer]


MODULES = declop_modules()


def test_every_module_is_listed() -> None:
    unlisted = [str(p.relative_to(PACKAGE_DIR)) for p in MODULES if slot(module_name(p)) is None]
    assert unlisted == [], f"add these modules to ORDER in tests/test_layers.py: {unlisted}"


def test_the_package_is_found() -> None:
    names = {module_name(p) for p in MODULES}
    assert {"declop", "declop.errors", "declop.cache", "declop.testing"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_imports_only_modules_listed_above(path: Path) -> None:
    this = module_name(path)
    importer = slot(this)
    assert importer is not None, f"{this} is not listed in ORDER"
    violations = []
    for line, target in sorted(set(imported_modules(path.read_text(), this, is_package(path)))):
        imported = slot(target)
        if imported is None:
            violations.append(
                f"{path.relative_to(PACKAGE_DIR)}:{line} imports {target}, which is not a listed module"
            )
        elif target != this and not allowed(importer, imported):
            violations.append(
                f"{path.relative_to(PACKAGE_DIR)}:{line} imports {target} ({imported}), listed at or below {importer}"
            )
    assert not violations, "layering violations:\n" + "\n".join(violations)


# -- the checker itself ---------------------------------------------------------------------


def test_checker_resolves_every_import_form() -> None:
    source = """
import os
import declop
import declop.kube.keys, json
from declop.errors import ApiError
from .kube import labels
from . import __version__
from .cache.store import clone
from . import cache
from .testing.cluster import controlplane
from .testing.cluster.certs import generate
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .reconcile.client import Client

def later():
    from .manager import Manager
    import declop.loader
"""
    found = [target for _, target in imported_modules(source, "declop.x", package=False)]
    assert found == [
        "declop",
        "declop.kube.keys",
        "declop.errors",
        "declop.kube.labels",
        "declop",
        "declop.cache.store",
        "declop.cache",
        "declop.testing.cluster.controlplane",
        "declop.testing.cluster.certs",
        "declop.reconcile.client",
        "declop.manager",
        "declop.loader",
    ]


def test_checker_resolves_relative_imports_in_subpackages() -> None:
    source = "from ...manager import Manager\nfrom .certs import generate\nfrom . import plugin\n"
    assert [t for _, t in imported_modules(source, "declop.testing.cluster.runner", package=False)] == [
        "declop.manager",
        "declop.testing.cluster.certs",
        "declop.testing.cluster.plugin",
    ]
    assert [
        t
        for _, t in imported_modules(
            "from .cluster.controlplane import X\n", "declop.testing", package=True
        )
    ] == ["declop.testing.cluster.controlplane"]


def test_checker_rules() -> None:
    assert allowed("cache.store", "kube.keys")
    assert not allowed("kube.keys", "cache.store")
    assert not allowed("kube.keys", "kube.keys")
    assert allowed("cli", "testing.cluster.controlplane")
    assert allowed("cli", "testing")
    assert allowed("testing", "manager")
    assert allowed("testing", "testing.cluster.certs")
    assert not allowed("testing.cluster.node", "testing")  # the real-cluster kit never imports the simulation
    assert not allowed("testing.fakes.client", "testing.cluster.runner")
    assert allowed("testing", "testing")
    assert not allowed("testing", "cli")
    assert allowed("reconcile.controller", "cache.informer")
    assert not allowed("cache.informer", "reconcile.result")
    assert slot("declop.cache") == "cache"
    assert slot("declop.cache.store") == "cache.store"
    assert not allowed("testing.cluster.certs", "testing.cluster.controlplane")
    assert allowed("__init__", "cli")
    assert allowed("__main__", "cli")
    assert allowed("registry", "registry.decorators") and not allowed("registry.options", "registry.decorators")
    assert not allowed("registry", "manager")
    assert allowed("manager", "manager.process") and not allowed("manager.options", "manager.process")
    assert not allowed("manager", "loader")
    assert slot("declop") == "__init__"
    assert slot("declop.testing.simulation.world") == "testing"
    assert slot("declop.testing.cluster.certs") == "testing.cluster.certs"
    assert slot("declop.nonexistent") is None


# -- packages -------------------------------------------------------------------------------

PACKAGES = sorted(
    p.parent.relative_to(PACKAGE_DIR).as_posix().replace("/", ".")
    for p in PACKAGE_DIR.glob("*/__init__.py")
)


def test_the_packages_are_found() -> None:
    assert {"queue", "kube", "leases", "cache", "reconcile", "serving", "webhooks", "dev", "testing"} <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_is_one_layer(package: str) -> None:
    """Its entries are contiguous in ORDER: nothing of another package sits between them, so no
    lower package reaches into it and it reaches into no higher one."""
    ranks = sorted(i for i, name in enumerate(ORDER) if name == package or name.startswith(package + "."))
    assert ranks, f"{package} is not in ORDER"
    assert ranks == list(range(ranks[0], ranks[-1] + 1)), (
        f"{package}'s modules are not together in ORDER: "
        + ", ".join(ORDER[i] for i in range(ranks[0], ranks[-1] + 1))
    )


@pytest.mark.parametrize("package", sorted(set(PACKAGES) - {"testing", "assets"}))
def test_a_package_init_says_what_it_owns_and_imports_nothing(package: str) -> None:
    init = PACKAGE_DIR / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(init.read_text())
    doc = " ".join((ast.get_docstring(tree) or "").split())
    assert "May import" in doc, f"{init.relative_to(PACKAGE_DIR)}: the docstring says what the package owns and what it may import"
    imports = imported_modules(init.read_text(), f"declop.{package}", package=True)
    if package in FACADES:
        assert all(m.startswith(f"declop.{package}.") for _, m in imports), f"{package}/__init__.py imports only its own modules"
        reexported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        exported = next(
            (ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"), []
        )
        assert reexported == set(exported), f"{package}/__init__.py re-exports exactly its __all__"
    else:
        assert imports == []
    assert package in ORDER and all(
        ORDER.index(package) < ORDER.index(m) for m in ORDER if m.startswith(package + ".")
    ), f"list {package} before its modules"


def test_the_top_level_stays_small() -> None:
    """``ls declop/`` is the table of contents: capabilities and top-level roles only."""
    entries = [p.name for p in PACKAGE_DIR.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 27, sorted(entries)


#: a module longer than this says why in a ``# size:`` comment
MAX_LINES = 500


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_a_long_module_says_why(path: Path) -> None:
    text = path.read_text()
    if text.count("\n") > MAX_LINES:
        assert "# size:" in text, (
            f"{path.relative_to(PACKAGE_DIR)} has {text.count(chr(10))} lines: split it along a seam, "
            f"or say in a '# size:' comment why it is one piece"
        )


def test_test_modules_have_unique_basenames() -> None:
    """tests/ has no packages, so pytest imports each test module by its basename: two files
    with one name in two folders stop the whole run at collection ("import file mismatch")."""
    root = Path(__file__).resolve().parent.parent
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted([*root.joinpath("tests").rglob("test_*.py"), *root.joinpath("examples").rglob("test_*.py")]):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(root)} and {path.relative_to(root)}")
        seen.setdefault(path.name, path)
    assert not clashes, "rename one of: " + "; ".join(clashes)


def test_unit_tests_mirror_the_packages() -> None:
    """The test of ``declop/<package>/<module>.py`` is ``tests/unit/<package>/test_<module>[_topic].py``:
    found from the module's path, and no unit test of a packaged module sits elsewhere."""
    units = Path(__file__).resolve().parent / "unit"
    misplaced = []
    for path in sorted(units.rglob("test_*.py")):
        folder = path.parent.relative_to(units)
        package = PACKAGE_DIR / folder
        if folder.parts and not (package / "__init__.py").is_file():
            misplaced.append(f"{path.relative_to(units)}: declop/{folder} is not a package")
            continue
        stem = path.stem.removeprefix("test_")
        candidates = [stem[:i] for i in range(len(stem), 0, -1) if i == len(stem) or stem[i] == "_"]
        if not any((package / f"{c}.py").is_file() or (package / c / "__init__.py").is_file() for c in candidates):
            if folder.parts or not any(
                (PACKAGE_DIR / sub / f"{c}.py").is_file() for sub in PACKAGES for c in candidates
            ):
                continue  # a topic test (test_cli_help, test_pin_base): not one module's
            misplaced.append(f"{path.relative_to(units)}: the module is in a package; move it to tests/unit/<package>/")
        elif not folder.parts and any((PACKAGE_DIR / sub / f"{stem}.py").is_file() for sub in PACKAGES):
            misplaced.append(f"{path.relative_to(units)}: declop/{stem}.py is in a package")
    assert misplaced == []


@pytest.mark.parametrize(
    "path",
    [p for p in MODULES if module_name(p).startswith("declop.testing.simulation")],
    ids=lambda p: str(p.relative_to(PACKAGE_DIR)),
)
def test_the_simulation_never_imports_the_real_cluster_kit(path: Path) -> None:
    """declop/testing/ is three parts: fakes, the real-cluster kit, the simulation. The simulation
    sits in the ``testing`` slot (its reports and the world import each other), so this rule is
    stated here: it runs in one process on virtual time and starts nothing real."""
    imports = imported_modules(path.read_text(), module_name(path), is_package(path))
    assert [m for _, m in imports if m.startswith("declop.testing.cluster")] == []
