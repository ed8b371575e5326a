# A port of Kopf's examples/14-daemons (nolar/kopf): 20 lines of code here, 24 in Kopf's.
# One daemon per object and function, on the replica that owns the object; stopped (and awaited)
# before the object's finalizer goes (docs/daemons.md). Kopf's annotations= filter has no
# equivalent yet; its TemporaryError(delay=1) is backoff=1 here.
import asyncio
import time

import declop


# A thread cannot be interrupted: it must watch `stop`. It fails 3 times, then runs 30 s (unless stopped).
@declop.daemon("kopfexamples.kopf.dev", backoff=1)
def background_sync(request, current, stop, logger, retry, client):
    if retry < 3:
        client.patch_status("kopfexamples.kopf.dev", request, {"status": {"message": f"Failed {retry + 1} times."}})
        raise RuntimeError("Simulated failure.")
    started = time.time()
    while not stop.is_set() and time.time() - started <= 30:
        logger.info(f"=> Ping from a sync daemon: field={current()['spec']['field']!r}, retry={retry}")
        stop.wait(5.0)
    client.patch_status("kopfexamples.kopf.dev", request, {"status": {"message": "Accompanying is finished."}})


# An async daemon is cancelled once stop_timeout has passed after `stop` was set. It fails 3 times.
@declop.daemon("kopfexamples.kopf.dev", backoff=1, stop_timeout=0.5)
async def background_async(current, logger, retry):
    if retry < 3:
        raise RuntimeError("Simulated failure.")
    while True:
        logger.info(f"=> Ping from an async daemon: field={current()['spec']['field']!r}")
        await asyncio.sleep(5.0)
