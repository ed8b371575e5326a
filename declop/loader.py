"""Loader: import handler files and modules so that their decorators register reconcilers.

- A file path is imported under a private module name (``declop_handlers_<stem>_<hash>``).
- A directory path imports every ``*.py`` file in it (sorted), as a ConfigMap mount provides them.
- ``-m pkg.module`` is imported by name.

Invariants (loader hygiene):
- a handler file never shadows an installed module: the handlers' directories are *not* put on
  ``sys.path``; a finder placed *last* on ``sys.meta_path`` serves their files and packages to
  ``import sibling`` only when nothing installed has that name. A handler folder with ``yaml.py``
  and ``json.py`` still gives the kubernetes package PyYAML and the stdlib ``json``;
- every file is executed exactly once per process, whichever comes first — ``import helpers``
  from a sibling, or the folder's own turn: both get the same module object.

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

from .errors import ConfigError

__all__ = ["HandlerDirs", "load"]


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


class HandlerDirs(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: top-level modules and packages found in the handlers'
    directories, for names nothing installed provides."""

    def __init__(self) -> None:
        self.dirs: list[str] = []

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


def _import_file(path: str) -> ModuleType:
    name = _module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    finder = _finder()
    if directory not in finder.dirs:
        finder.dirs.append(directory)
    existing = _loaded(absolute)
    if existing is not None:  # a sibling imported it first
        return existing
    spec = importlib.util.spec_from_file_location(name, path)
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


def load(paths: Iterable[str] = (), modules: Iterable[str] = ()) -> list[ModuleType]:
    """Import every path and module in order; returns the modules."""
    loaded: list[ModuleType] = []
    for path in paths:
        for file in _files(path):
            loaded.append(_import_file(file))
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
