"""``conflict.py`` fixed: the update's error propagates, so the call is retried with backoff on
a fresh read of the object.

    declop sim examples/buggy/conflict_fixed.py --seeds 5     # 0 failed

A conflict or a throttle is transient: let ``declop.Conflict`` (or any ``ApiError``) propagate, or
raise ``declop.TemporaryError(delay=...)`` to choose the delay. Keep ``TerminalError`` for what
no retry can fix (an invalid spec).
"""

import hashlib
import json

import declop

ANNOTATION = "example.com/data-checksum"


@declop.reconciler("configmaps")
def checksum(request, client, obj, **_):
    if obj is None:
        return
    want = hashlib.sha256(json.dumps(obj.get("data") or {}, sort_keys=True).encode()).hexdigest()[:16]
    if (obj["metadata"].get("annotations") or {}).get(ANNOTATION) != want:
        client.patch("configmaps", request, {"metadata": {"annotations": {ANNOTATION: want}}})
