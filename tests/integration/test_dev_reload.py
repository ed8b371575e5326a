"""`declop dev handlers.py -f crd.yaml` as a user runs it: a subprocess, real files, a real control
plane. Manifests applied and Established before the operator starts; a save restarts the operator
with the new code within 2 s; a syntax error is one line and the process waits; SIGTERM leaves no
control-plane process behind; a manifest the apiserver refuses exits 1 naming file and object."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from declop.testing.cluster.runner import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "greeting"
GROUP, VERSION, PLURAL = "hello.example.org", "v1", "greetings"
SAVE_TO_BEHAVIOUR_BOUND = 2.0


class Dev:
    """``python -m declop dev ARGS`` with its control plane's files under ``workdir`` (TMPDIR),
    output lines (stdout and stderr) collected as they come."""

    def __init__(self, args: list[str], workdir: Path, cwd: Path = ROOT) -> None:
        self.workdir = workdir
        self.kubeconfig = workdir / "kubeconfig"
        (workdir / "cp").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(workdir / "cp")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "declop", "dev", *args, "--kubeconfig-out", str(self.kubeconfig)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 90.0, count: int = 1) -> list[str]:
        regex = re.compile(pattern)

        def seen() -> list[str] | None:
            hits = [line for line in list(self.lines) if regex.search(line)]
            if len(hits) >= count:
                return hits
            assert self.proc.poll() is None, f"declop dev exited with {self.proc.returncode}:\n{self.output()}"
            return None

        try:
            return wait_for(seen, timeout, what=f"a line matching {pattern!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output()}") from None

    def wait_exit(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        """SIGKILL declop dev (a test that failed midway) and the control plane it can no longer
        stop: its etcd and kube-apiserver would outlive the test and load the machine."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self._control_plane_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def api(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig)))

    def control_plane_processes(self) -> list[str]:
        """Processes whose command line names this control plane's files (etcd, kube-apiserver, …)."""
        return [cmdline for _, cmdline in self._control_plane()]

    def _control_plane_pids(self) -> list[int]:
        return [pid for pid, _ in self._control_plane()]

    def _control_plane(self) -> list[tuple[int, str]]:
        found = []
        marker = str(self.workdir / "cp").encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                found.append((int(pid), cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]))
        return found


def greeting_message(api: kubernetes.client.CustomObjectsApi, name: str = "world") -> str | None:
    obj: Any = api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    return (obj.get("status") or {}).get("message")


def create_greeting(api: kubernetes.client.CustomObjectsApi, name: str = "world", who: str = "World") -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Greeting", "metadata": {"name": name}, "spec": {"name": who}}
    api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)


