"""A started helper process of the test kit (etcd, kube-apiserver, kubelet, containerd…).

Invariants: every :class:`Component` runs in its own session (its process group id is its pid)
with stdout and stderr in its log file; it is signalled only through that group and only while
its Popen is unreaped, so a recycled pid is never hit; :meth:`Component.stop` always reaps it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

__all__ = ["Component", "free_ports", "launch"]

STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 20


def launch(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> Component:
    """Start ``argv`` in a new session, output appended to ``workdir/<name>.log``."""
    log = workdir / f"{name}.log"
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    return Component(name, popen, log)


class Component:
    """One started process: its Popen (own session, so pgid == pid) and its log file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.popen = popen
        self.log = log

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self, sig: signal.Signals) -> None:
        """Signal the process group, but only while our child is unreaped (its pid is still ours)."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """SIGTERM the group, wait up to STOP_TIMEOUT, then SIGKILL; always reap the child."""
        self.terminate(signal.SIGTERM)
        try:
            self.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.terminate(signal.SIGKILL)
            self.popen.wait()

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self, what: str) -> str:
        return f"{self.name} {what}; last lines of {self.log.name}:\n{self.tail()}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


