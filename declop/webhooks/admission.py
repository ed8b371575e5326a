"""Admission: reading an ``admission.k8s.io/v1`` AdmissionReview and writing its answer.

Pure functions, no I/O: :func:`parse_admission` turns the request body into an
:class:`AdmissionRequest` or raises :class:`BadReview` (the server answers HTTP 400 with its
message); :func:`allow`, :func:`deny` build the response review.

Invariants:
- a review is accepted only as a JSON object of ``kind: AdmissionReview``, ``apiVersion:
  admission.k8s.io/v1`` with a ``request`` object holding a non-empty string ``uid``;
- ``obj`` is ``request.object`` (``None`` on DELETE), ``old_obj`` is ``request.oldObject``
  (``None`` on CREATE and CONNECT); ``dry_run`` is a bool;
- a :class:`BadReview` message names what is wrong, never a value from the body; a body that is
  valid JSON but nested too deep for Python is read as its skeleton
  (:func:`declop.webhooks.decode.loads`), so it is answered, not refused;
- a response always echoes the request's ``uid``; a patch is base64-encoded ``JSONPatch`` and
  present only when it has operations; warnings are strings (the apiserver drops the rest).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from declop.errors import DeclopError
from declop.webhooks.decode import TooMany, check_size, loads

__all__ = ["API_VERSION", "AdmissionRequest", "BadReview", "Oversized", "allow", "deny", "parse_admission", "parse_json"]

API_VERSION = "admission.k8s.io/v1"


class BadReview(DeclopError, ValueError):
    """The request body is not a review declop can answer; the message says why (HTTP 400)."""


class Oversized(BadReview):
    """The body holds too many objects and arrays to decode (:class:`~declop.webhooks.decode.TooMany`).

    ``uid`` is the review's ``request.uid`` when it could be read without decoding (the
    apiserver writes it first): the server then answers a denial (fail closed), not HTTP 400."""

    def __init__(self, message: str, uid: str | None) -> None:
        super().__init__(message)
        self.uid = uid


# the apiserver writes a review's fields in their Go order: kind, apiVersion, request.uid first
_UID = re.compile(rb'"request"\s*:\s*\{\s*"uid"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What a validator or mutator may be told about one admission request."""

    uid: str
    operation: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None
    user_info: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    #: ``{"group", "version", "kind"}`` of the object
    kind: dict[str, Any] = field(default_factory=dict)


def parse_json(body: bytes, kind: str, api_version: str) -> dict[str, Any]:
    """The review as a dict, checked to be ``kind``/``api_version``; raises :class:`BadReview`
    (:class:`Oversized` for a body with too many objects and arrays to decode)."""
    try:
        check_size(body)
    except TooMany as exc:
        head = body[:64 * 1024]
        found = _UID.search(head) if f'"{kind}"'.encode() in head else None
        raise Oversized(f"{exc}; send a {kind} of real objects", found.group(1).decode() if found else None) from None
    try:
        review = loads(body)
    except ValueError as exc:  # not JSON, unbalanced, a number too long for Python
        raise BadReview(f"{exc}; send a {kind}") from None
    if not isinstance(review, dict):
        raise BadReview(f"the request body is a JSON {type(review).__name__}, not a {kind} object")
    if review.get("kind") != kind:
        got = review.get("kind")
        shown = repr(got) if isinstance(got, str) and len(got) <= 40 else "missing"
        raise BadReview(f"unknown kind {shown}: this path answers {kind} only")
    if review.get("apiVersion") != api_version:
        raise BadReview(f"unsupported apiVersion for {kind}: declop answers {api_version} only (set admissionReviewVersions/conversionReviewVersions to [\"v1\"])")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview(f"the {kind} has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview(f"the {kind} request has no uid; the apiserver always sends one")
    return review


def parse_admission(body: bytes) -> AdmissionRequest:
    """Read an AdmissionReview request body; raises :class:`BadReview` when it is not one."""
    request = parse_json(body, "AdmissionReview", API_VERSION)["request"]
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise BadReview("the AdmissionReview request has no operation")
    obj, old = request.get("object"), request.get("oldObject")
    for what, value in (("object", obj), ("oldObject", old)):
        if value is not None and not isinstance(value, dict):
            raise BadReview(f"the AdmissionReview request's {what} is not a JSON object")
    user_info = request.get("userInfo")
    kind = request.get("kind")
    return AdmissionRequest(
        uid=request["uid"],
        operation=operation,
        obj=obj,
        old_obj=old,
        user_info=user_info if isinstance(user_info, dict) else {},
        dry_run=request.get("dryRun") is True,
        subresource=str(request.get("subResource") or ""),
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        kind=kind if isinstance(kind, dict) else {},
    )


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def allow(uid: str, *, patch: list[dict[str, Any]] | None = None, warnings: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """The review allowing request ``uid``, with a JSON Patch when ``patch`` has operations."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = [str(w) for w in warnings]
    return _review(response)


def deny(uid: str, message: str, *, code: int = 403, warnings: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """The review denying request ``uid``; kubectl shows ``message`` after the webhook's name."""
    reason = {
        400: "BadRequest", 403: "Forbidden", 409: "Conflict", 413: "RequestEntityTooLarge", 422: "Invalid", 500: "InternalError",
    }.get(code, "")
    status: dict[str, Any] = {"status": "Failure", "message": message, "code": code}
    if reason:
        status["reason"] = reason
    response: dict[str, Any] = {"uid": uid, "allowed": False, "status": status}
    if warnings:
        response["warnings"] = [str(w) for w in warnings]
    return _review(response)
