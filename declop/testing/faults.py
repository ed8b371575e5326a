"""Network faults between an operator and the apiserver: a TCP proxy a test can cut, refuse or
black-hole at will.

    with TcpProxy(control_plane.host) as proxy:
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig_path, tmp_path / "via-proxy")
        ...                     # start the operator with that kubeconfig
        proxy.cut()             # reset every open connection (the watch ends with ECONNRESET)
        proxy.blackhole()       # stop forwarding: requests hang, nothing errors
        proxy.refuse()          # new connections are reset as soon as they are accepted
        proxy.forward()         # back to normal; bytes held by the black hole are delivered

The proxy forwards raw bytes (TLS passes through untouched, so the apiserver's certificate stays
valid: it listens on the same loopback address). It runs its own event loop in a daemon thread;
every method is safe to call from the test's thread and returns once the change is in effect.

Invariants:
- in ``blackhole`` mode no byte crosses the proxy in either direction, on old or new connections;
  the bytes are held, not dropped (like TCP retransmission over a link that comes back);
- :meth:`cut` resets (RST, not FIN) both sides of every connection open at that moment;
- :attr:`accepted` counts every connection the proxy accepted, :attr:`open_connections` those
  still open, so a test can see a client reconnect.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

__all__ = ["TcpProxy"]

_LINGER_RST = struct.pack("ii", 1, 0)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        except OSError:
            pass
    writer.transport.abort()


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``https://host:port`` or ``host:port``)."""

    def __init__(self, target: str, *, listen_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        parts = urlsplit(target if "//" in target else f"tcp://{target}")
        if not parts.hostname or not parts.port:
            raise ValueError(f"TcpProxy needs host:port or a URL with a port, got {target!r}")
        self.scheme = parts.scheme if parts.scheme in ("http", "https") else "https"
        self.target_host, self.target_port = parts.hostname, parts.port
        self.listen_host, self._listen_port = listen_host, listen_port
        self.mode = "forward"
        self.accepted = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._flowing: asyncio.Event | None = None

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> TcpProxy:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="declop-tcp-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.listen_host, self._listen_port)
        self._listen_port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._thread is None:
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None
        self._loop.close()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- where it listens ----------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._listen_port

    @property
    def url(self) -> str:
        """The proxy's address in the target's scheme, e.g. ``https://127.0.0.1:41234``."""
        return f"{self.scheme}://{self.listen_host}:{self.port}"

    def kubeconfig(self, source: str | Path, dest: str | Path) -> str:
        """Copy the kubeconfig ``source`` to ``dest`` with every cluster's server set to the proxy."""
        import yaml  # type: ignore[import-untyped]  # declop[test]

        data: dict[str, Any] = yaml.safe_load(Path(source).read_text())
        for cluster in data.get("clusters") or ():
            cluster["cluster"]["server"] = self.url
        Path(dest).write_text(json.dumps(data))
        Path(dest).chmod(0o600)
        return str(dest)

    # -- faults --------------------------------------------------------------------------------
    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    def forward(self) -> None:
        """Normal operation: forward everything (held bytes are delivered now)."""
        self._call(self._set_mode("forward"))

    def blackhole(self) -> None:
        """Stop forwarding in both directions on every connection, old and new; nothing errors."""
        self._call(self._set_mode("blackhole"))

    def refuse(self) -> None:
        """Reset every new connection as soon as it is accepted (existing ones are untouched)."""
        self._call(self._set_mode("refuse"))

    def cut(self) -> int:
        """Reset both sides of every open connection; return how many were cut. Mode unchanged."""
        return int(self._call(self._cut_async()))

    async def _set_mode(self, mode: str) -> None:
        assert self._flowing is not None
        self.mode = mode
        if mode == "blackhole":
            self._flowing.clear()
        else:
            self._flowing.set()

    async def _cut_async(self) -> int:
        return self._cut()

    def _cut(self) -> int:
        pairs, self._pairs = self._pairs, set()
        for a, b in pairs:
            _reset(a)
            _reset(b)
        return len(pairs)

    def _call(self, coro: Any) -> Any:
        if self._thread is None:
            raise RuntimeError("the proxy is not running; use it as a context manager or call start()")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- forwarding ----------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "refuse":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                writer.transport.abort()
                up_writer.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        flowing = self._flowing
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if not flowing.is_set():
                    await flowing.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if not writer.transport.is_closing():
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    writer.transport.abort()
