"""The fault-injecting TCP proxy of declop.testing, against a local echo server."""

from __future__ import annotations

import socket
import threading
from typing import Iterator

import pytest

from declop.testing.cluster.faults import TcpProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stopping = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:  # the proxy reset us: that is what some tests do
                pass

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield server.getsockname()[1]
    stopping.set()
    t.join()
    server.close()


def _connect(proxy: TcpProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    return s


def test_forwards_bytes_both_ways(echo: int) -> None:
    with TcpProxy(f"127.0.0.1:{echo}") as proxy, _connect(proxy) as s:
        s.sendall(b"hello")
        assert s.recv(100) == b"hello"
        assert proxy.accepted == 1


def test_cut_resets_open_connections(echo: int) -> None:
    with TcpProxy(f"127.0.0.1:{echo}") as proxy, _connect(proxy) as s:
        s.sendall(b"x")
        assert s.recv(10) == b"x"
        assert proxy.cut() == 1
        with pytest.raises(ConnectionResetError):
            s.sendall(b"y")
            s.recv(10)
        with _connect(proxy) as s2:  # new connections work again
            s2.sendall(b"z")
            assert s2.recv(10) == b"z"


def test_blackhole_holds_bytes_until_forward(echo: int) -> None:
    with TcpProxy(f"127.0.0.1:{echo}") as proxy, _connect(proxy) as s:
        proxy.blackhole()
        s.sendall(b"held")
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            s.recv(10)
        proxy.forward()
        s.settimeout(2)
        assert s.recv(10) == b"held"


def test_refuse_resets_new_connections(echo: int) -> None:
    with TcpProxy(f"127.0.0.1:{echo}") as proxy:
        proxy.refuse()
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with _connect(proxy) as s:  # the reset may come during or right after the handshake
                s.sendall(b"a")
                if not s.recv(10):
                    raise ConnectionResetError("closed")
        proxy.forward()
        with _connect(proxy) as s:
            s.sendall(b"b")
            assert s.recv(10) == b"b"


def test_kubeconfig_points_every_cluster_at_the_proxy(tmp_path, echo: int) -> None:
    src = tmp_path / "in"
    src.write_text("clusters:\n- name: a\n  cluster: {server: 'https://127.0.0.1:1'}\nusers: []\n")
    with TcpProxy(f"https://127.0.0.1:{echo}") as proxy:
        out = proxy.kubeconfig(src, tmp_path / "out")
        assert f'"server": "https://127.0.0.1:{proxy.port}"' in open(out).read()
