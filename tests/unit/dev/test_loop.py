"""declop.dev.loop: what a saved file means, and the restart loop with real file watching.

The manager is replaced by a stub that records what it was given (the loop's unit boundary);
files are real and watched for real (watchfiles). tests/integration/test_dev_reload.py runs the
same loop as ``declop dev`` against a real control plane.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import declop.dev.loop as devloop_module
import declop.registry as registry_module
from declop.dev.loop import DevLoop, Sources
from declop.errors import ConfigError
from declop.loader import HandlerDirs
from declop.manager import Options
from declop.registry import Registry

HANDLER = """\
import declop

GREETING = {greeting!r}


@declop.reconciler("greetings.hello.example.org")
def greet(**_):
    return GREETING
"""


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, HandlerDirs)])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    fresh = Registry()
    monkeypatch.setattr(registry_module, "default_registry", fresh)
    return fresh


class StubManager:
    """Records the handlers it was started with; runs until stopped (or fails, if told to)."""

    instances: list["StubManager"] = []
    fail_next: list[Exception] = []

    def __init__(self, configuration: Any, registry: Registry, options: Options) -> None:
        self.handlers = [r.fn for r in registry.registrations]
        self.frozen_registry = registry
        self.exit_code = 0
        self.running = False
        self.stopped = False
        StubManager.instances.append(self)

    async def run(self, stop: asyncio.Event) -> None:
        if StubManager.fail_next:
            raise StubManager.fail_next.pop(0)
        self.frozen_registry.freeze()
        self.running = True
        await stop.wait()
        self.stopped = True

    def greeting(self) -> Any:
        return self.handlers[0]()


@pytest.fixture
def managers(monkeypatch: pytest.MonkeyPatch) -> list[StubManager]:
    monkeypatch.setattr(devloop_module, "Manager", StubManager)
    StubManager.instances = []
    StubManager.fail_next = []
    return StubManager.instances


async def until(condition: Callable[[], Any], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.01)


def write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text))


# -- Sources ------------------------------------------------------------------------------------


def test_what_a_changed_file_means(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    ops.mkdir()
    (tmp_path / "deploy").mkdir()
    sources = Sources(paths=(str(tmp_path / "handlers.py"), str(ops)), manifests=(str(tmp_path / "crd.yaml"), str(tmp_path / "deploy")))
    assert sources.watched_folders() == [str(tmp_path), str(ops), str(tmp_path / "deploy")]
    assert sources.handlers_changed(str(tmp_path / "handlers.py"))
    assert sources.handlers_changed(str(tmp_path / "helpers.py"))  # a sibling it may import
    assert sources.handlers_changed(str(ops / "more.py"))
    assert not sources.handlers_changed(str(ops / "sub" / "deep.py"))  # folders are not recursive
    assert not sources.handlers_changed(str(tmp_path / ".#handlers.py"))  # an editor's lock file
    assert not sources.handlers_changed(str(tmp_path / "notes.txt"))
    assert sources.manifests_changed(str(tmp_path / "crd.yaml"))
    assert not sources.manifests_changed(str(tmp_path / "other.yaml"))  # not given with -f
    assert sources.manifests_changed(str(tmp_path / "deploy" / "cm.yml"))
    assert not sources.manifests_changed(str(tmp_path / "deploy" / "README.md"))
    assert Sources(modules=("pkg.handlers",)).runs_handlers and not Sources(manifests=("x.yaml",)).runs_handlers


# -- the loop -----------------------------------------------------------------------------------


def test_save_restarts_with_the_new_code_and_a_syntax_error_waits_for_the_next_save(
    tmp_path: Path, registry: Registry, managers: list[StubManager]
) -> None:
    handlers = tmp_path / "handlers.py"
    write(handlers, HANDLER.format(greeting="Hello"))
    lines: list[str] = []
    loop = DevLoop(None, Options(), Sources(paths=(str(handlers),)), echo=lines.append, registry=registry)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await until(lambda: managers and managers[-1].running, what="the first operator")
        assert managers[0].greeting() == "Hello"
        assert any(line.startswith("Watching ") for line in lines)

        write(handlers, HANDLER.format(greeting="Howdy"))
        await until(lambda: len(managers) == 2 and managers[1].running, what="a restart")
        assert managers[0].stopped, "the old operator stopped before the new one started"
        assert managers[1].greeting() == "Howdy"
        assert [line for line in lines if "changed" in line] == [f"{handlers} changed: restarting the operator"]

        handlers.write_text("import declop\n\ndef broken(:\n")
        await until(lambda: any("declop: error:" in line for line in lines), what="the error line")
        (error,) = [line for line in lines if "declop: error:" in line]
        assert error == f"declop: error: syntax error in {handlers}:3: invalid syntax; waiting for the next save"
        assert managers[1].stopped and len(managers) == 2 and not task.done()
        assert len(registry) == 0, "nothing of a failed load stays registered"

        write(handlers, HANDLER.format(greeting="Hi"))
        await until(lambda: len(managers) == 3 and managers[2].running, what="the fixed save")
        assert managers[2].greeting() == "Hi"

        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
        assert managers[2].stopped

    asyncio.run(scenario())


def test_a_start_error_waits_and_a_manifest_change_starts_again(
    tmp_path: Path, registry: Registry, managers: list[StubManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers = tmp_path / "handlers.py"
    write(handlers, HANDLER.format(greeting="Hello"))
    crd = tmp_path / "crd.yaml"
    crd.write_text("# the CRD\n")
    applied: list[float] = []

    async def apply_manifests(self: DevLoop) -> None:
        applied.append(time.monotonic())

    monkeypatch.setattr(DevLoop, "apply_manifests", apply_manifests)
    StubManager.fail_next.append(ConfigError("controller 'greet': unknown resource 'greetings.hello.example.org'"))
    lines: list[str] = []
    loop = DevLoop(None, Options(), Sources(paths=(str(handlers),), manifests=(str(crd),)), echo=lines.append, registry=registry)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await until(lambda: any("unknown resource" in line for line in lines), what="the start error")
        assert "declop: error: controller 'greet': unknown resource 'greetings.hello.example.org'; waiting for the next save" in lines
        assert len(applied) == 1 and not task.done()

        crd.write_text("# the CRD, fixed\n")
        await until(lambda: len(managers) == 2 and managers[1].running, what="the start after re-applying")
        assert len(applied) == 2
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(scenario())


def test_without_reload_errors_propagate(tmp_path: Path, registry: Registry, managers: list[StubManager]) -> None:
    handlers = tmp_path / "handlers.py"
    handlers.write_text("def broken(:\n")
    loop = DevLoop(None, Options(), Sources(paths=(str(handlers),)), reload=False, registry=registry)
    with pytest.raises(ConfigError, match=r"handlers.py:1: invalid syntax"):
        asyncio.run(loop.run(asyncio.Event()))
    assert managers == []


def test_the_servers_bind_to_loopback_unless_an_address_is_given() -> None:
    from declop.manager import Manager, Options

    loop = DevLoop(None, Options(health_port=8081), Sources())
    assert loop.options.bind_address == "127.0.0.1" and loop.options.health_port == 8081
    assert DevLoop(None, Options(bind_address="0.0.0.0"), Sources()).options.bind_address == "0.0.0.0"
    assert Manager(None, options=Options()).bind_address == "0.0.0.0"  # declop run: every interface, as before


TYPED_HANDLER = """\
import declop
from pydantic import BaseModel, Field
from declop.typed.model import CustomResource

