"""declop.leases.hashing: the FNV-1a hash, ranges, the split, and the shardSelector string."""

from __future__ import annotations

import pytest

from declop.leases import hashing as sharding
from declop.leases.hashing import (
    HASH_SPACE,
    ShardFilter,
    ShardRange,
    difference,
    fnv1a64,
    hash_of,
    merge,
    range_index,
    selector,
    split,
)

#: sharding.HashField of k8s.io/apimachinery v0.36.3, printed by a Go program calling it (the Go
#: tests check only length and determinism, so these vectors were produced from the Go code itself);
#: the first, "a" and "foobar" are also the published FNV-1a 64 test vectors
GO_VECTORS = {
    "": "cbf29ce484222325",
    "a": "af63dc4c8601ec8c",
    "abc": "e71fa2190541574b",
    "foobar": "85944171f73967e8",
    "test": "f9e6e6ef197c2b25",
    "different": "88f38c6c33321162",
    "test-uid-123": "d0ba679834556c0b",
    "test-uid-12345": "d4c53b72f9287c28",
    "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee": "93754b7248a00eb9",
    "default": "ebada5168620c5fe",
    "kube-system": "df65c7bc1d82b35e",
    "ünïcode": "b1b0d40350a25beb",
}


@pytest.mark.parametrize("value,expected", sorted(GO_VECTORS.items()))
def test_hash_equals_go_hashfield(value: str, expected: str) -> None:
    assert f"{fnv1a64(value):016x}" == expected
    assert fnv1a64(value.encode()) == int(expected, 16)


def test_hash_of_uses_the_key_and_hashes_a_missing_field_as_empty() -> None:
    obj = {"metadata": {"uid": "test-uid-123", "namespace": "default"}}
    assert hash_of(obj, "uid") == 0xD0BA679834556C0B
    assert hash_of(obj, "namespace") == 0xEBADA5168620C5FE
    assert hash_of({"metadata": {"uid": "x"}}, "namespace") == fnv1a64("")


def test_split_covers_the_space_in_order_without_gaps() -> None:
    for n in (1, 2, 3, 7, 12, 16):
        ranges = split(n)
        assert len(ranges) == n
        assert ranges[0].start == 0 and ranges[-1].end == HASH_SPACE
        assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
    assert split(4)[1] == ShardRange(0x4000000000000000, 0x8000000000000000)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 16, 1000])
def test_range_index_agrees_with_split_at_every_bound(n: int) -> None:
    import random

    ranges = split(n)
    rng = random.Random(n)
    probes = [0, HASH_SPACE - 1] + [rng.randrange(HASH_SPACE) for _ in range(200)]
    for r in ranges:
        probes += [r.start, r.end - 1]
    for h in probes:
        i = range_index(h, n)
        assert h in ranges[i], (h, i)
    with pytest.raises(ValueError, match="a hash is in"):
        range_index(HASH_SPACE, n)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_split_refuses_bad_counts(bad: object) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        split(bad)  # type: ignore[arg-type]


def test_range_bounds_and_membership() -> None:
    r = ShardRange(10, 20)
    assert 10 in r and 19 in r and 20 not in r and 9 not in r
    for start, end in ((5, 5), (6, 5), (-1, 3), (0, HASH_SPACE + 1)):
        with pytest.raises(ValueError, match="0 <= start < end <= 2\\*\\*64"):
            ShardRange(start, end)


def test_selector_matches_the_apiserver_format() -> None:
    """The Go doc's 2-shard and 4-shard examples, byte for byte."""
    assert selector("uid", [split(2)[0]]) == "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    assert selector("uid", [split(4)[3]]) == (
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
    )
    assert selector("namespace", [split(4)[0], split(4)[2]]) == (
        "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000')"
        " || shardRange(object.metadata.namespace, '0x8000000000000000', '0xc000000000000000')"
    )


def test_selector_merges_adjacent_ranges_and_refuses_nothing() -> None:
    parts = split(12)
    assert selector("uid", [parts[2], parts[0], parts[1]]) == selector("uid", [ShardRange(0, parts[2].end)])
    with pytest.raises(ValueError, match="empty shardSelector would select every object"):
        selector("uid", [])
    with pytest.raises(ValueError, match="must be one of uid, namespace"):
        selector("name", [parts[0]])  # type: ignore[arg-type]


def test_merge_keeps_the_same_hashes() -> None:
    assert merge([ShardRange(5, 9), ShardRange(0, 3), ShardRange(3, 4), ShardRange(8, 12)]) == (
        ShardRange(0, 4),
        ShardRange(5, 12),
    )


def test_difference_is_what_a_change_gains_or_releases() -> None:
    p = split(12)
    assert difference([p[0], p[1], p[2]], [p[1]]) == (p[0], p[2])
    assert difference([p[1]], [p[0], p[1], p[2]]) == ()
    assert difference([ShardRange(0, 100)], [ShardRange(10, 20), ShardRange(30, 40)]) == (
        ShardRange(0, 10),
        ShardRange(20, 30),
        ShardRange(40, 100),
    )
    assert difference([ShardRange(0, 10)], []) == (ShardRange(0, 10),)
    assert difference([ShardRange(5, 10)], [ShardRange(0, 7)]) == (ShardRange(7, 10),)


def test_filter_matches_like_the_selector() -> None:
    obj = {"metadata": {"uid": "test-uid-123"}}  # hash 0xd0ba679834556c0b: the last quarter
    quarters = split(4)
    assert ShardFilter("uid", (quarters[3],)).matches(obj)
    assert not ShardFilter("uid", quarters[:3]).matches(obj)
    assert ShardFilter("uid", quarters[::-1]) == ShardFilter("uid", (ShardRange(0, HASH_SPACE),))
    empty = ShardFilter("uid", ())
    assert empty.empty and not empty.matches(obj)
    with pytest.raises(ValueError, match="must be one of uid, namespace"):
        ShardFilter("owner", ())  # type: ignore[arg-type]


def test_hashes_spread_over_ranges() -> None:
    """Sanity of the split with real-looking uids: 12 ranges each get some of 3,000 objects."""
    import uuid

    counts = [0] * 12
    ranges = split(12)
    for i in range(3000):
        h = fnv1a64(str(uuid.UUID(int=i * 7919 + 1, version=4)))
        counts[next(j for j, r in enumerate(ranges) if h in r)] += 1
    assert min(counts) > 0 and sum(counts) == 3000


def test_all_is_sorted_and_complete() -> None:
    assert sharding.__all__ == sorted(sharding.__all__)
    assert all(hasattr(sharding, name) for name in sharding.__all__)
