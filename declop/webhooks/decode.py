"""Decoding review bodies within limits: JSON too deep for Python's recursion, numbers too long,
and large bodies parsed in pieces so no single step holds the interpreter long.

The apiserver accepts objects nested up to 10,000 levels (Go's encoding/json limit) and integers
up to 64 bits. Python's ``json`` gives up near 1,000 levels (``RecursionError``) and on integers
of more than 4,300 digits (``ValueError``); the copy and diff of an object recurse once per
level. So declop's webhooks handle objects nested at most :data:`MAX_DEPTH` levels and refuse
deeper ones with a clear answer (a denial, a failed conversion naming the object) — never an
error the apiserver's ``failurePolicy: Ignore`` would turn into "admitted".

Invariants:
- :func:`loads` returns what ``json.loads`` returns for every body it accepts, whatever its
  size; it raises :class:`ValueError` (with a message naming no value from the body) for a body
  that is not JSON;
- a body that is valid JSON but nested too deep for Python decodes to a *skeleton*: every
  container deeper than :data:`KEEP_DEPTH` levels replaced by ``null``, so its envelope (kind,
  uid, names) is readable and :func:`bounded_clone` of any object that held such a container
  raises :class:`TooDeep`;
- :func:`bounded_clone` and :func:`check_depth` recurse at most ``limit`` levels: they never
  raise ``RecursionError`` on a shallow stack, whatever the input;
- :func:`check_size` refuses a body with more than :data:`MAX_CONTAINERS` brackets before any
  of it is decoded (two ``bytes.count``): a body of 7 MiB of ``[],`` would
  be 2.4 million lists, half a GiB of Python and 25 s of parsing;
- :func:`dismantle` frees what :func:`loads` built the same way, a member at a time;
- bodies above :data:`PIECE` bytes are parsed as pieces of at most about :data:`PIECE` bytes
  each, joined in Python (every piece is one short C call; the rest lets other threads run).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Callable, Iterator

__all__ = [
    "KEEP_DEPTH", "MAX_CONTAINERS", "MAX_DEPTH", "PIECE", "TooDeep", "TooMany", "bounded_clone",
    "check_depth", "check_size", "dismantle", "loads",
]

#: levels of nesting of an object (the object itself is level 1) a webhook handles
MAX_DEPTH = 512
#: levels of a too-deep body kept in its skeleton: the deepest object at MAX_DEPTH in a review
#: (review → request → objects → object) is whole, anything deeper is cut
KEEP_DEPTH = MAX_DEPTH + 4
#: objects and arrays one body may hold (brackets counted, also inside strings: an upper
#: bound): one per 36 bytes of the largest body, several times what real objects use (a Pod
#: has about one per 60 bytes); a body within it decodes to at most ~100 MiB of Python
MAX_CONTAINERS = 200_000
#: bytes parsed in one C call at most (a call holds the interpreter: keep each one short)
PIECE = 128 * 1024

try:  # pragma: no branch
    import orjson

    _fast: Callable[[bytes], Any] = orjson.loads
    _FastError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - exercised when orjson is absent
    _fast = json.loads
    _FastError = json.JSONDecodeError


class TooDeep(ValueError):
    """An object nests deeper than the limit; the message says so without quoting it."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the object is nested deeper than {limit} levels, more than declop's webhooks handle")
        self.limit = limit


class TooMany(ValueError):
    """A body holds more objects and arrays than the limit; the message says so."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(
            f"the request holds up to {count} JSON objects and arrays, more than the {limit} declop's webhooks decode"
        )
        self.count, self.limit = count, limit


def check_size(body: bytes, limit: int = MAX_CONTAINERS) -> None:
    """Raise :class:`TooMany` when ``body`` may hold more than ``limit`` objects and arrays."""
    count = body.count(b"{") + body.count(b"[")
    if count > limit:
        raise TooMany(count, limit)


def bounded_clone(obj: Any, limit: int = MAX_DEPTH) -> Any:
    """A deep copy of JSON-shaped ``obj``; raises :class:`TooDeep` past ``limit`` levels."""
    try:
        return _clone(obj, limit)
    except _Deeper:
        raise TooDeep(limit) from None


class _Deeper(Exception):
    pass


def _clone(obj: Any, left: int) -> Any:
    t = type(obj)
    if t is dict:
        if left <= 0:
            raise _Deeper()
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out[k] = _clone(v, left - 1) if type(v) in (dict, list) else v
        return out
    if t is list:
        if left <= 0:
            raise _Deeper()
        items: list[Any] = []
        for v in obj:
            items.append(_clone(v, left - 1) if type(v) in (dict, list) else v)
        return items
    return obj


def check_depth(obj: Any, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`TooDeep` when ``obj`` nests deeper than ``limit`` levels."""
    try:
        _check(obj, limit)
    except _Deeper:
        raise TooDeep(limit) from None


def _check(obj: Any, left: int) -> None:
    if type(obj) not in (dict, list):
        return
    if left <= 0:
        raise _Deeper()
    for v in obj.values() if type(obj) is dict else obj:
        if type(v) in (dict, list):
            _check(v, left - 1)


# everything up to the next bracket outside strings, then the bracket (possessive: no backtracking)
_BRACKET = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+([\[\]{}])')


def _brackets(body: bytes) -> Iterator[tuple[bytes, int]]:
    """Each bracket outside strings with its position; :class:`ValueError` on an unterminated string."""
    pos, end = 0, len(body)
    match = _BRACKET.match
    while pos < end:
        m = match(body, pos)
        if m is None:
            if body.count(b'"', pos) % 2:
                raise ValueError("the request body is not valid JSON (an unterminated string)")
            return
        yield m.group(1), m.start(1)
        pos = m.end()