GREETING = {greeting!r}


class GreetingSpec(BaseModel):
    name: str = Field("", max_length={limit})


class Greeting(CustomResource, group="hello.example.org", version="v1", kind="Greeting"):
    spec: GreetingSpec


@declop.reconciler("greetings.hello.example.org")
def greet(**_):
    return GREETING
"""


def test_the_models_crds_go_with_the_first_apply_and_again_only_when_a_save_changes_them(
    tmp_path: Path, registry: Registry, managers: list[StubManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers = tmp_path / "handlers.py"
    write(handlers, TYPED_HANDLER.format(greeting="Hello", limit=5))
    applies: list[tuple[list[str], int]] = []  # (what was applied, managers started before it)

    async def apply(self: DevLoop, manifests: list[Any], started: float) -> None:
        applies.append(([f"{m.kind} {m.name}" for m in manifests], len(managers)))

    monkeypatch.setattr(DevLoop, "_apply", apply)
    loop = DevLoop(None, Options(), Sources(paths=(str(handlers),)), echo=lambda line: None, registry=registry)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await until(lambda: managers and managers[-1].running, what="the first operator")
        assert applies == [(["CustomResourceDefinition greetings.hello.example.org"], 0)]  # before the operator

        write(handlers, TYPED_HANDLER.format(greeting="Howdy", limit=5))  # code only
        await until(lambda: len(managers) == 2 and managers[1].running, what="a restart")
        assert managers[1].greeting() == "Howdy" and len(applies) == 1

        write(handlers, TYPED_HANDLER.format(greeting="Hi", limit=9))  # the model changed
        await until(lambda: len(managers) == 3 and managers[2].running, what="the restart after the model changed")
        assert applies[1] == (["CustomResourceDefinition greetings.hello.example.org"], 2)  # before the third started

        stop.set()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(scenario())


def test_a_model_the_crd_cannot_be_made_of_waits_for_the_next_save(
    tmp_path: Path, registry: Registry, managers: list[StubManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers = tmp_path / "handlers.py"
    write(handlers, TYPED_HANDLER.format(greeting="Hello", limit=5).replace("name: str =", "name: int | str ="))
    applied: list[int] = []

    async def apply(self: DevLoop, manifests: list[Any], started: float) -> None:
        applied.append(len(manifests))

    monkeypatch.setattr(DevLoop, "_apply", apply)
    lines: list[str] = []
    loop = DevLoop(None, Options(), Sources(paths=(str(handlers),)), echo=lines.append, registry=registry)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await until(lambda: any("declop: error:" in line for line in lines), what="the error line")
        (error,) = [line for line in lines if "declop: error:" in line]
        assert error.startswith("declop: error: Greeting: spec.name: a union of int, str cannot be a CRD field")
        assert error.endswith("; waiting for the next save")
        assert managers == [] and applied == [] and not task.done()

        write(handlers, TYPED_HANDLER.format(greeting="Hello", limit=5))
        await until(lambda: managers and managers[-1].running, what="the operator after the fix")
        assert applied == [1]
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0

    asyncio.run(scenario())
