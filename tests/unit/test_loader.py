"""declop.loader: importing handler files, directories and modules; every failure one ConfigError line."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import declop.registry as registry_module
from declop.errors import ConfigError, RegistrationError
from declop.loader import HandlerDirs, load
from declop.registry import Registry

HANDLER = """\
import declop

REG = declop.registry.Registry()


@declop.reconciler("pods", registry=REG)
def {name}(request, **_):
    return None
"""


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what loading does to sys.path and sys.modules."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, HandlerDirs)])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def default(monkeypatch: pytest.MonkeyPatch) -> Registry:
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    return fresh


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def one_line_config_error(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    message = str(exc.value)
    assert message
    assert "\n" not in message
    return message


# -- files --------------------------------------------------------------------------------


def test_loading_a_file_registers_its_reconcilers(tmp_path: Path) -> None:
    path = write(tmp_path / "handlers.py", HANDLER.format(name="example"))
    (module,) = load([str(path)])
    assert [r.name for r in module.REG.registrations] == ["example"]
    assert module.REG.registrations[0].fn is module.example
    assert module.__file__ == str(path)


def test_loading_a_file_uses_the_default_registry(tmp_path: Path, default: Registry) -> None:
    path = write(
        tmp_path / "handlers.py",
        """\
        import declop

        @declop.reconciler("configmaps", finalizer="example.com/x")
        def watch_configmaps(obj, phase):
            pass
        """,
    )
    load([str(path)])
    assert [(r.name, r.resource) for r in default.registrations] == [
        ("watch_configmaps", "configmaps")
    ]


def test_a_file_can_import_its_siblings(tmp_path: Path) -> None:
    sibling = f"sibling_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{sibling}.py", "VALUE = 42\n")
    path = write(tmp_path / "handlers.py", f"from {sibling} import VALUE\n")
    (module,) = load([str(path)])
    assert module.VALUE == 42
    assert str(tmp_path) not in sys.path  # served by the finder, after everything installed


def test_a_handler_folder_never_shadows_installed_modules(tmp_path: Path) -> None:
    """A folder with yaml.py and json.py: both load as handler files, but ``import yaml`` and
    ``import json`` — in the handlers and in the kubernetes package — get the real ones."""
    import json as real_json

    folder = tmp_path / "handlers"
    for stem in ("yaml", "json"):
        write(folder / f"{stem}.py", f"import declop\nIMPOSTOR = True\nREG = declop.registry.Registry()\n\n@declop.reconciler('pods', registry=REG)\ndef {stem}_handler(**_):\n    return None\n")
    write(folder / "uses.py", "import json, yaml\nJSON, YAML = json, yaml\n")
    for name in ("yaml", "kubernetes.config.kube_config"):
        sys.modules.pop(name, None)  # imported afresh after the folder is loaded
    modules = load([str(folder)])
    assert [m.__name__.split("_")[2] for m in modules] == ["json", "uses", "yaml"]
    assert modules[0].IMPOSTOR and modules[2].IMPOSTOR  # the handler files did run
    assert modules[1].JSON is real_json and modules[1].YAML.safe_load("a: 1") == {"a": 1}
    import kubernetes.config.kube_config as kube_config  # imports yaml itself

    assert not hasattr(kube_config.yaml, "IMPOSTOR")
    assert kube_config.yaml.safe_dump({"a": 1}) == "a: 1\n"


def test_each_file_of_a_folder_is_imported_exactly_once(tmp_path: Path) -> None:
    """``import helpers`` from siblings and the folder's own turn give one module, executed once —
    whichever comes first."""
    folder = tmp_path / "handlers"
    stem = f"helpers_{tmp_path.name.replace('-', '_')}"
    runs = tmp_path / "runs.txt"
    write(folder / f"{stem}.py", f"open({str(runs)!r}, 'a').write('x')\n")
    write(folder / "a.py", f"import {stem}\nH = {stem}\n")  # before the helper's turn
    write(folder / "z.py", f"import {stem}\nH = {stem}\n")  # after it
    a, helpers, z = load([str(folder)])
    assert runs.read_text() == "x"
    assert a.H is helpers is z.H


def test_a_file_named_twice_in_one_load_is_executed_once(tmp_path: Path) -> None:
    path = write(tmp_path / "handlers.py", HANDLER.format(name="example"))
    first, second = load([str(path), str(path)])
    assert first is second


def test_each_load_of_a_file_registers_into_the_default_registry_of_the_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """testing.md's recipe — a fresh default registry, then ``load`` — works for every test of a
    process, not only the first to load the file (issue 41)."""
    path = write(tmp_path / "handlers.py", "import declop\n\n@declop.reconciler('configmaps')\ndef greet(**_):\n    return None\n")
    for _ in range(2):
        fresh = Registry()
        monkeypatch.setattr(registry_module, "default_registry", fresh)
        (module,) = load([str(path)])
        assert [r.name for r in fresh.registrations] == ["greet"]
        assert fresh.registrations[0].fn is module.greet


def test_fresh_executes_a_file_the_process_imported_by_a_plain_import_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scaffolded project's tests `import handlers` (into the default registry), then its sim
    test loads handlers.py into a registry of its own: without fresh, the imported module was
    taken as it was and the own registry got nothing ("registered no reconciler")."""
    path = write(tmp_path / "handlers.py", "import declop\n\n@declop.reconciler('configmaps')\ndef greet(**_):\n    return None\n")
    monkeypatch.setattr(registry_module, "default_registry", Registry())
    sys.path.insert(0, str(tmp_path))
    import handlers  # type: ignore[import-not-found]  # the plain import a project's test does

    own = Registry()
    monkeypatch.setattr(registry_module, "default_registry", own)
    (taken,) = load([str(path)])
    assert taken is handlers and not own.registrations  # without fresh: the imported module, as it is
    (module,) = load([str(path)], fresh=True)
    assert module is not handlers and [r.fn for r in own.registrations] == [module.greet]
    assert sys.modules["handlers"] is handlers  # the project's own import is untouched


