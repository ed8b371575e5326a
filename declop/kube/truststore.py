"""aiohttp's two default TLS contexts, with the system trust store read on first use, not at import.

``import aiohttp`` builds two module-level client contexts (``aiohttp.connector``, one verifying
and one not) and each parses the system trust store on the spot: together the largest single
item between ``python`` and declop's first request (bench/FINDINGS.md, "Start-up"). declop's
own client never uses either: it builds its context from the cluster's CA
(``kube/credentials.py``). A handler that calls ``aiohttp`` with default TLS does use them.

:func:`import_aiohttp` imports ``aiohttp.connector`` with those two reads deferred, and aiohttp's
``TCPConnector._get_ssl_context`` (the only place aiohttp hands them to a connection) wrapped to
read the trust store into a deferred context just before handing it out — the same read, the
same files, the same environment (``SSL_CERT_FILE``/``SSL_CERT_DIR``) as at import, once per
context. The first default-TLS connection of a process pays the read instead of its import.

Invariants:

- a context aiohttp hands to a connection has read the default trust store first: what a
  handler's ``aiohttp`` call trusts does not change;
- only contexts built *on the importing thread, during that import* are deferred; every other
  ``set_default_verify_paths`` call, before, after or beside it, runs as written;
- when aiohttp was imported before declop, or its module no longer has the layout this was
  written against (the two module-level contexts, a plain ``_get_ssl_context``), nothing is
  deferred: the trust store is read at once, as without declop.
"""

from __future__ import annotations

import ssl
import sys
import threading
from types import FunctionType, ModuleType
from typing import Any, Callable

__all__ = ["deferred", "import_aiohttp"]

_NAME = "set_default_verify_paths"
_HELD = ("_SSL_CONTEXT_VERIFIED", "_SSL_CONTEXT_UNVERIFIED")

#: Contexts whose trust store is not read yet; emptied as they are handed out.
_pending: list[ssl.SSLContext] = []
_lock = threading.Lock()


def deferred() -> int:
    """How many of aiohttp's default contexts still wait for their trust store (0, 1 or 2)."""
    return len(_pending)


def import_aiohttp() -> ModuleType:
    """Import ``aiohttp.connector`` with its default contexts' trust-store reads deferred; return it.

    Idempotent; a no-op (beyond the import) when aiohttp is already imported.
    """
    if "aiohttp.connector" in sys.modules:
        return sys.modules["aiohttp.connector"]
    caught: list[ssl.SSLContext] = []
    own = _NAME in vars(ssl.SSLContext)
    original: Callable[[ssl.SSLContext], None] = getattr(ssl.SSLContext, _NAME)
    importer = threading.get_ident()

    def hold(ctx: ssl.SSLContext) -> None:
        if threading.get_ident() != importer:
            original(ctx)
        else:
            caught.append(ctx)

    setattr(ssl.SSLContext, _NAME, hold)
    try:
        import aiohttp.connector as connector
    finally:
        if own:
            setattr(ssl.SSLContext, _NAME, original)
        else:
            delattr(ssl.SSLContext, _NAME)
    if caught:
        _hook(connector, caught)
    return connector


def _hook(connector: ModuleType, caught: list[ssl.SSLContext]) -> None:
    """Wrap the hand-out if the layout is the known one; otherwise read every caught context now."""
    held = [getattr(connector, name, None) for name in _HELD]
    cls = getattr(connector, "TCPConnector", None)
    getter = vars(cls).get("_get_ssl_context") if isinstance(cls, type) else None
    known = (
        isinstance(getter, FunctionType)
        and len(caught) == len(held)
        and all(any(ctx is h for h in held) for ctx in caught)
    )
    if not known:
        for ctx in caught:
            ctx.set_default_verify_paths()
        return
    assert cls is not None and getter is not None
    _pending[:] = caught
    handout: Callable[[Any, Any], ssl.SSLContext | None] = getter

    def _get_ssl_context(self: Any, req: Any) -> ssl.SSLContext | None:
        ctx = handout(self, req)
        if _pending and ctx is not None:
            _load(ctx)
        return ctx

    _get_ssl_context.__doc__ = getter.__doc__
    _get_ssl_context.__wrapped__ = getter  # type: ignore[attr-defined]
    cls._get_ssl_context = _get_ssl_context


def _load(ctx: ssl.SSLContext) -> None:
    """Read the trust store into ``ctx`` if it is one still pending; exactly once per context."""
    with _lock:
        for i, pending in enumerate(_pending):
            if pending is ctx:
                ctx.set_default_verify_paths()
                del _pending[i]
                return
