"""API discovery: which resources the apiserver serves, and what a user-given name means.

Owns :class:`ResourceInfo` (one resource in one group version, plus the URL paths for it),
the parsers for the discovery documents, :func:`resolve` (a name as ``kubectl`` accepts it →
one ``ResourceInfo``) and :class:`Discovery`, which fetches and caches the documents. It does
not own HTTP: fetching goes through an injected ``get_json(path, accept)`` coroutine that
raises :class:`~declop.errors.NotFound` / :class:`~declop.errors.ApiError` like the transport.

Invariants:

* Parsing and resolution are pure functions of the documents; only :class:`Discovery` does I/O.
* A resource list is in server preference order: core first, then groups as ``/apis`` lists
  them; within a group, every resource of the preferred version (listed first by the server)
  comes before those of older versions. "The first entry of a group" is its preferred version.
* Subresources (``pods/status``) are never resources; their names land in the parent's
  ``subresources``.
* :func:`resolve` returns only resources that can be listed and watched (when verbs are known),
  takes the preferred version unless the name gave one, prefers core on a bare name, and
  otherwise raises :class:`~declop.errors.ConfigError` with a one-line message saying what to do.
* Aggregated discovery (``apidiscovery.k8s.io/v2``, GA in 1.30) is asked for first; older
  servers answer the same request with legacy documents and are walked per group version,
  skipping group versions that fail (an unavailable aggregated API answers 503).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

from declop.errors import ApiError, ConfigError
from declop.hints import close_matches, suggestion

__all__ = [
    "AGGREGATED_ACCEPT",
    "Discovery",
    "GetJson",
    "ResourceInfo",
    "parse_aggregated",
    "parse_legacy_group_versions",
    "parse_resource_list",
    "resolve",
    "suggest",
]

log = logging.getLogger(__name__)

AGGREGATED_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json"
)
"""Accept header for ``/api`` and ``/apis``: aggregated v2, then v2beta1, then legacy JSON."""

GetJson = Callable[[str, str], Awaitable[Any]]
"""``await get_json(path, accept)`` → decoded JSON body; raises ``NotFound``/``ApiError``."""

_JSON = "application/json"
_AGGREGATED_KIND = "APIGroupDiscoveryList"
_VERSION = re.compile(r"v\d+(?:alpha\d+|beta\d+)?")
_WATCHABLE = frozenset({"list", "watch"})


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """One resource as served in one group version. ``group`` is ``""`` for the core group."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``"v1"`` for core, ``"apps/v1"`` otherwise — the ``apiVersion`` of its objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``"pods"`` for core, ``"deployments.apps"`` otherwise (as kubectl and RBAC name it)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path of the collection, of one object, or of one object's subresource.

        Core resources live under ``/api/{version}``, the rest under ``/apis/{group}/{version}``;
        ``/namespaces/{namespace}`` follows for a namespaced resource when a namespace is given
        (none means all namespaces). A namespace is ignored for a cluster-scoped resource.

        Raises:
            ValueError: a name without a namespace on a namespaced resource, a subresource
                without a name, or a subresource this resource does not serve (when known).
        """
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [root]
        if self.namespaced and namespace:
            parts += ["namespaces", namespace]
        elif self.namespaced and name:
            raise ValueError(f"{self} is namespaced: give a namespace along with name {name!r}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            if not name:
                raise ValueError(f"subresource {subresource!r} of {self} needs an object name")
            if self.subresources and subresource not in self.subresources:
                served = ", ".join(self.subresources)
                raise ValueError(f"{self} has no subresource {subresource!r} (it has: {served})")
            parts.append(subresource)
        return "/".join(parts)

    def __str__(self) -> str:
        return self.group_resource


# --------------------------------------------------------------------------- parsing


def parse_aggregated(doc: Mapping[str, Any]) -> list[ResourceInfo]:
    """Every resource of every version in one ``APIGroupDiscoveryList`` (``/api`` or ``/apis``).

    Groups keep the document's order; within a group, versions keep the server's preference
    order (``versions[0]`` is preferred). The group comes from ``metadata.name`` (empty or
    missing for core) and the version from the version entry — never from ``responseKind``,
    whose group and version are often blank.

    Raises:
        ValueError: ``doc`` is not an ``APIGroupDiscoveryList``.
    """
    if doc.get("kind") != _AGGREGATED_KIND:
        raise ValueError(f"expected an {_AGGREGATED_KIND}, got kind {doc.get('kind')!r}")
    out: list[ResourceInfo] = []
    for item in doc.get("items") or ():
        group = str((item.get("metadata") or {}).get("name") or "")
        for entry in item.get("versions") or ():
            version = str(entry.get("version") or "")
            if not version:
                continue
            for res in entry.get("resources") or ():
                plural = str(res.get("resource") or "")
                if not plural or "/" in plural:
                    continue
                out.append(
                    ResourceInfo(
                        group=group,
                        version=version,
                        plural=plural,
                        kind=str((res.get("responseKind") or {}).get("kind") or ""),
                        namespaced=res.get("scope") == "Namespaced",
                        singular=str(res.get("singularResource") or ""),
                        short_names=_strings(res.get("shortNames")),
                        verbs=_strings(res.get("verbs")),
                        subresources=tuple(
                            str(sub["subresource"])
                            for sub in res.get("subresources") or ()
                            if sub.get("subresource")
                        ),
                    )
                )
    return out


def parse_legacy_group_versions(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(group, version)`` pairs a legacy ``/api`` or ``/apis`` document announces.

    ``/api`` answers ``APIVersions`` (``versions: ["v1"]``, group ``""``); ``/apis`` answers
    ``APIGroupList``. Each group's ``preferredVersion`` comes first, then its other versions
    in listed order; groups keep the document's order.

    Raises:
        ValueError: ``doc`` is neither an ``APIVersions`` nor an ``APIGroupList``.
    """
    kind = doc.get("kind")
    if kind == "APIVersions":
        return [("", str(v)) for v in doc.get("versions") or () if v]
    if kind != "APIGroupList":
        raise ValueError(f"expected APIVersions or APIGroupList, got kind {kind!r}")
    out: list[tuple[str, str]] = []
    for group in doc.get("groups") or ():
        name = str(group.get("name") or "")
        preferred = str((group.get("preferredVersion") or {}).get("version") or "")
        listed = [str(v.get("version") or "") for v in group.get("versions") or ()]
        for version in _unique([preferred, *listed]):
            if version:
                out.append((name, version))
    return out