def save(path: Path, text: str) -> float:
    """Write ``text`` as an editor saves (a new file renamed over the old one); the time after."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
    return time.monotonic()


def test_the_greeting_example_runs_as_documented(tmp_path: Path) -> None:
    """`declop dev examples/greeting/handlers.py -f examples/greeting/crd.yaml`, then
    `kubectl apply -f examples/greeting/greeting.yaml`: the greeting is greeted."""
    dev = Dev(["examples/greeting/handlers.py", "-f", "examples/greeting/crd.yaml"], tmp_path)
    try:
        dev.wait_for_line(r"^Applied 1 object from examples/greeting/crd.yaml; CRDs Established: greetings.hello.example.org \(")
        dev.wait_for_line(r"^Watching examples/greeting for changes: saving a .py file there restarts the operator\.$")
        assets = next(re.search(r"export PATH=(\S+):", line).group(1) for line in dev.lines if "export PATH=" in line)  # type: ignore[union-attr]
        env = {**os.environ, "KUBECONFIG": str(dev.kubeconfig), "PATH": f"{assets}:{os.environ['PATH']}"}
        subprocess.run(["kubectl", "apply", "-f", str(EXAMPLE / "greeting.yaml")], env=env, check=True, capture_output=True, timeout=60)
        api = dev.api()
        wait_for(lambda: greeting_message(api) == "Hello, World!", 30, what="the greeting's status")
        dev.wait_for_line(r'^INFO Greeted \{"controller": "greet", "namespace": "default", "name": "world", .*"message": "Hello, World!"\}$')
        shown = subprocess.run(["kubectl", "get", "greetings"], env=env, capture_output=True, text=True, timeout=60).stdout
        assert re.search(r"^world\s+Hello, World!$", shown, re.M), shown
        dev.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert dev.wait_exit() == 0, dev.output()
        assert dev.lines[-1] == "Control plane stopped."
        assert dev.control_plane_processes() == []
        # the CRD's watch cache filling right after it was applied is routine: no line about it
        # (it read like an error: "… 429: TooManyRequests: storage is (re)initializing")
        assert [line for line in dev.lines if "429" in line or "watch cache" in line] == [], dev.output()
    finally:
        dev.kill()


def test_save_restarts_the_operator_with_the_new_code_within_two_seconds(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    handlers = project / "handlers.py"
    shutil.copy(EXAMPLE / "handlers.py", handlers)
    shutil.copy(EXAMPLE / "crd.yaml", project / "crd.yaml")
    source = handlers.read_text()
    assert 'GREETING = "Hello"' in source
    dev = Dev([str(handlers), "-f", str(project / "crd.yaml"), "--no-controller-manager"], tmp_path, cwd=project)
    try:
        dev.wait_for_line(r"^Watching \. for changes")
        api = dev.api()
        create_greeting(api)  # the CRD was Established before the operator started
        wait_for(lambda: greeting_message(api) == "Hello, World!", 30, what="the first greeting")
        assert len(dev.control_plane_processes()) >= 2  # etcd and kube-apiserver

        # edit → save → the new behaviour, timed from the save
        saved = save(handlers, source.replace('GREETING = "Hello"', 'GREETING = "Howdy"'))
        wait_for(lambda: greeting_message(api) == "Howdy, World!", 10, interval=0.01, what="the edited greeting")
        took = time.monotonic() - saved
        print(f"save → new behaviour: {took:.3f} s")
        assert took < SAVE_TO_BEHAVIOUR_BOUND, f"{took:.2f} s from save to the new greeting\n{dev.output()}"
        assert "handlers.py changed: restarting the operator" in dev.lines

        # a syntax error: one line, and the process waits
        before = len(dev.lines)
        save(handlers, source.replace('GREETING = "Hello"', 'GREETING = "Oops'))
        (error,) = dev.wait_for_line(r"^declop: error: ")
        line_no = next(i for i, text in enumerate(source.splitlines(), 1) if text.startswith("GREETING ="))
        assert re.fullmatch(rf"declop: error: syntax error in {re.escape(str(handlers))}:{line_no}: .+; waiting for the next save", error), error
        new_lines = dev.lines[before:]
        assert [line for line in new_lines if "rror" in line] == [error]
        assert not any("Traceback" in line for line in dev.lines)
        assert dev.proc.poll() is None
        assert greeting_message(api) == "Howdy, World!"  # nothing ran meanwhile to change it

        # the fix: the operator runs again, with the newest code
        saved = save(handlers, source.replace('GREETING = "Hello"', 'GREETING = "Hi"'))
        wait_for(lambda: greeting_message(api) == "Hi, World!", 10, interval=0.01, what="the greeting after the fix")
        took = time.monotonic() - saved
        print(f"fix → new behaviour: {took:.3f} s")
        assert took < SAVE_TO_BEHAVIOUR_BOUND, f"{took:.2f} s from the fix to the new greeting\n{dev.output()}"

        # a new object is reconciled by the restarted operator too
        create_greeting(api, "again", "Again")
        wait_for(lambda: greeting_message(api, "again") == "Hi, Again!", 10, what="a greeting created after the restarts")

        dev.proc.send_signal(signal.SIGTERM)
        assert dev.wait_exit() == 0, dev.output()
        assert dev.lines[-1] == "Control plane stopped."
        assert dev.control_plane_processes() == []
    finally:
        dev.kill()


def test_a_manifest_the_apiserver_refuses_is_one_line_and_exit_1(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    shutil.copy(EXAMPLE / "crd.yaml", manifests / "crd.yaml")
    bad = manifests / "greetings.yaml"
    bad.write_text(
        "apiVersion: hello.example.org/v1\nkind: Greeting\nmetadata: {name: fine}\nspec: {name: Fine}\n---\n"
        "apiVersion: hello.example.org/v1\nkind: Greeting\nmetadata: {name: nameless, namespace: default}\nspec: {}\n"
    )
    dev = Dev([str(EXAMPLE / "handlers.py"), "-f", str(manifests), "--no-controller-manager"], tmp_path)
    try:
        assert dev.wait_exit(120) == 1, dev.output()
        errors = [line for line in dev.lines if line.startswith("declop: error:")]
        assert len(errors) == 1, dev.output()
        assert re.fullmatch(
            rf"declop: error: {re.escape(str(bad))}: Greeting default/nameless: the apiserver refused it: "
            r'Greeting.hello.example.org "nameless" is invalid: spec.name: Required value',
            errors[0],
        ), errors[0]
        assert dev.lines[-1] == errors[0] and dev.lines[-2] == "Control plane stopped."
        assert not any("Traceback" in line for line in dev.lines)
        assert dev.control_plane_processes() == []
    finally:
        dev.kill()


TYPED_HANDLERS = '''
import declop
from pydantic import BaseModel, Field
from declop.typed.model import CustomResource

TAG = "first"


class NoteSpec(BaseModel):
    text: str = Field("", max_length=5)


class Note(CustomResource, group="notes.example.org", version="v1", kind="Note"):
    spec: NoteSpec


@declop.reconciler("notes.notes.example.org")
def note(obj, logger, **_):
    if obj is not None:
        logger.info(f"Seen by {TAG}", text=obj["spec"]["text"])
'''


def test_the_models_crds_are_applied_without_f_and_again_when_a_save_changes_them(tmp_path: Path) -> None:
    """No -f for the CRD of a typed model: it is applied before the -f files (which may hold its
    objects, defaults applied), and again only after a save that changes it."""
    project = tmp_path / "project"
    project.mkdir()
    handlers = project / "handlers.py"
    handlers.write_text(TYPED_HANDLERS)
    (project / "note.yaml").write_text("apiVersion: notes.example.org/v1\nkind: Note\nmetadata: {name: hi, namespace: default}\nspec: {}\n")
    dev = Dev([str(handlers), "-f", "note.yaml", "--no-controller-manager"], tmp_path, cwd=project)
    applied = r"^Applied .*CRDs Established: notes\.notes\.example\.org"
    try:
        (first,) = dev.wait_for_line(applied)
        assert first.startswith("Applied 2 objects from handlers.py, note.yaml;"), first
        dev.wait_for_line(r'Seen by first \{.*"text": ""')  # the object of -f, its default applied
        api = dev.api()

        def max_length() -> int:
            crd: Any = api.get_cluster_custom_object("apiextensions.k8s.io", "v1", "customresourcedefinitions", "notes.notes.example.org")
            return int(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["text"]["maxLength"])

        assert max_length() == 5

        save(handlers, TYPED_HANDLERS.replace('TAG = "first"', 'TAG = "second"'))  # the model is unchanged
        dev.wait_for_line(r"Seen by second")
        assert len([line for line in dev.lines if re.search(applied, line)]) == 1, dev.output()

        save(handlers, TYPED_HANDLERS.replace("max_length=5", "max_length=10").replace('TAG = "first"', 'TAG = "third"'))
        (_, again) = dev.wait_for_line(applied, count=2)
        assert again.startswith("Applied 1 object from handlers.py;"), again
        dev.wait_for_line(r"Seen by third")
        assert dev.lines.index(again) < next(i for i, line in enumerate(dev.lines) if "Seen by third" in line)  # before the start
        assert max_length() == 10

        dev.proc.send_signal(signal.SIGTERM)
        assert dev.wait_exit() == 0, dev.output()
    finally:
        dev.kill()