def loads(body: bytes) -> Any:
    """``body`` decoded as JSON (see the module's invariants); raises :class:`ValueError`."""
    try:
        return _decode(body)
    except RecursionError:
        return _decode(_skeleton(body))


def _decode(data: bytes) -> Any:
    return _one(data) if len(data) <= PIECE else _pieces(data)


def _one(data: bytes) -> Any:
    try:
        return _fast(data)
    except _FastError as exc:
        if "recursion" in str(exc).lower() or "depth limit" in str(exc).lower():
            raise RecursionError() from None
        raise ValueError(f"the request body is not valid JSON (JSONDecodeError at position {getattr(exc, 'pos', 0)})") from None
    except RecursionError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:  # the stdlib: a too-long integer, bad bytes
        raise ValueError(f"the request body is not valid JSON ({type(exc).__name__})") from None


_BAD = "the request body is not valid JSON (unbalanced brackets)"


class _Frame:
    """A container being scanned: where it starts, its direct children, their values if large."""

    __slots__ = ("opener", "start", "children")

    def __init__(self, opener: bytes, start: int) -> None:
        self.opener, self.start = opener, start
        self.children: list[tuple[int, int, Any]] = []  # (start, end, value or _NOTHING)


_NOTHING: Any = object()


def _pieces(body: bytes) -> Any:
    """Decode a large ``body`` in one pass over its brackets: a container of at most
    :data:`PIECE` bytes is one C call, a larger one is assembled from its members."""
    frames: list[_Frame] = []
    root: Any = _NOTHING
    for bracket, at in _brackets(body):
        if bracket in b"{[":
            frames.append(_Frame(bracket, at))
            continue
        if not frames:
            raise ValueError(_BAD)
        frame = frames.pop()
        if (frame.opener == b"{") != (bracket == b"}"):
            raise ValueError(_BAD)
        end = at + 1
        big = end - frame.start > PIECE
        value = _assemble(body, frame, at) if big else _NOTHING
        if frames:
            frames[-1].children.append((frame.start, end, value))
        elif root is _NOTHING:
            if body[end:].strip() or body[:frame.start].strip():
                raise ValueError("the request body is not valid JSON (data around the value)")
            root = value if big else _one(body)
        else:
            raise ValueError("the request body is not valid JSON (data after the value)")
    if frames:
        raise ValueError(_BAD)
    return _one(body) if root is _NOTHING else root


def _assemble(body: bytes, frame: _Frame, close: int) -> Any:
    """A large container from its children (decoded or spans) and the text between them."""
    is_dict = frame.opener == b"{"
    out_dict: dict[str, Any] = {}
    out_list: list[Any] = []
    pos = frame.start + 1
    for i, (start, end, value) in enumerate(frame.children):
        gap = body[pos:start]
        if i:
            gap = _after_comma(gap)
        # the gap's members, then a placeholder for the child: {"a":1,"b": null} / [1, null]
        part = _one(b"{" + gap + b"null}" if is_dict else b"[" + gap + b"null]")
        child = value if value is not _NOTHING else _one(body[start:end])
        if is_dict:
            last = next(reversed(part))
            part[last] = child
            out_dict.update(part)
        else:
            part[-1] = child
            out_list.extend(part)
        pos = end
    tail = body[pos:close]
    if frame.children:
        if tail.strip():
            tail = _after_comma(tail)
            if not tail.strip():
                raise ValueError("the request body is not valid JSON (a trailing comma)")
    if tail.strip():
        rest = _one(b"{" + tail + b"}" if is_dict else b"[" + tail + b"]")
        if is_dict:
            out_dict.update(rest)
        else:
            out_list.extend(rest)
    return out_dict if is_dict else out_list


def _after_comma(gap: bytes) -> bytes:
    stripped = gap.lstrip()
    if not stripped.startswith(b","):
        raise ValueError("the request body is not valid JSON (a missing comma)")
    return stripped[1:]


def _skeleton(body: bytes) -> bytes:
    """``body`` with every container deeper than :data:`KEEP_DEPTH` replaced by ``null``;
    raises :class:`ValueError` when its brackets do not balance (it is not JSON)."""
    out: list[bytes] = []
    level = 0
    kept = 0  # where the part of the body not yet copied begins
    cut_at = -1  # start of the container being cut
    for bracket, at in _brackets(body):
        if bracket in b"{[":
            level += 1
            if level == KEEP_DEPTH + 1:
                cut_at = at
        else:
            level -= 1
            if level < 0:
                break
            if level == KEEP_DEPTH:
                out.append(body[kept:cut_at])
                out.append(b"null")
                kept = at + 1
    if level != 0:
        raise ValueError("the request body is not valid JSON (unbalanced brackets)")
    out.append(body[kept:])
    return b"".join(out)


def dismantle(trees: list[Any]) -> None:
    """Free ``trees`` (emptying the list) one member at a time, so freeing a large tree never
    holds the interpreter for long: each step frees one scalar or one empty container, and the
    loop's thread runs between steps.

    Only what nobody else holds is taken apart: a container a handler kept a reference to (or
    that appears twice) is only let go of, its content intact."""
    stack: list[Any] = []
    while trees:
        tree = trees.pop()
        if type(tree) in (dict, list) and tree and sys.getrefcount(tree) == 2:  # ``tree`` and the call's argument
            stack.append(tree)
        del tree
    while stack:
        container = stack.pop()
        if type(container) is dict:
            while container:
                _, value = container.popitem()
                if type(value) in (dict, list) and value and sys.getrefcount(value) == 2:
                    stack.append(value)
                del value
        else:
            while container:
                value = container.pop()
                if type(value) in (dict, list) and value and sys.getrefcount(value) == 2:
                    stack.append(value)
                del value
        del container
