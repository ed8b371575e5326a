"""OperatorRunner: run a :class:`~declop.manager.Manager` in a background thread, for tests.

    with OperatorRunner(registry, kubeconfig=cp.kubeconfig_path) as op:
        ...  # the manager's caches are synced and its workers run
        op.wait_for(lambda: ..., timeout=10)

The manager gets its own event loop in a daemon thread (so exceptions and mocks in the test
process cross over, unlike a subprocess). Leaving the block stops it gracefully, as SIGTERM would.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from types import TracebackType
from typing import Any, Callable, Coroutine, TypeVar

from declop.manager import Manager, Options
from declop.registry import Registry
from declop.kube.transport import load_configuration

__all__ = ["OperatorProcess", "OperatorRunner", "Replicas", "wait_for"]

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy; return it or raise AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


class OperatorRunner:
    """Start a manager for ``registry`` against a kubeconfig; stop it on exit."""

    def __init__(
        self,
        registry: Registry,
        *,
        kubeconfig: str | None = None,
        configuration: Any = None,
        options: Options | None = None,
        ready_timeout: float = 30.0,
        metrics: Any = None,
    ) -> None:
        """``metrics``: a :class:`~declop.serving.metrics.Metrics` to record into (and read in
        the test); by default the manager records metrics only when it serves them
        (``options.metrics_port``)."""
        self.registry = registry
        self.configuration = configuration or load_configuration(kubeconfig)
        self.options = options or Options(grace_period=5.0)
        self.ready_timeout = ready_timeout
        self.manager = Manager(self.configuration, registry, self.options, metrics=metrics)
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._started = threading.Event()

    def __enter__(self) -> OperatorRunner:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            task = asyncio.ensure_future(self.manager.run(self._stop))
            self._started.set()
            await task

        try:
            self.loop.run_until_complete(main())
        except BaseException as exc:  # surfaced in start()/stop()
            self._error = exc
            self._started.set()
        finally:
            self.loop.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="declop-operator", daemon=True)
        self._thread.start()
        self._started.wait(self.ready_timeout)
        wait_for(
            lambda: self._error is not None or self.manager.ready(),
            self.ready_timeout,
            what="the operator's caches to sync",
        )
        if self._error is not None:
            raise self._error

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the operator's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run a plain function on the operator's loop (where cache and queues live)."""

        async def run() -> T:
            return fn()

        return self.call(run(), timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        if self._stop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass
        self._thread.join(timeout)
        self._thread = None
        if self._error is not None:
            raise self._error

    def wait_for(self, condition: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
        return wait_for(condition, timeout, what=what)

    def statistics(self) -> Any:
        """Requests sent by this operator's transport so far, by verb."""
        assert self.manager.transport is not None
        return self.manager.transport.statistics()


class OperatorProcess:
    """``declop run ARGS`` as a real subprocess, its stdout lines collected as they come.

        with OperatorProcess(["examples/pods.py"], env=cp.env()) as op:
            op.wait_for_line("Pod created")

    Leaving the block sends SIGTERM and waits; ``returncode`` tells how it ended.
    """

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        import subprocess
        import sys

        self.args = [sys.executable, "-m", "declop", "run", *args]
        self.env = env
        self.cwd = cwd
        self.lines: list[str] = []
        self.stderr: list[str] = []
        self._subprocess = subprocess
        self.proc: Any = None
        self.returncode: int | None = None

    def __enter__(self) -> OperatorProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        sp = self._subprocess
        self.proc = sp.Popen(
            self.args, env=self.env, cwd=self.cwd, stdout=sp.PIPE, stderr=sp.PIPE, text=True, bufsize=1
        )
        for stream, sink in ((self.proc.stdout, self.lines), (self.proc.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))

    def wait_for_line(self, needle: str, count: int = 1, timeout: float = 20.0) -> list[str]:
        """Wait until ``count`` stdout lines contain ``needle``; return those lines."""

        def found() -> list[str] | None:
            hits = [line for line in list(self.lines) if needle in line]
            if len(hits) >= count:
                return hits
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"declop exited with {self.proc.returncode} before printing {needle!r}:\n"
                    + "\n".join(self.lines[-20:] + self.stderr[-20:])
                )
            return None

        try:
            return wait_for(found, timeout, what=f"{count} line(s) with {needle!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstdout:\n" + "\n".join(self.lines[-30:]) + "\nstderr:\n" + "\n".join(self.stderr[-30:])) from None

    def stop(self, timeout: float = 30.0) -> int:
        import signal

        if self.proc is None:
            return self.returncode or 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except self._subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        return self.returncode


class Replicas:
    """Several ``declop run ARGS`` processes of one operator, as a Deployment's replicas run:
    each an :class:`OperatorProcess` under a name, with its own ``/metrics`` port (plain HTTP on
    127.0.0.1) and environment, started, signalled and scraped by name.

        args = ["handlers.py", "--shards", "12", "--leader-election-namespace", ns]
        with Replicas(args, env=cp.env(), count=3) as replicas:      # "0", "1", "2"
            replicas.wait_for_line("Acquired shard")                 # on every replica
            replicas.kill("2")                                       # SIGKILL, reaped
            replicas.start()                                         # one more: "3"
            replicas.metric("0", "declop_shard_ranges_owned")        # summed over its samples

    Leaving the block stops every replica still running with SIGTERM (each waited for).
    """

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, count: int = 0) -> None:
        self.args, self.env, self.cwd = list(args), env, cwd
        #: name -> process, in start order (a killed or stopped replica stays, with its output)
        self.procs: dict[str, OperatorProcess] = {}
        #: name -> its /metrics port (kept when a replica of the same name is started again)
        self.metrics_ports: dict[str, int] = {}
        self._count = count

    def __enter__(self) -> Replicas:
        for _ in range(self._count):
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getitem__(self, name: str) -> OperatorProcess:
        return self.procs[name]

    def running(self) -> list[str]:
        """Names of the replicas whose process has not exited."""
        return [n for n, op in self.procs.items() if op.proc is not None and op.proc.poll() is None]

    def start(self, name: str | None = None, **extra_env: str) -> OperatorProcess:
        """Start a replica (the next free number when ``name`` is None); ``extra_env`` adds to
        the common environment. A name used before gets a new process on the same metrics port."""
        from declop.testing.cluster.process import free_ports

        if name is None:
            name = str(next(i for i in range(len(self.procs) + 1) if str(i) not in self.procs))
        if name in self.running():
            raise ValueError(f"replica {name!r} is already running")
        port = self.metrics_ports.setdefault(name, free_ports(1)[0])
        env = {**(self.env if self.env is not None else os.environ), **extra_env}
        op = OperatorProcess([*self.args, "--metrics-port", str(port), "--metrics-secure", "false"], env=env, cwd=self.cwd)
        self.procs[name] = op
        op.start()
        return op

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` (SIGSTOP, SIGCONT, SIGTERM, ...) to one replica."""
        self.procs[name].proc.send_signal(sig)

    def kill(self, name: str, timeout: float = 10.0) -> int:
        """SIGKILL one replica and reap it; returns its exit status (-9)."""
        import signal

        op = self.procs[name]
        op.proc.send_signal(signal.SIGKILL)
        op.returncode = op.proc.wait(timeout)
        return int(op.returncode)

    def stop(self, name: str | None = None, timeout: float = 30.0) -> dict[str, int]:
        """SIGTERM one replica (or every running one, all signalled before any is waited for,
        as a Deployment scaled to zero) and wait; returns their exit codes."""
        import signal

        names = [name] if name is not None else self.running()
        for n in names:
            op = self.procs[n]
            if op.proc is not None and op.proc.poll() is None:
                op.proc.send_signal(signal.SIGTERM)
        return {n: self.procs[n].stop(timeout) for n in names}

    def wait_for_line(self, needle: str, count: int = 1, timeout: float = 20.0) -> dict[str, list[str]]:
        """Wait until every running replica printed ``count`` lines containing ``needle``."""
        return {n: self.procs[n].wait_for_line(needle, count, timeout) for n in self.running()}

    def metrics(self, name: str, timeout: float = 20.0) -> str:
        """One replica's ``/metrics`` (Prometheus text); while it starts (nothing listening on
        its port yet) this waits up to ``timeout``, and fails at once if the process exited."""
        import urllib.error
        import urllib.request

        op = self.procs[name]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_ports[name]}/metrics", timeout=timeout) as r:
                    return str(r.read().decode())
            except urllib.error.URLError as exc:
                if not isinstance(exc.reason, ConnectionRefusedError):
                    raise
                if op.proc.poll() is not None:
                    raise AssertionError(
                        f"replica {name} exited with {op.proc.returncode}:\n" + "\n".join(op.lines[-20:] + op.stderr[-20:])
                    ) from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"replica {name}: nothing listens on its metrics port after {timeout} s") from None
                time.sleep(0.05)

    def metric(self, name: str, metric: str, match: str = "") -> float:
        """The sum of one replica's samples of ``metric`` whose line contains ``match`` (e.g. a
        label value); 0 when it has none."""
        total = 0.0
        for line in self.metrics(name).splitlines():
            if line.startswith("#") or match not in line:
                continue
            sample = line.split("{", 1)[0].split(" ", 1)[0]
            if sample == metric:
                total += float(line.rsplit(" ", 1)[1])
        return total