def parse_resource_list(doc: Mapping[str, Any]) -> list[ResourceInfo]:
    """The resources of one legacy ``APIResourceList`` (``/api/v1`` or ``/apis/{g}/{v}``).

    The group version comes from ``groupVersion``. Entries named ``parent/sub`` are
    subresources: they are not returned, their ``sub`` is added to the parent's
    ``subresources`` (in listed order).
    """
    group, _, version = str(doc.get("groupVersion") or "").rpartition("/")
    subs: dict[str, list[str]] = {}
    for res in doc.get("resources") or ():
        parent, slash, sub = str(res.get("name") or "").partition("/")
        if slash and sub:
            subs.setdefault(parent, []).append(sub)
    out: list[ResourceInfo] = []
    for res in doc.get("resources") or ():
        plural = str(res.get("name") or "")
        if not plural or "/" in plural:
            continue
        out.append(
            ResourceInfo(
                group=group,
                version=version,
                plural=plural,
                kind=str(res.get("kind") or ""),
                namespaced=bool(res.get("namespaced")),
                singular=str(res.get("singularName") or ""),
                short_names=_strings(res.get("shortNames")),
                verbs=_strings(res.get("verbs")),
                subresources=tuple(subs.get(plural, ())),
            )
        )
    return out


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or () if v)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _legacy_path(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


# --------------------------------------------------------------------------- resolution


def resolve(
    name: str, resources: Sequence[ResourceInfo], *, watchable: bool = True, unknown: str = "not served by the apiserver"
) -> ResourceInfo:
    """The resource ``name`` means, as kubectl reads it, among ``resources`` (in server order).

    ``name`` is case-insensitive and is one of ``pods`` / ``pod`` / ``po`` / ``Pod`` (plural,
    singular, short name or kind), ``plural.group`` (``deployments.apps``) or
    ``plural.version.group`` (``widgets.v1.example.com``; ``pods.v1`` for core). When the part
    after the first dot starts with a version (``v1``, ``v2beta1``) the name is read as
    ``plural.version.group`` first and as ``plural.group`` only if that matches nothing.

    Choice among matches: only resources that can be listed and watched (any verbs with
    ``watchable=False``: RBAC names ``tokenreviews`` too); per group the preferred version unless
    a version was named; across groups core wins, then the one group that serves it in its
    preferred version; anything else is ambiguous. ``unknown`` says why a name that matches
    nothing is unknown (what ``resources`` are).

    Raises:
        ConfigError: the name is unknown, matches only resources that cannot be listed and
            watched, or is ambiguous across groups (the message lists ``plural.group`` names).
    """
    matches = _matches(name, resources)
    if not matches:
        hint = suggest(name, resources)
        lead = f"{hint} (or check" if hint else "check"
        tail = ")" if hint else ""
        raise ConfigError(
            f"unknown resource {name!r}: {unknown}; "
            f"{lead} the name with 'kubectl api-resources'{tail}"
        )
    usable = [r for r in matches if not watchable or not r.verbs or _WATCHABLE <= set(r.verbs)]
    if not usable:
        found = ", ".join(_unique(f"{r} ({'/'.join(r.verbs)})" for r in matches))
        raise ConfigError(
            f"resource {name!r} cannot be listed and watched: {found}; "
            "declop needs both verbs, pick another resource"
        )
    # One candidate per group resource: the first in server order is the preferred version.
    first: dict[str, ResourceInfo] = {}
    for r in usable:
        first.setdefault(r.group_resource, r)
    candidates = list(first.values())
    if len(candidates) > 1 and any(r.group == "" for r in candidates):
        candidates = [r for r in candidates if r.group == ""]
    if len(candidates) > 1:
        preferred = _preferred_versions(resources)
        in_preferred = [r for r in candidates if preferred.get(r.group) == r.version]
        if len(in_preferred) == 1:
            candidates = in_preferred
    if len(candidates) > 1:
        names = sorted(r.group_resource for r in candidates)
        raise ConfigError(
            f"ambiguous resource {name!r}: served as {', '.join(names)}; "
            f"qualify the name with its group, e.g. {names[0]!r}"
        )
    return candidates[0]


def suggest(name: str, resources: Sequence[ResourceInfo]) -> str | None:
    """``"did you mean 'deployments.apps'?"`` for a name that matches nothing, or ``None``.

    Candidates are the listable and watchable resources, each shown as the ``plural.group``
    that resolves to it (``plural`` for core). A dotted name (``widgts.example.com``) is compared
    with ``plural.group`` and ``plural.version.group``, a bare one (``deploymnets``) with each
    plural, singular, kind and short name.
    """
    shown: dict[str, str] = {}
    dotted = "." in name.strip()
    for r in resources:
        if r.verbs and not _WATCHABLE <= set(r.verbs):
            continue
        if dotted:
            spellings = [r.group_resource, f"{r.plural}.{r.version}.{r.group}" if r.group else f"{r.plural}.{r.version}"]
        else:
            spellings = sorted(_names(r))
        for spelling in spellings:
            shown.setdefault(spelling.lower(), r.group_resource)
    found = close_matches(name.strip(), shown, n=6)
    return suggestion(_unique(shown[f] for f in found)[:3])


def _matches(name: str, resources: Sequence[ResourceInfo]) -> list[ResourceInfo]:
    """Every resource ``name`` matches (whatever its verbs) under the first reading that matches."""
    for word, group, version in _readings(name.strip().lower()):
        found = [
            r
            for r in resources
            if (group is None or r.group == group)
            and (version is None or r.version == version)
            and word in _names(r)
        ]
        if found:
            return found
    return []


def _readings(name: str) -> list[tuple[str, str | None, str | None]]:
    """``(resource word, group or None, version or None)`` readings of a name, best first."""
    word, dot, rest = name.partition(".")
    if not word:
        return []
    if not dot:
        return [(word, None, None)]
    readings: list[tuple[str, str | None, str | None]] = []
    version, _, group = rest.partition(".")
    if _VERSION.fullmatch(version):
        readings.append((word, group, version))
    readings.append((word, rest, None))
    return readings


def _names(r: ResourceInfo) -> set[str]:
    return {n.lower() for n in (r.plural, r.singular, r.kind, *r.short_names) if n}


def _preferred_versions(resources: Sequence[ResourceInfo]) -> dict[str, str]:
    preferred: dict[str, str] = {}
    for r in resources:
        preferred.setdefault(r.group, r.version)
    return preferred


# --------------------------------------------------------------------------- fetching


class Discovery:
    """Fetches discovery documents through ``get_json`` and resolves names against them.

    Nothing is fetched until :meth:`refresh` or :meth:`resolve`. Concurrent refreshes are
    allowed; the result of the most recently *started* one that finished wins, so a slow
    older refresh never overwrites newer data.
    """

    def __init__(self, get_json: GetJson) -> None:
        self._get_json = get_json
        self._resources: list[ResourceInfo] | None = None
        self._started = 0
        self._stored = 0

    async def refresh(self) -> None:
        """Re-read everything the apiserver serves.

        ``GET /api`` and ``GET /apis`` with :data:`AGGREGATED_ACCEPT`; a root that answers
        with a legacy document instead is walked one group version at a time, and a group
        version that fails with an :class:`~declop.errors.ApiError` is logged and skipped.
        Errors on ``/api`` or ``/apis`` themselves propagate and keep the previous data.
        """
        self._started += 1
        generation = self._started
        core, groups = await asyncio.gather(
            self._get_json("/api", AGGREGATED_ACCEPT),
            self._get_json("/apis", AGGREGATED_ACCEPT),
        )
        core_resources, group_resources = await asyncio.gather(
            self._load_root(core), self._load_root(groups)
        )
        if generation > self._stored:
            self._stored = generation
            self._resources = core_resources + group_resources

    async def resolve(self, name: str) -> ResourceInfo:
        """:func:`resolve` against the served resources, fetching them if needed.

        The first call refreshes. Later, a name that matches nothing triggers one refresh
        before giving up, since a CRD may have been installed since the last one.

        Raises:
            ConfigError: as :func:`resolve`, after the refresh.
        """
        if self._resources is None or not _matches(name, self._resources):
            await self.refresh()
        return self.resolve_cached(name)

    def resolve_cached(self, name: str) -> ResourceInfo:
        """:func:`resolve` against the resources already fetched; no I/O.

        Raises:
            RuntimeError: nothing was fetched yet (await :meth:`refresh` first).
            ConfigError: as :func:`resolve`.
        """
        if self._resources is None:
            raise RuntimeError("discovery has not been loaded; await Discovery.refresh() first")
        return resolve(name, self._resources)

    def resources(self) -> list[ResourceInfo]:
        """Every resource fetched so far, in server order (empty before the first refresh)."""
        return list(self._resources or ())

    async def _load_root(self, doc: Any) -> list[ResourceInfo]:
        if not isinstance(doc, Mapping):
            raise ValueError(f"discovery answered {type(doc).__name__}, expected a JSON object")
        if doc.get("kind") == _AGGREGATED_KIND:
            return parse_aggregated(doc)
        lists = await asyncio.gather(
            *(self._fetch_legacy(g, v) for g, v in parse_legacy_group_versions(doc))
        )
        return [r for resources in lists for r in resources]

    async def _fetch_legacy(self, group: str, version: str) -> list[ResourceInfo]:
        path = _legacy_path(group, version)
        try:
            doc = await self._get_json(path, _JSON)
        except ApiError as exc:
            log.warning("discovery: skipping %s: %s", path, exc)
            return []
        return parse_resource_list(doc)
