"""Sharding: the hash space a sharded controller divides, and the apiserver's shard selector.

Kubernetes v1.36 (alpha, feature gate ``ShardedListAndWatch``, KEP-5866) filters LIST responses
and watch streams by ``ListOptions.shardSelector``: a 64-bit FNV-1a hash of one metadata field,
``object.metadata.uid`` or ``object.metadata.namespace``, must fall in one of the given ranges.
This module is that contract on the client side (``k8s.io/apimachinery/pkg/sharding`` and
``k8s.io/apiserver/pkg/sharding/parser.go`` at v0.36.3):

- :func:`fnv1a64` is Go's ``hash/fnv`` ``New64a`` over the field's UTF-8 bytes, as
  ``sharding.HashField`` computes it; :func:`hash_of` applies it to an object's shard key. An
  object without the field (a cluster-scoped object hashed by namespace) hashes the empty string,
  as the apiserver does.
- :class:`ShardRange` is ``[start, end)`` with ``0 <= start < end <= 2**64``; a hash ``h`` is in
  it iff ``start <= h < end``.
- :func:`split` divides ``[0, 2**64)`` into ``n`` fixed, contiguous, disjoint ranges in order;
  range ``i`` is ``[i * 2**64 // n, (i + 1) * 2**64 // n)`` (bounds rounded *down*);
  :func:`range_index` finds a hash's range. The same ``n`` gives the same ranges in every
  process and every release: replicas agree on them without talking. Anything that assigns a
  hash to a range (Leases, fences, selectors) must use these two functions, so that the range a
  replica owns is exactly what its shardSelector returns.
- :func:`selector` renders owned ranges as the ``shardSelector`` string the apiserver parses:
  ``shardRange(object.metadata.uid, '0x…', '0x…') || …``, bounds as lowercase ``0x`` plus exactly
  16 hex digits (the parser refuses anything shorter), except the end bound ``2**64`` which is
  ``'0x10000000000000000'``. Adjacent owned ranges are merged first, so the string names each
  maximal interval once; the set of hashes it selects is exactly the union of the ranges.
- :class:`ShardFilter` is one informer's filter: the key plus the owned ranges;
  :meth:`ShardFilter.matches` is what the apiserver's ``Selector.Matches`` answers for the same
  object. An empty set of ranges selects nothing (never render it: the apiserver reads an empty
  ``shardSelector`` as "no filter", i.e. everything).

The hash of an object never changes: ``metadata.uid`` and ``metadata.namespace`` are immutable.
So an object is in or out of a filter for its whole life; only a change of the owned ranges
moves it (see :meth:`declop.cache.informer.Informer.set_shard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal

__all__ = [
    "FIELD_PATHS",
    "HASH_SPACE",
    "SHARD_KEYS",
    "ShardFilter",
    "ShardKey",
    "ShardRange",
    "difference",
    "fnv1a64",
    "hash_of",
    "merge",
    "range_index",
    "selector",
    "split",
]

#: the size of the hash space: ranges are over ``[0, HASH_SPACE)``
HASH_SPACE = 1 << 64

#: what a sharded controller may hash
ShardKey = Literal["uid", "namespace"]
SHARD_KEYS: tuple[str, ...] = ("uid", "namespace")

#: the shard key as the apiserver's selector names it (CEL-style, rooted at ``object``)
FIELD_PATHS: dict[str, str] = {"uid": "object.metadata.uid", "namespace": "object.metadata.namespace"}

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = HASH_SPACE - 1


def fnv1a64(value: str | bytes) -> int:
    """64-bit FNV-1a of ``value`` (a str is hashed as its UTF-8 bytes), as Go's ``fnv.New64a``."""
    data = value.encode() if isinstance(value, str) else value
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def _field(obj: Any, key: str) -> str:
    meta = obj.get("metadata") or {}
    return meta.get(key) or ""


def hash_of(obj: Any, key: ShardKey) -> int:
    """The shard hash of ``obj`` (a dict or read-only mapping) by ``key``."""
    return fnv1a64(_field(obj, key))


def _hex(bound: int) -> str:
    return "0x10000000000000000" if bound == HASH_SPACE else f"0x{bound:016x}"


