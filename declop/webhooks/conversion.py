"""Conversion: reading an ``apiextensions.k8s.io/v1`` ConversionReview and writing its answer.

The apiserver sends a batch of objects and one ``desiredAPIVersion``; the answer holds every
object converted, in order, or a single failure (Kubernetes has no per-object result: one
object that cannot be converted fails the whole request, with a message naming it).

Invariants:
- :func:`parse_conversion` accepts only ``kind: ConversionReview``, ``apiVersion:
  apiextensions.k8s.io/v1``, a string ``request.uid``, a string ``desiredAPIVersion`` and a list
  of objects; otherwise :class:`~declop.webhooks.admission.BadReview`;
- :func:`finish` sets ``apiVersion`` to the desired one and keeps ``kind`` and ``metadata``
  exactly as sent, except ``metadata.labels`` and ``metadata.annotations``, which the converter
  may change (the apiserver rejects any other metadata change); a result without them keeps
  the original ones (``{}`` removes them);
- a failure message names the object (namespace/name) and the error type — never its contents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from declop.webhooks.admission import BadReview, parse_json

__all__ = ["API_VERSION", "ConversionRequest", "converted", "describe", "failed", "finish", "parse_conversion"]

API_VERSION = "apiextensions.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class ConversionRequest:
    uid: str
    desired_api_version: str
    objects: list[dict[str, Any]]


def parse_conversion(body: bytes) -> ConversionRequest:
    """Read a ConversionReview request body; raises :class:`BadReview` when it is not one."""
    request = parse_json(body, "ConversionReview", API_VERSION)["request"]
    desired = request.get("desiredAPIVersion")
    if not isinstance(desired, str) or "/" not in desired:
        raise BadReview("the ConversionReview request has no desiredAPIVersion (group/version)")
    objects = request.get("objects")
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise BadReview("the ConversionReview request's objects is not a list of objects")
    return ConversionRequest(request["uid"], desired, objects)


def finish(original: dict[str, Any], result: dict[str, Any], desired_api_version: str) -> dict[str, Any]:
    """``result`` made valid as a conversion of ``original``: apiVersion, kind and metadata fixed."""
    out = dict(result)
    out["apiVersion"] = desired_api_version
    out["kind"] = original.get("kind")
    metadata = dict(original.get("metadata") or {})
    given = result.get("metadata")
    changed: dict[str, Any] = given if isinstance(given, dict) else {}
    for key in ("labels", "annotations"):
        if key not in changed:
            continue  # not given: kept as sent
        if changed[key]:
            metadata[key] = changed[key]
        else:
            metadata.pop(key, None)
    out["metadata"] = metadata
    return out


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ConversionReview", "response": response}


def converted(uid: str, objects: list[dict[str, Any]]) -> dict[str, Any]:
    return _review({"uid": uid, "result": {"status": "Success"}, "convertedObjects": objects})


def failed(uid: str, message: str) -> dict[str, Any]:
    return _review({"uid": uid, "result": {"status": "Failure", "message": message}, "convertedObjects": []})


def describe(obj: dict[str, Any]) -> str:
    """``namespace/name`` (or ``name``) of an object, for messages."""
    given = obj.get("metadata")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    name, ns = meta.get("name") or "<unnamed>", meta.get("namespace")
    return f"{ns}/{name}" if ns else str(name)
