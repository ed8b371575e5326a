"""A handler that turns a conflict into a permanent failure: its update, answered 409 (or 429,
or 5xx), ends the call with ``TerminalError`` — never retried, so the object keeps its old state.

    declop sim examples/buggy/conflict.py --seeds 5     # fails: conflicts, naming the patch line

A 409 says someone else wrote first; a 429 or a 503 says "not now". Both are transient.
"""

import hashlib
import json

import declop
from declop.errors import ApiError  # declop.Conflict (409) and every other refusal

ANNOTATION = "example.com/data-checksum"


@declop.reconciler("configmaps")
def checksum(request, client, obj, **_):
    if obj is None:
        return
    want = hashlib.sha256(json.dumps(obj.get("data") or {}, sort_keys=True).encode()).hexdigest()[:16]
    if (obj["metadata"].get("annotations") or {}).get(ANNOTATION) != want:
        try:
            client.patch("configmaps", request, {"metadata": {"annotations": {ANNOTATION: want}}})
        except ApiError as exc:
            raise declop.TerminalError(f"cannot annotate {request}: {exc}") from exc
