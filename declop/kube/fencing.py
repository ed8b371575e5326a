"""Fencing of writes: the Lease a reconcile call's writes are checked against, just before each is sent.

While a reconcile call runs under a Lease (leader election, or the Lease of its key's hash range),
the controller puts the call's :class:`WriteFence` in a context variable (:func:`enter` …
:func:`leave`) around everything that may write for it: our finalizer patch, the handler call,
the finalizer release. The transport (:class:`~declop.kube.transport.Transport`, and the fake
apiserver of :mod:`declop.testing`) asks :func:`current` for it and calls :meth:`WriteFence.check`
before it sends any request that is not a GET — after its client-side rate-limit wait, again
before each retry, and again once the attempt holds its pooled connection
(:class:`FencedConnector`), so the check is the last thing before the bytes
leave. A fence that is not valid at that instant raises :class:`~declop.errors.Fenced`: nothing is
sent.

How the fence reaches every write of a call:

- an ``async def`` handler runs in the worker's task: the variable is set in that task, and
  tasks it creates copy it;
- a plain handler runs in an executor thread: :func:`~declop.reconcile._run.run_batch` sets the
  variable in that thread around each call; the sync :class:`~declop.reconcile.client.Client`
  sends each request as a coroutine on the manager's loop through ``call_soon_threadsafe``,
  which runs it in a copy of the calling thread's context — so the coroutine sees the same fence.

Invariants:
- outside a call (the manager's own requests, Lease traffic, webhooks, background tasks, a
  client used by hand, informers) no fence is set and nothing is checked; without leader
  election and sharding no call has one either;
- a check that fails raises and marks the fence ``tripped`` (the first :class:`Fenced`), so the
  controller settles the call as fenced — once, whatever the handler did with the exception;
- a check costs one ``ContextVar.get`` without a fence, and one call of the Lease's ``valid()``
  (a clock read) with one: ``bench/fence_check.py`` measures it; a write is checked twice per
  attempt (before it, and with its connection); a request without a fence (or a GET) costs the
  pool one ``ContextVar.get`` and no object (:class:`FencedConnector`).
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Coroutine

import aiohttp

from declop.errors import Fenced

__all__ = ["FencedConnector", "WriteFence", "check", "current", "enter", "leave"]


class WriteFence:
    """The Lease one reconcile call writes under: ``valid()`` is its fence, ``lease`` names it
    (``namespace/name``) and ``key`` is the call's key, for the message. ``scope`` is what the
    Lease covers, for work that outlives the call (a daemon, :mod:`declop.handlers.daemons`):
    in sharded mode ``(ShardSet, range index)``, so that work can count itself in flight in its
    range and hear of a drain; None under the leader Lease."""

    __slots__ = ("valid", "lease", "key", "tripped", "scope")

    def __init__(self, valid: Callable[[], bool], lease: str, key: Any, scope: Any = None) -> None:
        self.valid = valid
        self.lease = lease
        self.key = key
        self.scope = scope
        #: the first refusal of this call (None: every write so far was sent)
        self.tripped: Fenced | None = None

    def check(self, method: str, path: str) -> None:
        """Raise :class:`~declop.errors.Fenced` unless the Lease is known valid now."""
        if self.valid():
            return
        error = Fenced(
            f"{method} {path} was not sent: Lease {self.lease} is not known valid on this replica "
            f"(lost or expired); the call ends and {self.key} is left to the Lease's new owner"
        )
        if self.tripped is None:
            self.tripped = error
        raise error

    def __repr__(self) -> str:
        return f"WriteFence(lease={self.lease!r}, key={self.key!r}, tripped={self.tripped is not None})"


_CURRENT: contextvars.ContextVar[WriteFence | None] = contextvars.ContextVar("declop_write_fence", default=None)

#: the fence of the call running in this context, or None (the hot path: one ContextVar read)
current = _CURRENT.get


def enter(fence: WriteFence | None) -> contextvars.Token[WriteFence | None] | None:
    """Make ``fence`` the current one (None: nothing to do); pass the result to :func:`leave`."""
    return _CURRENT.set(fence) if fence is not None else None


def leave(token: contextvars.Token[WriteFence | None] | None) -> None:
    """Undo :func:`enter`."""
    if token is not None:
        _CURRENT.reset(token)


def check(method: str, path: str) -> None:
    """Check the current fence, if any, for a write about to be sent (a fake transport's call)."""
    fence = _CURRENT.get()
    if fence is not None:
        fence.check(method, path)


class FencedConnector(aiohttp.TCPConnector):
    """The request session's connection pool, which checks a fenced write once more when it has
    its connection: the last moment before its bytes are written.

    A write passes :meth:`WriteFence.check` in :meth:`~declop.kube.transport.Transport.request`,
    then may wait here — for one of ``max_connections`` connections shared with lists, Lease
    renewals and other writes, or for a new connection's handshakes. A Lease lost meanwhile must
    stop it: once the pool hands over a connection, the write's fence is checked, and a refused
    write gives the unused connection back to the pool and raises :class:`~declop.errors.Fenced`.

    - The fence is the context variable of the task sending the request: aiohttp asks for the
      connection in that task (a plain handler's write runs as a coroutine on the loop in a copy
      of its thread's context, :mod:`declop.kube.fencing`), so it is the call's own fence.
    - Every attempt asks for a connection, aiohttp's own too: it sends an idempotent request
      (PUT, DELETE) once more on a fresh connection when the first one dropped without an
      answer, and that resend is checked like the first attempt.
    - Between the handover and the write there is no wait: aiohttp writes the head and body at
      once (on Python 3.11 they leave from a task that runs in the loop's next turn, with nothing
      to wait for; from 3.12 that task starts eagerly).

    Unfenced requests (GETs, and writes outside a call or without Leases) pay one
    ``ContextVar.get``: :meth:`connect` is a plain method that hands back the pool's own
    coroutine for them, so nothing else is allocated; only a fenced write gets the wrapping
    coroutine that checks after the wait.

    (The alternative, a pool of its own for fenced writes, still waits for a handshake, or behind
    other writes once that pool is full: only a check after the wait closes the gap.)"""

    def connect(self, req: Any, traces: Any, timeout: Any) -> Coroutine[Any, Any, Any]:
        fence = current()
        if fence is None or req.method == "GET":
            return _CONNECT(self, req, traces, timeout)
        return self._connect_fenced(fence, req, traces, timeout)

    async def _connect_fenced(self, fence: WriteFence, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await _CONNECT(self, req, traces, timeout)
        try:
            fence.check(req.method, req.url.path)
        except BaseException:
            conn.release()  # nothing was written on it: back to the pool, reusable
            raise
        return conn


#: the pool's own ``connect`` (a coroutine function), called without ``super()``: no object per request
_CONNECT = aiohttp.TCPConnector.connect
