"""Dev loop: the operator part of ``declop dev`` — apply the ``-f`` manifests, run the handlers,
and restart them when a watched file is saved. The control plane is the caller's and is never
touched here.

Owns:
- :class:`Sources`: the handler PATHS, ``-m`` modules and ``-f`` manifests, which folders to
  watch and what a changed file means;
- :class:`DevLoop`: the loop itself, with ``watchfiles`` (inotify; changes are taken once the
  files have been quiet for 50 ms, so an editor's write-and-rename is one change).

CRDs of typed models: the CRDs of the :class:`~declop.typed.model.CustomResource` models that the
handler files define or import (:func:`~declop.dev.manifests.from_models`) are applied with the
``-f`` manifests at the start — the handlers are loaded first, so ``-f`` may hold objects of a
model's kind — and again after a restart whenever they differ from the last applied (a field or a
marker was edited), before the new manager starts. No ``-f`` is needed for them.

What a change does:
- a ``.py`` file among PATHS or in their folders (not sub-folders): **restart** — the running
  manager stops as on SIGTERM (intake stops, in-flight reconciles drain within the grace
  period), the handler modules are forgotten (:func:`~declop.loader.unload`) and the registry
  emptied, the files are loaded afresh and a new manager starts. ``-m`` modules are re-imported
  at each restart but not watched;
- a ``-f`` file (or a YAML file in a ``-f`` folder): **re-apply** every manifest; the operator
  keeps running. If it was waiting after a start error (an unknown resource), it starts again.

Invariants:
- every server of the operator (probes, metrics, webhooks) listens on 127.0.0.1 unless
  ``Options.bind_address`` names another address: a laptop's operator is not on its network;
- at most one manager runs; a new one starts only after the previous one has shut down;
- before each load the registry is cleared and the previous handler modules are forgotten, so
  no registration of an old version survives, not even of a load that failed half-way;
- a load error (a model the CRD cannot be made of too), a start error or a failed re-apply
  prints **one line**
  (``declop: error: handlers.py:3: …; waiting for the next save``) and the loop waits for the
  next change instead of exiting; only the first apply of the manifests is fatal (the caller
  exits non-zero and stops the control plane);
- without reload nothing is watched and every error propagates, as ``declop run`` does;
- ``stop`` ends the loop after the running manager's graceful shutdown, whatever the state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Iterable, Sequence

from declop.kube.discovery import Discovery
from declop.errors import ConfigError, DeclopError
from declop.loader import load, unload
from declop.manager import Manager, Options
from declop.dev.manifests import CRD_TIMEOUT, Manifest, apply, from_models, read
from declop.registry import Registry, default_registry
from declop.kube.transport import Transport

__all__ = ["DevLoop", "Sources"]

log = logging.getLogger("declop.dev")

#: where ``declop dev``'s servers listen unless ``Options.bind_address`` says otherwise
LOCAL_BIND_ADDRESS = "127.0.0.1"

#: milliseconds of quiet after a change before it is acted on
QUIET_MS = 50
_MANIFEST_EXTENSIONS = (".yaml", ".yml", ".json")


def _absolute(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(os.path.abspath(p) for p in paths)


@dataclass(frozen=True, slots=True)
class Sources:
    """The files ``declop dev`` runs and watches: handler PATHS (files or folders), ``-m``
    modules, ``-f`` manifests (files or folders)."""

    paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()

    @property
    def runs_handlers(self) -> bool:
        return bool(self.paths or self.modules)

    def watched_folders(self) -> list[str]:
        """Every folder to watch (not recursively): those of the handler files, the handler
        folders, those of the manifest files and the manifest folders."""
        folders = [p if os.path.isdir(p) else os.path.dirname(p) for p in _absolute((*self.paths, *self.manifests))]
        return list(dict.fromkeys(folders))

    def handlers_changed(self, path: str) -> bool:
        """``path`` is a ``.py`` file among PATHS or directly in their folders."""
        path = os.path.abspath(path)
        if not path.endswith(".py") or os.path.basename(path).startswith("."):
            return False
        folders = {p if os.path.isdir(p) else os.path.dirname(p) for p in _absolute(self.paths)}
        return os.path.dirname(path) in folders

    def manifests_changed(self, path: str) -> bool:
        """``path`` is a ``-f`` file, or a YAML/JSON file directly in a ``-f`` folder."""
        path = os.path.abspath(path)
        given = _absolute(self.manifests)
        if path in given:
            return True
        if not path.endswith(_MANIFEST_EXTENSIONS) or os.path.basename(path).startswith("."):
            return False
        return any(os.path.isdir(p) and os.path.dirname(path) == p for p in given)

    def relevant(self, path: str) -> bool:
        return self.handlers_changed(path) or self.manifests_changed(path)


@dataclass
class _Operator:
    """One manager run: its task and the event that stops it."""

    manager: Manager
    stop: asyncio.Event
    task: asyncio.Task[None]


def _short(path: str) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


class DevLoop:
    """Applies the manifests, runs the handlers and, with ``reload``, restarts them on a save.

    ``loaded``: the caller already imported the handlers (without reload, to fail before the
    control plane starts) as ``modules``; the first manager then uses them as they are. ``echo``
    prints one status line (stderr in the CLI).
    """

    def __init__(
        self,
        configuration: Any,
        options: Options,
        sources: Sources,
        *,
        reload: bool = True,
        loaded: bool = False,
        registry: Registry | None = None,
        echo: Callable[[str], None] = print,
        crd_timeout: float = CRD_TIMEOUT,
        modules: Sequence[ModuleType] = (),
    ) -> None:
        self.configuration = configuration
        # a developer's machine: the probe, metrics and webhook servers listen on loopback only
        # (the local apiserver calls webhooks at 127.0.0.1), unless an address was chosen
        self.options = options if options.bind_address else dataclasses.replace(options, bind_address=LOCAL_BIND_ADDRESS)
        self.sources = sources
        self.reload = reload
        self.registry = registry if registry is not None else default_registry
        self.echo = echo
        self.crd_timeout = crd_timeout
        self.exit_code = 0
        self._loaded = loaded
        self._operator: _Operator | None = None
        #: the CRDs of the models of the last load, and of the last apply of them
        self._crds: list[Manifest] = []
        self._crds_applied: list[dict[str, Any]] | None = None
        if loaded:
            self._crds = self._model_crds(modules)

    # -- manifests -------------------------------------------------------------------------------
    def _model_crds(self, modules: Sequence[ModuleType]) -> list[Manifest]:
        options = self.options
        return from_models(
            modules, self.registry,
            webhook_service=options.webhook_service, webhook_url=options.webhook_url, webhook_port=options.webhook_port,
        )

    async def apply_manifests(self) -> None:
        """Read and apply every ``-f`` manifest with the CRDs of the loaded models (CRDs
        Established and served before the rest).

        Raises:
            ConfigError: one line naming the file and object that failed.
        """
        if not self.sources.manifests and not self._crds:
            return
        started = time.monotonic()
        crds = list(self._crds)
        manifests = [*crds, *read(self.sources.manifests)]
        await self._apply(manifests, started)
        self._crds_applied = [m.obj for m in crds]

    async def _apply_model_crds(self) -> None:
        """Apply the CRDs of the models just loaded if they differ from the last applied."""
        if not self._crds or [m.obj for m in self._crds] == self._crds_applied:
            return
        crds = list(self._crds)
        await self._apply(crds, time.monotonic())
        self._crds_applied = [m.obj for m in crds]

    async def _apply(self, manifests: list[Manifest], started: float) -> None:
        transport = Transport(self.configuration, user_agent=self.options.user_agent)

        async def get_json(path: str, accept: str) -> Any:
            return await transport.request("GET", path, accept=accept)

        try:
            applied = await apply(manifests, transport, Discovery(get_json), timeout=self.crd_timeout)
        finally:
            await transport.close()
        files = ", ".join(dict.fromkeys(_short(m.file) for m in applied))
        crds = [m.name for m in applied if m.is_crd]
        established = f"; CRDs Established: {', '.join(crds)}" if crds else ""
        self.echo(f"Applied {len(applied)} object{'s' if len(applied) != 1 else ''} from {files}{established} ({time.monotonic() - started:.1f} s)")

    # -- the operator ----------------------------------------------------------------------------
    def _load(self) -> bool:
        """Load the handlers afresh and make their models' CRDs; on an error print one line and
        return False (reload) or raise (no reload)."""
        self.registry.clear()
        unload(self.sources.modules)
        self._crds = []
        try:
            modules = load(self.sources.paths, self.sources.modules)
            if not len(self.registry) and not self.registry.webhooks:
                what = ", ".join([*self.sources.paths, *(f"-m {m}" for m in self.sources.modules)])
                raise ConfigError(f"no reconciler is registered by {what}; decorate a function with @declop.reconciler(\"pods\")")
            self._crds = self._model_crds(modules)
        except ConfigError as exc:
            self.registry.clear()
            if not self.reload:
                raise
            self._waiting(exc)
            return False
        return True

    async def _launch(self) -> _Operator | None:
        """Load the handlers afresh (unless already loaded), apply their models' CRDs if they
        changed, and start a manager; on an error print one line and return None (reload) or
        raise (no reload)."""
        if not self._loaded:
            if not self._load():
                return None
            try:
                await self._apply_model_crds()
            except ConfigError as exc:
                if not self.reload:
                    raise
                self._waiting(exc)
                return None
        self._loaded = False
        manager = Manager(self.configuration, self.registry, self.options)
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(manager.run(stop), name="declop dev operator")
        return _Operator(manager, stop, task)

    def _waiting(self, exc: BaseException) -> None:
        self.echo(f"declop: error: {exc}; waiting for the next save")

    def _ended(self, op: _Operator) -> None:
        """The manager ended on its own: a start error, or a lost Lease."""
        exc = op.task.exception()
        if exc is not None:
            if not self.reload or not isinstance(exc, DeclopError):
                raise exc
            self._waiting(exc)
            return
        self.exit_code = op.manager.exit_code
        if self.reload:
            self.echo(f"declop: error: the operator stopped (exit code {self.exit_code}); waiting for the next save")

    async def _halt(self, op: _Operator) -> None:
        """Stop ``op`` as on SIGTERM and wait for its graceful shutdown."""
        op.stop.set()
        try:
            await op.task
        except DeclopError as exc:  # it failed while starting; nothing runs any more
            log.debug("operator ended with %s", exc)
        self.exit_code = max(self.exit_code, op.manager.exit_code)

    # -- the loop --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> int:
        """Apply the manifests, run the operator until ``stop``; restart it on changes (reload).
        Returns the exit code (non-zero after a lost Lease).

        Raises:
            ConfigError: the first apply failed; without reload, also any load or start error.
        """
        launch = self.sources.runs_handlers
        if launch and not self._loaded:  # first: the models' CRDs are applied with the -f files
            launch = self._loaded = self._load()
        await self.apply_manifests()
        changes: asyncio.Queue[set[str]] = asyncio.Queue()
        watch_stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        watcher = None
        if self.reload and self.sources.watched_folders():
            watcher = loop.create_task(self._watch(changes, watch_stop), name="declop dev watcher")
            what = "a .py file there restarts the operator" if self.sources.runs_handlers else "a -f file applies it again"
            folders = ", ".join(_short(f) for f in self.sources.watched_folders())
            self.echo(f"Watching {folders} for changes: saving {what}.")
        op = await self._launch() if launch else None
        stopped = loop.create_task(stop.wait())
        try:
            while not stop.is_set():
                changed = loop.create_task(changes.get())
                waits: set[asyncio.Future[Any]] = {stopped, changed}
                if op is not None:
                    waits.add(op.task)
                if watcher is not None:
                    waits.add(watcher)
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if changed not in done:
                    changed.cancel()
                if watcher is not None and watcher in done:
                    watcher.result()  # the watcher never ends on its own: raise what broke it
                if op is not None and op.task in done:
                    self._ended(op)
                    op = None
                    if not self.reload:
                        return self.exit_code
                if changed in done and not stop.is_set():
                    op = await self._changed(changed.result(), changes, op)
            return self.exit_code
        finally:
            stopped.cancel()
            if op is not None:
                await self._halt(op)
            if watcher is not None:
                watch_stop.set()
                await asyncio.gather(watcher, return_exceptions=True)

    async def _changed(self, paths: set[str], changes: asyncio.Queue[set[str]], op: _Operator | None) -> _Operator | None:
        while not changes.empty():  # saves that came while the last restart ran: one more is enough
            paths |= changes.get_nowait()
        handlers = sorted(p for p in paths if self.sources.handlers_changed(p))
        manifests = sorted(p for p in paths if self.sources.manifests_changed(p))
        if manifests:
            self.echo(f"{', '.join(_short(p) for p in manifests)} changed: applying the manifests again")
            try:
                await self.apply_manifests()
            except ConfigError as exc:
                self._waiting(exc)
                manifests = []  # nothing new for a waiting operator to find
        if not self.sources.runs_handlers or not (handlers or (manifests and op is None)):
            return op
        if handlers:
            self.echo(f"{', '.join(_short(p) for p in handlers)} changed: restarting the operator")
        if op is not None:
            await self._halt(op)
        return await self._launch()

    async def _watch(self, changes: asyncio.Queue[set[str]], stop: asyncio.Event) -> None:
        import watchfiles

        folders = self.sources.watched_folders()
        sources = self.sources

        def relevant(change: Any, path: str) -> bool:
            return sources.relevant(path)

        async for batch in watchfiles.awatch(
            *folders, watch_filter=relevant, step=QUIET_MS, stop_event=stop, recursive=False
        ):
            changes.put_nowait({path for _, path in batch})
