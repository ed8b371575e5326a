"""The exception tree of declop.

Every error declop raises on purpose derives from :class:`DeclopError`. The classes defined
here are the ones several packages share; the others live beside the code that raises them
(their module is named)::

    DeclopError
     ├── ConfigError            bad input from the user (files, options, kubeconfig); the CLI exits non-zero
     │    ├── RegistrationError   a decorator was misused, or used after the manager started
     │    │    ├── _BadConcurrency   declop.registry: max_concurrent is not a positive int (exit 2)
     │    │    └── _BadShardKey      declop.registry: a shard_by that cannot spread the objects (exit 2)
     │    ├── BadOptions          declop.cli: command-line options that contradict each other (exit 2)
     │    ├── KubeconfigError     declop.kube.kubeconfig: a malformed kubeconfig, named with its file
     │    ├── MissingPermissions  declop.kube.access: RBAC lacks grants declop needs, one line each
     │    └── ScaffoldError       declop.dev.scaffold: ``declop new`` cannot write the project it was asked for
     ├── ApiError               the apiserver answered with a non-2xx status (``.status``, ``.reason``)
     │    ├── NotFound            404 — also raised by cache reads for a missing object
     │    ├── Conflict            409 — a stale resourceVersion; re-read and retry
     │    ├── Forbidden           403 — RBAC denies the request; the message names verb and resource
     │    ├── StreamIdle          declop.kube.transport: a watch that had begun went silent; the informer re-watches
     │    └── StreamInterrupted   declop.kube.transport: a watch that had begun was cut; the informer re-watches
     ├── CacheNotSyncedError    a read hit a cache that has not listed yet; retried like any failure
     ├── ReconcileTimeout       an async handler passed its timeout=: cancelled, retried (also a TimeoutError)
     ├── InvalidObject          a cached object fails the handler's typed model (``obj: Widget``): skipped
     ├── Fenced                 a call's write was not sent: its Lease is not known valid; the key is left
     ├── AlreadyOwnedError      declop.reconcile.ownership: the child already has another controller
     ├── DaemonStillRunning     declop.handlers.daemons: a daemon did not end in time; its finalizer stays, retried
     ├── LeaseLost              declop.manager.embedded: an embedded Operator lost its Lease and stopped
     ├── BadReview              declop.webhooks.admission: a webhook request body that is not a review (HTTP 400)
     │    └── Oversized          too many objects and arrays to decode
     ├── Rejected               declop.webhooks.declaration (``declop.Rejected``): a validator or mutator denies
     ├── ImageBuildError        declop.testing.cluster.buildkit (``declop.testing``): an image build failed
     ├── TemporaryError         raised by a handler: retry after its ``delay``, not the per-key backoff
     └── TerminalError          raised by a handler: log, count, and do not retry
          └── InvalidResult       a handler built a bad Result or returned something else (also a TypeError/ValueError)

Who handles what: handlers raise ``TerminalError`` or ``TemporaryError`` (webhook handlers ``Rejected``) and may catch
``NotFound``/``Conflict``; controllers end a call that met ``Fenced`` without a retry (whatever
the handler made of it) and turn every other exception into a rate-limited retry; only the CLI
maps ``ConfigError`` (and unreachable/forbidden apiservers) to exit codes.

Not declop errors: signals a module raises and its own caller catches. One that escapes is a
bug, so none may be mistaken for a user's error by an ``except DeclopError``::

    Exception
     ├── QueueEmpty          declop.queue.workqueue: nothing is ready (``get_nowait``)
     ├── QueueShutDown       declop.queue.workqueue: the queue is shut down and drained
     ├── TooManyReviews      declop.serving.metricsauth: too many token reviews wait (answered 429)
     ├── _Gone               declop.serving.metricsauth: the caller hung up while its review waited
     ├── _Relist             declop.cache.watch: the watch ended in a way only a relist repairs
     ├── _Throttled          declop.cache.watch: 429 as an in-stream ERROR event
     ├── _BadTransform       declop.cache.store: a transform returned something the store cannot key
     ├── _Deeper             declop.webhooks.decode: the depth check's unwinding
     ├── _Overran            declop.webhooks.server: a webhook handler passed its timeout
     ├── ValueError
     │    ├── TooDeep           declop.webhooks.decode: a body nested too deep (denied, named)
     │    ├── NoModel           declop.webhooks.typed: an object of a version the converter names no model for
     │    └── TooMany           declop.webhooks.decode: a body with too many containers (``Oversized``)
     └── RuntimeError
          ├── Deadlock          declop.testing.simulation.loop: a simulated world with nothing to run and no timer
          └── _PortTaken        declop.testing.cluster.controlplane: a component's port was taken before it bound it

``tests/unit/test_errors.py`` checks both drawings against every exception class in declop.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "CacheNotSyncedError",
    "ConfigError",
    "Conflict",
    "DeclopError",
    "Fenced",
    "Forbidden",
    "InvalidObject",
    "InvalidResult",
    "NotFound",
    "ReconcileTimeout",
    "RegistrationError",
    "TemporaryError",
    "TerminalError",
]


class DeclopError(Exception):
    """Root of every error declop raises on purpose."""


class ConfigError(DeclopError):
    """The user's input is wrong: a missing file, a bad option, an unknown resource, no kubeconfig.

    The message is one line that says what is wrong and what to do.
    """


class RegistrationError(ConfigError, TypeError):
    """A decorator was called with bad arguments, or after the manager froze the registry."""


class ApiError(DeclopError):
    """The apiserver answered ``status`` (non-2xx). ``body`` is the decoded Status, if any.
    ``retry_after`` is the server's ``Retry-After`` in seconds, when it sent one (429, 503)."""

    retry_after: float | None = None

    def __init__(self, status: int, reason: str, message: str = "", body: object = None) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(message or f"{status} {reason}")

    @property
    def message(self) -> str:
        return str(self)


