# A port of Kopf's examples/15-timers (nolar/kopf): 7 lines of code here, 8 in Kopf's.
# Each timer fires on the replica that owns the object, once the object has been unchanged for
# `idle` seconds; ticks sit on a grid every `interval` seconds from its creation (docs/timers.md).
import declop


@declop.timer("kopfexamples.kopf.dev", idle=5, interval=2)
def every_few_seconds_sync(obj, logger):
    logger.info(f"Ping from a sync timer: field={obj['spec']['field']!r}")


@declop.timer("kopfexamples.kopf.dev", idle=10, interval=4)
async def every_few_seconds_async(obj, logger):
    logger.info(f"Ping from an async timer: field={obj['spec']['field']!r}")