def test_a_second_load_executes_a_sibling_imported_file_afresh_once(tmp_path: Path) -> None:
    folder = tmp_path / "handlers"
    stem = f"helpers_{tmp_path.name.replace('-', '_')}"
    runs = tmp_path / "runs.txt"
    write(folder / f"{stem}.py", f"open({str(runs)!r}, 'a').write('x')\n")
    write(folder / "a.py", f"import {stem}\nH = {stem}\n")
    a1, h1 = load([str(folder)])
    a2, h2 = load([str(folder)])
    assert runs.read_text() == "xx" and a2.H is h2 and h2 is not h1


def test_files_with_the_same_name_in_different_directories_are_distinct(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "handlers.py", "WHO = 'a'\n")
    b = write(tmp_path / "b" / "handlers.py", "WHO = 'b'\n")
    mod_a, mod_b = load([str(a), str(b)])
    assert (mod_a.WHO, mod_b.WHO) == ("a", "b")
    assert mod_a.__name__ != mod_b.__name__


def test_dashes_and_dots_in_file_names(tmp_path: Path) -> None:
    path = write(tmp_path / "my-handlers.v2.py", "X = 1\n")
    (module,) = load([str(path)])
    assert module.X == 1
    assert module.__name__.startswith("declop_handlers_my_handlers_v2_")


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(ConfigError) as info:
        load([str(missing)])
    message = one_line_config_error(info)
    assert message.startswith(f"no such file: {missing}")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.py", "import declop\n\ndef handler(:\n    pass\n")
    with pytest.raises(ConfigError) as info:
        load([str(path)])
    message = one_line_config_error(info)
    assert f"{path}:3" in message
    assert message.startswith("syntax error in ")
    assert isinstance(info.value.__cause__, SyntaxError)


def test_exception_while_importing(tmp_path: Path) -> None:
    path = write(tmp_path / "raises.py", "import declop\nVALUE = 1 / 0\n")
    with pytest.raises(ConfigError) as info:
        load([str(path)])
    message = one_line_config_error(info)
    assert message == f"importing {path} failed: ZeroDivisionError: division by zero"
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_failed_import_can_be_retried_after_a_fix(tmp_path: Path) -> None:
    path = write(tmp_path / "flaky.py", "raise RuntimeError('first')\n")
    with pytest.raises(ConfigError, match="RuntimeError: first"):
        load([str(path)])
    write(path, "OK = True\n")
    (module,) = load([str(path)])
    assert module.OK is True


def test_registration_error_in_a_file_passes_through(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad_args.py",
        """\
        import declop

        @declop.reconciler("pods", registry=declop.registry.Registry())
        def handler(request, spec):
            pass
        """,
    )
    with pytest.raises(RegistrationError, match=r"takes 'spec', which Kopf passes and declop does not: .*obj\['spec'\]"):
        load([str(path)])


def test_system_exit_is_not_swallowed(tmp_path: Path) -> None:
    path = write(tmp_path / "exits.py", "raise SystemExit(3)\n")
    with pytest.raises(SystemExit):
        load([str(path)])


def test_non_py_path(tmp_path: Path) -> None:
    path = write(tmp_path / "handlers.txt", "X = 1\n")
    with pytest.raises(ConfigError) as info:
        load([str(path)])
    message = one_line_config_error(info)
    assert message == f"{path} is not a .py file; for a module use -m {path}"


# -- directories --------------------------------------------------------------------------


def test_directory_without_py_files(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    d.mkdir()
    write(d / "README.md", "hi\n")
    write(d / "_private.py", "X = 1\n")
    with pytest.raises(ConfigError) as info:
        load([str(d)])
    assert one_line_config_error(info) == f"no .py files in directory {d}"


def test_directory_loads_every_py_file_sorted(tmp_path: Path) -> None:
    d = tmp_path / "handlers"
    log = tmp_path / "order.txt"
    for name in ["b_second.py", "a_first.py", "c_third.py"]:
        write(d / name, f"with open({str(log)!r}, 'a') as f:\n    f.write({name!r} + '\\n')\n")
    write(d / "_skipped.py", "raise RuntimeError('must not be imported')\n")
    write(d / ".hidden.py", "raise RuntimeError('must not be imported')\n")
    write(d / "notes.txt", "not python\n")
    (d / "package.py").mkdir()  # a directory named like a file is skipped
    modules = load([str(d)])
    assert [Path(m.__file__).name for m in modules] == ["a_first.py", "b_second.py", "c_third.py"]
    assert log.read_text().split() == ["a_first.py", "b_second.py", "c_third.py"]


def test_paths_then_modules_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = f"pkg_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / "mods" / pkg / "__init__.py", "")
    write(tmp_path / "mods" / pkg / "handlers.py", "WHO = 'module'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    path = write(tmp_path / "file.py", "WHO = 'file'\n")
    loaded = load([str(path)], [f"{pkg}.handlers"])
    assert [m.WHO for m in loaded] == ["file", "module"]
    assert loaded[1].__name__ == f"{pkg}.handlers"


# -- modules ------------------------------------------------------------------------------


def test_unknown_module() -> None:
    with pytest.raises(ConfigError) as info:
        load(modules=["declop_no_such_module_xyz.handlers"])
    message = one_line_config_error(info)
    assert (
        message
        == "no module named 'declop_no_such_module_xyz.handlers'; is it installed or on PYTHONPATH?"
    )
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_module_with_a_missing_dependency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"needs_dep_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{name}.py", "import declop_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load(modules=[name])
    message = one_line_config_error(info)
    assert message.startswith(f"importing {name} failed: ModuleNotFoundError:")
    assert "declop_missing_dependency_xyz" in message


def test_module_whose_missing_dependency_is_a_prefix_of_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kopf_handlers`` exists but imports a missing ``kopf``: the dependency is missing, not the module."""
    dep = f"dep_{tmp_path.name.replace('-', '_')}"
    name = f"{dep}_handlers"
    write(tmp_path / f"{name}.py", f"import {dep}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load(modules=[name])
    message = one_line_config_error(info)
    assert message == f"importing {name} failed: ModuleNotFoundError: No module named '{dep}'"


def test_missing_parent_package_is_reported_as_the_module() -> None:
    with pytest.raises(ConfigError, match="no module named 'declop_no_such_pkg_xyz.sub.handlers'"):
        load(modules=["declop_no_such_pkg_xyz.sub.handlers"])


def test_multi_line_exception_message_becomes_one_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "multiline.py", "raise ValueError('bad config\\n  in line 2\\n  in line 3')\n"
    )
    with pytest.raises(ConfigError) as info:
        load([str(path)])
    message = one_line_config_error(info)
    assert message.startswith(f"importing {path} failed: ValueError: bad config")
    assert isinstance(info.value.__cause__, ValueError)


def test_module_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"raising_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{name}.py", "raise ValueError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load(modules=[name])
    assert one_line_config_error(info) == f"importing {name} failed: ValueError: no config"


def test_module_with_syntax_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"syntax_{tmp_path.name.replace('-', '_')}"
    path = write(tmp_path / f"{name}.py", "x = 1\ny = (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load(modules=[name])
    message = one_line_config_error(info)
    assert message.startswith(f"syntax error in {path}:")


def test_nothing_to_load() -> None:
    assert load() == []


# -- expand, unload and reloading (declop dev) ------------------------------------------------


def test_expand_lists_the_files_without_importing(tmp_path: Path) -> None:
    folder = tmp_path / "ops"
    write(folder / "b.py", "raise SystemExit('never imported')\n")
    write(folder / "a.py", "")
    single = write(tmp_path / "handlers.py", "")
    from declop.loader import expand

    assert expand([str(single), str(folder)]) == [str(single), str(folder / "a.py"), str(folder / "b.py")]
    with pytest.raises(ConfigError, match="no such file"):
        expand([str(tmp_path / "missing.py")])


def test_unload_then_load_executes_the_edited_files_afresh(tmp_path: Path) -> None:
    from declop.loader import unload

    sibling = f"helpers_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{sibling}.py", "GREETING = 'Hello'\n")
    path = write(tmp_path / "handlers.py", f"from {sibling} import GREETING\n")
    (first,) = load([str(path)])
    assert first.GREETING == "Hello"
    # same size and (very likely) the same second: the bytecode cache could not tell them apart
    write(tmp_path / f"{sibling}.py", "GREETING = 'Howdy'\n")
    gone = unload()
    assert sibling in gone and first.__name__ in gone
    (second,) = load([str(path)])
    assert second is not first
    assert second.GREETING == "Howdy"
    assert not (tmp_path / "__pycache__").exists()  # compiled from source, nothing written


def test_unload_keeps_installed_modules_and_what_was_imported_before(tmp_path: Path) -> None:
    from declop.loader import unload

    package = f"pkg_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / package / "__init__.py", "")
    write(tmp_path / package / "part.py", "X = 1\n")
    path = write(tmp_path / "handlers.py", f"import json\nimport {package}.part\n")
    load([str(path)])
    import json

    gone = unload()
    assert {package, f"{package}.part"} <= set(gone)
    assert "json" not in gone and sys.modules["json"] is json
    assert "declop" not in gone and "declop.loader" in sys.modules


def test_unload_forgets_named_modules_so_they_register_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default: Registry) -> None:
    from declop.loader import unload

    name = f"mod_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{name}.py", HANDLER.format(name="by_module").replace(", registry=REG", ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    load(modules=[name])
    assert [r.name for r in default.registrations] == ["by_module"]
    default.clear()
    assert unload([name]) == [name]
    load(modules=[name])
    assert [r.name for r in default.registrations] == ["by_module"]


def test_a_load_that_failed_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    from declop.loader import unload

    sibling = f"part_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / f"{sibling}.py", "VALUE = 1\n")
    path = write(tmp_path / "handlers.py", f"import {sibling}\nraise RuntimeError('half-way')\n")
    with pytest.raises(ConfigError, match=r"RuntimeError: half-way"):
        load([str(path)])
    unload()
    write(tmp_path / "handlers.py", f"import {sibling}\nVALUE = {sibling}.VALUE\n")
    write(tmp_path / f"{sibling}.py", "VALUE = 2\n")
    (module,) = load([str(path)])
    assert module.VALUE == 2


def test_run_reconcile_finds_a_function_of_an_earlier_load_of_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a second load, the first load's function is the same def: run_reconcile finds its
    newest registration instead of saying it is not registered."""
    from declop.testing import run_reconcile

    path = write(tmp_path / "greeter.py", "import declop\n\n@declop.reconciler('configmaps')\ndef greeter(logger, **_):\n    logger.info('Hello')\n")
    monkeypatch.setattr(registry_module, "default_registry", Registry())
    (first,) = load([str(path)])
    (second,) = load([str(path)])
    assert first.greeter is not second.greeter
    assert run_reconcile(first.greeter, "default/x").messages == ("Hello",)


def test_a_file_loaded_twice_into_one_registry_keeps_one_of_each_index_and_transform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fresh-clone run caught it: a second load of examples/crd/handlers.py into the same
    default registry added its declop.index again, and every fake store then refused the
    duplicate. The same index (same def or lambda, its file run afresh) replaces the old one."""
    path = write(
        tmp_path / "indexed.py",
        "import declop\n\n"
        "declop.index('configmaps', 'by_app', lambda o: [o['metadata'].get('labels', {}).get('app')])\n"
        "declop.transform('configmaps', lambda o: o)\n\n"
        "@declop.reconciler('configmaps')\ndef indexed(**_):\n    return None\n",
    )
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    load([str(path)])
    (second,) = load([str(path)])
    assert [(ix.resource, ix.name) for ix in fresh.indexes] == [("configmaps", "by_app")]
    assert len(fresh.transforms) == 1 and len(fresh) == 1
    with pytest.raises(RegistrationError, match="an index named 'by_app' on 'configmaps' is already registered"):
        fresh.index("configmaps", "by_app", lambda o: [])


def test_every_kind_of_registration_survives_a_second_load_into_one_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon, a timer, a probe, a wrapped reconciler and a validator, loaded twice into one
    registry: one of each, the newest functions (a daemon used to be refused as a name taken)."""
    path = write(
        tmp_path / "kinds.py",
        "import declop\n\n"
        "@declop.daemon('configmaps')\nasync def d(stop, **_):\n    await stop.wait()\n\n"
        "@declop.timer('configmaps', interval=5)\ndef t(**_):\n    pass\n\n"
        "@declop.on_probe\ndef p(**_):\n    return 1\n\n"
        "@declop.reconciler('configmaps', field='data', return_to=True)\ndef s(steps, old, **_):\n    return None\n\n"
        "@declop.validator('configmaps', field='data')\ndef v(**_):\n    pass\n",
    )
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    load([str(path)])
    (second,) = load([str(path)])
    assert sorted(r.name for r in fresh.registrations) == ["d", "s", "t"]
    assert sorted(h.name for h in fresh.hooks) == ["daemons of d", "p"]
    assert [w.fn for w in fresh.webhooks] == [second.v]