class NotFound(ApiError, LookupError):
    """404 from the apiserver, or a cache read of an object that is not there."""

    def __init__(self, message: str = "not found", body: object = None) -> None:
        super().__init__(404, "NotFound", message, body)


class Conflict(ApiError):
    """409: the write was based on a stale resourceVersion. Re-read and try again."""

    def __init__(self, message: str = "conflict", body: object = None) -> None:
        super().__init__(409, "Conflict", message, body)


class Forbidden(ApiError, PermissionError):
    """403: RBAC does not allow the request. The message names the verb and resource."""

    def __init__(self, message: str = "forbidden", body: object = None) -> None:
        super().__init__(403, "Forbidden", message, body)


class CacheNotSyncedError(DeclopError):
    """A cache read happened before the informer's first list finished; the reconcile is retried."""


class TerminalError(DeclopError):
    """Raised by a handler when retrying cannot help: logged and counted, never retried.

    ``TerminalError("bad spec")`` or ``raise TerminalError("bad spec") from exc``.
    """


class TemporaryError(DeclopError):
    """Raised by a handler to be retried after ``delay`` seconds, instead of after the rate
    limiter's per-key backoff: ``raise TemporaryError("bucket not ready", delay=30)``.

    The call ends as ``temporary_error`` (docs/contract.md §3): the key is added back after
    ``delay`` without counting a failure, so a plain exception later still starts its backoff
    where it was. The delay is kept in memory; a step of ``steps.run`` records it on the object
    so that it survives a restart (docs/steps.md). Kopf's ``kopf.TemporaryError(delay=)``.

    Raises:
        ValueError: ``delay`` is not a finite number of seconds >= 0.
    """

    def __init__(self, message: str = "", delay: float = 60.0) -> None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < float("inf"):
            raise ValueError(f"TemporaryError(delay=) is a finite number of seconds >= 0, got {delay!r}")
        self.delay = float(delay)
        super().__init__(message or f"temporary error; retried in {self.delay:g} s")


class InvalidResult(TerminalError, TypeError, ValueError):
    """A handler built an invalid :class:`~declop.reconcile.result.Result` (raised at construction) or
    returned something that is neither ``None`` nor a ``Result``.

    Terminal: retrying would repeat the handler's side effects and fail the same way. The
    message names the type (and, for a number or short string, the value) and says what to
    return instead — never the contents of an object.
    """


class ReconcileTimeout(DeclopError, TimeoutError):
    """An ``async def`` handler ran past its ``timeout=``: it was cancelled and its key is retried
    with backoff. (A plain handler cannot be cancelled: its overrun is only reported.)"""


class InvalidObject(DeclopError, ValueError):
    """A cached object fails validation against the model a handler declared (``obj: Widget``).

    The handler is not called and the key is not retried: reported once per resourceVersion
    (``problems`` holds one ``"spec.replicas: Input should be ..."`` line per error) and skipped
    until the object changes. ``report`` is False when this resourceVersion was reported already.
    """

    def __init__(self, resource_version: str, problems: tuple[str, ...], *, report: bool = True) -> None:
        self.resource_version = resource_version
        self.problems = problems
        self.report = report
        super().__init__("; ".join(problems) or "invalid object")


class Fenced(DeclopError):
    """A write of a reconcile call was not sent: the Lease that covers the call's key (the leader
    Lease, or the Lease of the key's hash range) is not known valid on this replica at that instant.

    Raised by every write through declop's client during such a call (and by the finalizer
    writes and Events made for it), checked just before the request would go out. The call
    ends: no retry on this replica, no backoff — the Lease's new owner reconciles the key. A
    handler that catches it changes nothing: its later writes are refused too, and the call is
    settled as fenced all the same. The message names the request and the Lease.
    """
