"""Structured logging on top of stdlib ``logging``: the bound reconcile logger and two formatters.

A log record may carry key/value pairs in ``record.kv`` (a dict). The formatters render them:

- :class:`PlainFormatter` — the seed's line shape, pairs in insertion order::

      INFO Pod created {"controller": "example", "namespace": "default", "name": "nginx", "reconcileID": "…"}

- :class:`JsonFormatter` — one JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the pairs,
  and ``error`` (the traceback) when there is one.

:class:`ReconcileLogger` is what handlers receive: every line carries ``controller``, ``namespace``,
``name`` and the reconcile's ``reconcileID``; extra pairs come as keyword arguments.
Only ``declop.cli`` installs handlers (:func:`configure`); a library user keeps full control.

Invariant: declop's own messages never carry object contents (they name the type and the key).
As a second line of defence, both formatters pass the pairs and the ``%`` arguments through
:func:`redact`, so a Secret given as a pair or argument — by a handler, or at ``-v``; a plain
dict, a read-only view, a list of them or a ``SecretList`` — shows its keys but never its
``data`` or ``stringData`` values.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, Mapping, Sequence

__all__ = [
    "JsonFormatter",
    "PlainFormatter",
    "REDACTED",
    "ReconcileLogger",
    "configure",
    "kv",
    "redact",
    "set_trigger_in_context",
    "trigger_in_context",
]

# Whether reconcile loggers carry the compact ``trigger`` pair (configure() sets it: JSON, or -v)
_trigger_in_context = False


def trigger_in_context() -> bool:
    """Reconcile loggers carry a ``trigger`` pair (why the reconcile ran): in JSON mode and at
    ``-v`` (DEBUG) in plain mode, as :func:`configure` set it."""
    return _trigger_in_context


def set_trigger_in_context(on: bool) -> None:
    """Turn the ``trigger`` pair on or off (for library users who install their own handlers)."""
    global _trigger_in_context
    _trigger_in_context = bool(on)


REDACTED = "<redacted>"


def redact(value: Any) -> Any:
    """``value`` with every Secret's ``data``/``stringData`` values replaced by :data:`REDACTED`
    (keys kept), at any depth of mappings and sequences: a Secret (``kind: Secret``), the items
    of a ``SecretList`` (whose items carry no ``kind``), and read-only views of cached objects
    (``declop.cache.store.readonly``: any ``Mapping``/``Sequence``), which come back as plain
    dicts and lists so they render as JSON rather than as their repr. Returns ``value`` itself
    when it is plain and there is nothing to redact, so the common case copies nothing."""
    return _redact(value, False)


def _redact(value: Any, secret: bool) -> Any:
    if isinstance(value, Mapping):
        out: dict[Any, Any] | None = None if type(value) is dict else dict(value)
        kind = value.get("kind")
        secret = secret or kind == "Secret"
        items_are_secrets = kind == "SecretList"
        for k, v in value.items():
            if secret and k in ("data", "stringData") and isinstance(v, Mapping):
                new: Any = {dk: REDACTED for dk in v}
            elif items_are_secrets and k == "items" and _is_sequence(v):
                new = [_redact(item, True) for item in v]
            else:
                new = _redact(v, False)
            if new is not v:
                if out is None:
                    out = dict(value)
                out[k] = new
        return value if out is None else out
    if _is_sequence(value):
        items = [_redact(v, secret) for v in value]
        if type(value) is tuple:
            return value if all(a is b for a, b in zip(items, value)) else tuple(items)
        if type(value) is list and all(a is b for a, b in zip(items, value)):
            return value
        return items
    return value


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview))


def _message(record: logging.LogRecord) -> str:
    """``record.getMessage()`` with its ``%`` arguments redacted (a Secret given as ``%s``)."""
    if not record.args:
        return record.getMessage()
    args = redact(record.args)
    if args is record.args:
        return record.getMessage()
    return str(str(record.msg) % args)


def kv(pairs: Mapping[str, Any]) -> str:
    """Render pairs as compact-but-readable JSON: ``{"a": 1, "b": "x"}``."""
    return json.dumps(pairs, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """``LEVEL message {pairs}`` plus the traceback on the following lines, if any."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname} {_message(record)}"
        pairs = getattr(record, "kv", None)
        if pairs:
            line = f"{line} {kv(redact(pairs))}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": _message(record),
        }
        pairs = getattr(record, "kv", None)
        if pairs:
            for k, v in redact(pairs).items():
                out.setdefault(k, v)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class ReconcileLogger:
    """A logger bound to one reconcile. ``logger.info("Scaled", replicas=3)``.

    The bound pairs come first, in order: controller, namespace, name, reconcileID.
    """

    __slots__ = ("_logger", "context")

    def __init__(self, logger: logging.Logger, context: Mapping[str, Any]) -> None:
        self._logger = logger
        self.context = dict(context)

    def bind(self, **pairs: Any) -> ReconcileLogger:
        """A logger with more pairs bound."""
        return ReconcileLogger(self._logger, {**self.context, **pairs})

    def _log(self, level: int, msg: str, args: tuple[Any, ...], pairs: dict[str, Any], exc_info: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(
                level, msg, *args, exc_info=exc_info, extra={"kv": {**self.context, **pairs}}, stacklevel=3
            )

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **pairs: Any) -> None:
        self._log(logging.DEBUG, msg, args, pairs, exc_info)

    def info(self, msg: str, *args: Any, exc_info: Any = None, **pairs: Any) -> None:
        self._log(logging.INFO, msg, args, pairs, exc_info)

    def warning(self, msg: str, *args: Any, exc_info: Any = None, **pairs: Any) -> None:
        self._log(logging.WARNING, msg, args, pairs, exc_info)

    warn = warning

    def error(self, msg: str, *args: Any, exc_info: Any = None, **pairs: Any) -> None:
        self._log(logging.ERROR, msg, args, pairs, exc_info)

    def exception(self, msg: str, *args: Any, **pairs: Any) -> None:
        self._log(logging.ERROR, msg, args, pairs, True)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - stdlib name
        return self._logger.isEnabledFor(level)


def configure(fmt: str = "plain", level: int = logging.INFO, stream: Any = None) -> logging.Handler:
    """Install one stream handler on the root logger (replacing ours if called again)."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    handler._declop = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_declop", False):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    set_trigger_in_context(fmt == "json" or level <= logging.DEBUG)
    # third-party chatter stays quiet unless -v
    for noisy in ("kubernetes", "urllib3", "aiohttp", "asyncio"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    return handler
