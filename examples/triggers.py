"""Why did this reconcile run? A ConfigMap controller that logs its trigger, with tuning options.

    declop run --log-format json examples/triggers.py
    kubectl create configmap demo --from-literal=k=v    # {"msg": "Reconciled", "trigger": "created rv=…", "why": ["created"], …}
    kubectl label configmap demo tier=gold              # … "trigger": "updated rv=…" …

``trigger`` is for logs and debugging only: the handler does the same thing whatever it says
(level-triggered). The options: real changes go ahead of a restart's backlog (the default
priority queue, here with faster aging), retries back off from 50 ms, and a call may take 10 s.
"""

import declop


@declop.reconciler(
    "configmaps",
    priority=declop.queue.priority.Priority(aging=20.0),
    rate_limit=declop.queue.ratelimit.RateLimit(base=0.05, cap=300),
    timeout=10,
)
def triggers(request, client, logger, trigger, **_):
    try:
        client.get(request)
    except declop.NotFound:
        logger.info("Gone", why=list(trigger.names))
        return None
    logger.info("Reconciled", why=list(trigger.names), events=trigger.events)
    return None
