"""Network faults between an operator and the apiserver: a TCP proxy a test can cut, refuse or
black-hole at will, and an HTTP CONNECT proxy (the ``proxy-url`` of a kubeconfig) that can ask
for credentials and be cut.

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
  still open, so a test can see a client reconnect;
- :class:`ConnectProxy` opens a tunnel only for a ``CONNECT`` with the credentials it was given
  (407 otherwise; 405 for another method), to 127.0.0.1 whatever host was asked for, and
  records every target in :attr:`ConnectProxy.targets`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ConnectProxy", "TcpProxy"]

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


class ConnectProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 (threads): tunnels to 127.0.0.1 whatever host is asked
    for (so a made-up server name reaches the test apiserver), optionally only for
    ``Proxy-Authorization: Basic user:password``, and can be cut."""

    def __init__(self, credentials: tuple[str, str] | None = None) -> None:
        #: the ``host:port`` of every CONNECT it tunnelled
        self.targets: list[str] = []
        self.tunnels = 0
        self.cut = False
        self._expected = None if credentials is None else "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
        self._sockets: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        #: the proxy's URL, without credentials
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True, name="connect proxy").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.cut:
                client.close()
                continue
            self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                client.close()
                return
            head += chunk
        lines = head.split(b"\r\n")
        method, target, _ = lines[0].decode().split(" ", 2)
        if method != "CONNECT":
            client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            client.close()
            return
        if self._expected is not None:
            given = [line.split(b":", 1)[1].strip().decode() for line in lines[1:] if line.lower().startswith(b"proxy-authorization:")]
            if given != [self._expected]:
                client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                client.close()
                return
        self.targets.append(target)
        upstream = socket.create_connection(("127.0.0.1", int(target.rsplit(":", 1)[1])))
        self._sockets.append(upstream)
        self.tunnels += 1
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut_all(self) -> None:
        """Reset every tunnel and stop listening (connections refused): watches break, relists
        fail with the proxy named in their errors."""
        self.cut = True
        self._server.close()
        for s in self._sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._server.close()
        for s in self._sockets:
            s.close()