@dataclass(frozen=True, order=True)
class ShardRange:
    """``[start, end)`` of the hash space. Invariant: ``0 <= start < end <= 2**64``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (0 <= self.start < self.end <= HASH_SPACE):
            raise ValueError(f"a shard range needs 0 <= start < end <= 2**64, got [{self.start:#x}, {self.end:#x})")

    def __contains__(self, h: object) -> bool:
        return isinstance(h, int) and self.start <= h < self.end

    def __str__(self) -> str:
        return f"[{_hex(self.start)}, {_hex(self.end)})"


def split(n: int) -> tuple[ShardRange, ...]:
    """``[0, 2**64)`` as ``n`` fixed ranges, in order (see the module docstring); ``n >= 1``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the number of shard ranges must be an integer >= 1, got {n!r}")
    if n > HASH_SPACE:
        raise ValueError(f"at most 2**64 shard ranges, got {n}")
    return tuple(ShardRange(i * HASH_SPACE // n, (i + 1) * HASH_SPACE // n) for i in range(n))


def range_index(h: int, n: int) -> int:
    """The index of the range of :func:`split` (``n``) that holds hash ``h``, in O(1)."""
    if not 0 <= h < HASH_SPACE:
        raise ValueError(f"a hash is in [0, 2**64), got {h!r}")
    # the largest i with i * 2**64 // n <= h, i.e. i * 2**64 < (h + 1) * n
    return ((h + 1) * n + HASH_SPACE - 1) // HASH_SPACE - 1


def merge(ranges: Iterable[ShardRange]) -> tuple[ShardRange, ...]:
    """The same set of hashes as sorted, disjoint, non-adjacent ranges."""
    out: list[ShardRange] = []
    for r in sorted(ranges):
        if out and r.start <= out[-1].end:
            if r.end > out[-1].end:
                out[-1] = ShardRange(out[-1].start, r.end)
        else:
            out.append(r)
    return tuple(out)


def difference(a: Iterable[ShardRange], b: Iterable[ShardRange]) -> tuple[ShardRange, ...]:
    """The hashes in ``a`` and not in ``b``, as merged ranges (what a change of ownership gains
    when ``a`` is the new set and ``b`` the old one, or releases the other way round)."""
    out: list[ShardRange] = []
    cuts = merge(b)
    for r in merge(a):
        start = r.start
        for c in cuts:
            if c.end <= start or c.start >= r.end:
                continue
            if c.start > start:
                out.append(ShardRange(start, c.start))
            start = max(start, c.end)
            if start >= r.end:
                break
        if start < r.end:
            out.append(ShardRange(start, r.end))
    return tuple(out)


def selector(key: ShardKey, ranges: Iterable[ShardRange]) -> str:
    """The ``shardSelector`` for ``ranges`` of ``key``; refuses an empty set (see module doc)."""
    if key not in FIELD_PATHS:
        raise ValueError(f"the shard key must be one of {', '.join(SHARD_KEYS)}, not {key!r}")
    merged = merge(ranges)
    if not merged:
        raise ValueError("no shard ranges: an empty shardSelector would select every object")
    path = FIELD_PATHS[key]
    return " || ".join(f"shardRange({path}, '{_hex(r.start)}', '{_hex(r.end)}')" for r in merged)


@dataclass(frozen=True)
class ShardFilter:
    """The objects one informer keeps: those whose ``key`` hash is in one of ``ranges``.

    ``ranges`` is stored merged (:func:`merge`), so two filters selecting the same hashes are
    equal. An empty ``ranges`` selects nothing."""

    key: ShardKey
    ranges: tuple[ShardRange, ...]

    def __post_init__(self) -> None:
        if self.key not in FIELD_PATHS:
            raise ValueError(f"the shard key must be one of {', '.join(SHARD_KEYS)}, not {self.key!r}")
        object.__setattr__(self, "ranges", merge(self.ranges))

    @property
    def empty(self) -> bool:
        return not self.ranges

    def contains(self, h: int) -> bool:
        return any(r.start <= h < r.end for r in self.ranges)

    def matches(self, obj: Any) -> bool:
        """Whether the apiserver's selector for this filter would return ``obj``."""
        return self.contains(hash_of(obj, self.key))

    @property
    def selector(self) -> str:
        """The ``shardSelector`` query value; raises ValueError when :attr:`empty`."""
        return selector(self.key, self.ranges)

    def with_ranges(self, ranges: Iterable[ShardRange]) -> ShardFilter:
        return ShardFilter(self.key, tuple(ranges))

    def __str__(self) -> str:
        return f"shard by {self.key} in {' '.join(map(str, self.ranges)) or 'nothing'}"
