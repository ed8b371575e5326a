"""Loader: import handler files and modules so that their decorators register reconcilers.

- A file path is imported under a private module name (``declop_handlers_<stem>_<hash>``).
- A directory path imports every ``*.py`` file in it (sorted), as a ConfigMap mount provides them.
- ``-m pkg.module`` is imported by name.

Invariants (loader hygiene):
- a handler file never shadows an installed module: the handlers' directories are *not* put on
  ``sys.path``; a finder placed *last* on ``sys.meta_path`` serves their files and packages to
  ``import sibling`` only when nothing installed has that name. A handler folder with ``yaml.py``
  and ``json.py`` still gives the kubernetes package PyYAML and the stdlib ``json``;
- every file is executed exactly once per load, whichever comes first — ``import helpers``
  from a sibling, or the folder's own turn: both get the same module object; and afresh by each
  load, so its decorators register into the registry that is the default at that moment;
- handler files and their siblings are compiled from their source on every load: no
  ``__pycache__`` is read or written next to them, so an edit is never hidden by stale bytecode
  (two saves within one second with the same size look alike to the bytecode cache) and a
  read-only ConfigMap mount is not written to;
- :func:`unload` forgets exactly what was executed from the handlers' folders (never an
  installed module), so the next :func:`load` executes the files afresh (``declop dev`` reload).

Every failure becomes one :class:`~declop.errors.ConfigError` line (missing file, syntax error with
file and line, an exception raised while importing); the original exception is kept as
``__cause__`` for ``-v``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Iterable, Sequence

from declop.errors import ConfigError

__all__ = ["HandlerDirs", "expand", "load", "unload"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _module_name(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0].replace("-", "_").replace(".", "_")
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:8]
    return f"declop_handlers_{stem}_{digest}"


class _Existing(importlib.abc.Loader):
    """Gives ``import sibling`` the module a handler file was already loaded as."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed, under its private name


class _Source(importlib.machinery.SourceFileLoader):
    """Compiles a handler file from its source every time; bytecode is never read nor written."""

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class HandlerDirs(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: top-level modules and packages found in the handlers'
    directories, for names nothing installed provides."""

    def __init__(self) -> None:
        self.dirs: list[str] = []
        #: modules imported before the first handler file: :func:`unload` never forgets them
        #: (declop itself, when a handler folder happens to hold its source)
        self.preexisting: frozenset[str] = frozenset(sys.modules)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or not self.dirs:
            return None  # submodules are found through their package's __path__
        spec = importlib.machinery.PathFinder.find_spec(fullname, self.dirs)
        if spec is None or not spec.origin:
            return spec
        loaded = _loaded(os.path.abspath(spec.origin))
        if loaded is not None:
            return importlib.util.spec_from_loader(fullname, _Existing(loaded), origin=spec.origin)
        if type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _Source(spec.loader.name, spec.loader.path)
        return spec


def _finder() -> HandlerDirs:
    for f in sys.meta_path:
        if isinstance(f, HandlerDirs):
            return f
    finder = HandlerDirs()
    sys.meta_path.append(finder)
    return finder


def _loaded(path: str) -> ModuleType | None:
    """The module already executed from file ``path`` (absolute), under any name."""
    for module in list(sys.modules.values()):
        file: Any = getattr(module, "__file__", None)
        if file and os.path.abspath(file) == path:
            return module
    return None


def _import_file(path: str, fresh: bool = False) -> ModuleType:
    name = _module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    finder = _finder()
    if directory not in finder.dirs:
        finder.dirs.append(directory)
    existing = _loaded(absolute)
    if existing is not None and (not fresh or isinstance(getattr(existing, "__loader__", None), _Source)):
        return existing  # a sibling imported it first (fresh: in this very call)
    spec = importlib.util.spec_from_file_location(name, path, loader=_Source(name, path))
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise ConfigError(f"syntax error in {exc.filename or path}:{exc.lineno}: {exc.msg}") from exc
    except ConfigError:
        del sys.modules[name]
        raise
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise ConfigError(f"importing {path} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    return module


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, f)
            for f in os.listdir(path)
            if f.endswith(".py") and not f.startswith((".", "_")) and os.path.isfile(os.path.join(path, f))
        )
        if not files:
            raise ConfigError(f"no .py files in directory {path}")
        return files
    if not os.path.exists(path):
        raise ConfigError(f"no such file: {path}; pass the path of a Python file with @declop.reconciler handlers")
    if not path.endswith(".py"):
        raise ConfigError(f"{path} is not a .py file; for a module use -m {path}")
    return [path]


def expand(paths: Iterable[str]) -> list[str]:
    """The ``.py`` files ``paths`` name (a folder gives its files, sorted), checked as :func:`load`
    checks them — missing path, not a ``.py`` file, empty folder: :class:`ConfigError` — without
    importing anything."""
    return [file for path in paths for file in _files(path)]


def _from_handler_dirs(module: ModuleType, dirs: set[str]) -> bool:
    """Whether ``module`` (a top-level module or package) was executed from one of ``dirs``."""
    file: Any = getattr(module, "__file__", None)
    if file:
        file = os.path.abspath(file)
        folder = os.path.dirname(file)
        if os.path.basename(file) == "__init__.py":
            folder = os.path.dirname(folder)
        return folder in dirs
    locations: Any = getattr(module, "__path__", None) or ()  # a namespace package
    return any(os.path.dirname(os.path.abspath(p)) in dirs for p in locations)


def unload(modules: Iterable[str] = ()) -> list[str]:
    """Forget every module executed from handler files and their folders, and the ``-m``
    ``modules`` (by exact name), so that the next :func:`load` executes them afresh.

    A top-level module or package found directly in a handler folder goes with all its
    submodules; installed modules stay (whatever imported them). Returns the names forgotten.
    Only between two managers: running code keeps the module objects it already holds.
    """
    finder = next((f for f in sys.meta_path if isinstance(f, HandlerDirs)), None)
    dirs = set(finder.dirs) if finder is not None else set()
    kept = finder.preexisting if finder is not None else frozenset(sys.modules)
    tops = {
        name
        for name, module in list(sys.modules.items())
        if "." not in name and module is not None and name not in kept
        and (name.startswith("declop_handlers_") or _from_handler_dirs(module, dirs))
    }
    forget = {*modules} & set(sys.modules)
    forget |= {name for name in list(sys.modules) if name.partition(".")[0] in tops}
    for name in forget:
        del sys.modules[name]
    if finder is not None:
        finder.dirs.clear()
    importlib.invalidate_caches()
    return sorted(forget)


def _forget_file(path: str) -> None:
    """Forget the module an earlier :func:`load` executed from handler file ``path``: under its
    private name, and under a top-level name our finder served it as (never an installed module)."""
    sys.modules.pop(_module_name(path), None)
    absolute = os.path.abspath(path)
    for name, module in list(sys.modules.items()):
        file: Any = getattr(module, "__file__", None)
        if "." not in name and file and os.path.abspath(file) == absolute and isinstance(getattr(module, "__loader__", None), _Source):
            del sys.modules[name]


def load(paths: Iterable[str] = (), modules: Iterable[str] = (), *, fresh: bool = False) -> list[ModuleType]:
    """Import every path and module in order; returns the modules.

    ``fresh``: a file that the process already imported by a plain ``import`` (a project's own
    tests do ``import handlers``) is executed once more under the loader's own name, so its
    decorators register again into today's default registry; the imported module is untouched.
    Without it, that module is taken as it is (:func:`declop.testing.simulate` asks for fresh).

    Each call executes the files it names afresh, so their decorators register into whatever
    registry is the default *now* (a test that swaps in a fresh registry and loads a file a
    second time gets its handlers again); within one call a file still runs once, whether its
    own turn or a sibling's ``import`` comes first. Modules named with ``modules`` are imported
    as Python imports them: once per process (:func:`unload` forgets them)."""
    loaded: list[ModuleType] = []
    files = [file for path in paths for file in _files(path)]
    for file in files:
        _forget_file(file)
    for file in files:
        loaded.append(_import_file(file, fresh))
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                raise ConfigError(f"no module named {name!r}; is it installed or on PYTHONPATH?") from exc
            raise ConfigError(f"importing {name} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
        except SyntaxError as exc:
            raise ConfigError(f"syntax error in {exc.filename}:{exc.lineno}: {exc.msg}") from exc
        except Exception as exc:
            raise ConfigError(f"importing {name} failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    return loaded
