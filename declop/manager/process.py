"""Manager: owns the transport, discovery, the shared informers and every controller of one process.

Start order: connect and discover → freeze the registry and resolve every name, check field
selectors and permissions (:mod:`declop.manager.preflight`) → one shared informer per (resource,
namespace, selectors, metadata only) and one controller per registration
(:mod:`declop.manager.wiring`) → probes → webhook server, then its configurations (nothing is
sent to a webhook before it answers) → startup hooks → informers, and the runnables
(:mod:`declop.manager.runnables`): each controller waits for its caches (and, with leader
election, for the Lease) before its workers start; background tasks start once every cache
synced (leader-only ones once the Lease is ours too). The stop order is
:mod:`declop.manager.shutdown`'s; what a lost Lease does, :mod:`declop.manager.leadership`'s.

Invariants:
- everything runs on the one event loop that called :meth:`Manager.run`; plain handlers run in
  one bounded thread pool owned here;
- an informer is shared by every controller that needs the same (resource, namespace, selector);
- user errors found at start (unknown resource, unreachable apiserver, nothing registered) raise
  :class:`~declop.errors.ConfigError` before any controller starts;
- with leader election every controller gets the elector's :meth:`~declop.leases.leader.LeaderElector.valid`
  as its fence: no reconcile starts unless the Lease is known valid on the monotonic clock;
- no Lease is released while a call under it still runs (:meth:`Manager.running`, I6);
- after a loss no step waits past :data:`~declop.manager.loss.LOST_CLEANUP_SECONDS` from the loss;
- sharding (``shards`` > 0) never goes with leader election; every controller then gets a
  :class:`~declop.leases.shards.ShardSet` and reconciles only keys of the ranges this replica
  holds and knows valid.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sys
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from declop import collector
from declop.cache.informer import Informer, InformerPool, all_synced
from declop.cache.store import guarded
from declop.clock import MONOTONIC, Clock
from declop.errors import ConfigError
from declop.kube.discovery import Discovery
from declop.kube.kubeconfig import pod_namespace
from declop.kube.rbac import Grant, Resolve
from declop.kube.transport import Transport
from declop.leases.leader import LeaderElector
from declop.leases.shards import ShardLeases, ShardSet
from declop.lifecycle import Lifecycle
from declop.manager import preflight
from declop.manager.leadership import BACKGROUND, LEADER_ONLY_BACKGROUND, BackgroundLease, LeaderLease, RangeLeases, Resharding
from declop.manager.loss import Loss
from declop.manager.options import Options
from declop.manager.runnables import RunGroup, Task
from declop.manager.shutdown import shutdown
from declop.manager.wiring import build_controller
from declop.reconcile.client import ClientContext
from declop.reconcile.controller import Controller
from declop.reconcile.events import EventRecorder
from declop.registry import Registry, default_registry

if TYPE_CHECKING:
    # imported where used: a run without probes, metrics or webhooks (``declop run`` by default,
    # every ``declop dev`` reload) does not pay for aiohttp.web and the servers
    from declop.serving.metrics import LoopLag, Metrics
    from declop.serving.probes import Check, ProbeServer
    from declop.webhooks.certs import WebhookCert
    from declop.webhooks.endpoint import WebhookEndpoint
    from declop.webhooks.server import WebhookServer

__all__ = ["Manager"]

log = logging.getLogger("declop.manager")


class Manager:
    """Runs every registration of a registry against one apiserver."""

    def __init__(
        self,
        configuration: Any,
        registry: Registry | None = None,
        options: Options | None = None,
        *,
        metrics: Metrics | None = None,
        transport: Any = None,
        discovery: Any = None,
        executor: concurrent.futures.Executor | None = None,
        clock: Clock | None = None,
        wall_clock: Clock | None = None,
    ) -> None:
        """``transport``, ``discovery``, ``executor`` (plain handlers) and the Lease clocks are
        built from ``configuration`` unless given: the simulator (:mod:`declop.testing.simulation.world`)
        gives its own, so that several managers run in one process on virtual time."""
        self.configuration = configuration
        self._given = (transport, discovery, executor)
        #: the Lease clocks (``clock``, ``wall_clock``) when given: passed to the electors
        self.clocks: dict[str, Any] = {k: v for k, v in (("clock", clock), ("wall_clock", wall_clock)) if v is not None}
        self.registry = registry if registry is not None else default_registry
        self.options = options or Options()
        #: None when nobody can scrape them (no ``metrics_port``, none given): nothing is recorded
        #: on the hot path and prometheus-client is never imported
        self.metrics: Metrics | None = metrics
        if metrics is None and self.options.metrics_port:
            from declop.serving.metrics import Metrics

            self.metrics = Metrics()
        #: samples the loop's lag into ``declop_event_loop_lag_seconds`` while probes are served
        self.loop_lag: LoopLag | None = None
        if self.metrics is not None:
            from declop.serving.metrics import LoopLag

            self.loop_lag = LoopLag(self.metrics.loop_lag)
        self.transport: Transport | None = None
        self.discovery: Discovery | None = None
        self.informers: InformerPool | None = None
        self.controllers: list[Controller] = []
        self.executor: concurrent.futures.Executor | None = None
        self.lifecycle: Lifecycle | None = None
        self.probes: ProbeServer | None = None
        #: the webhook certificate, server and configurations (None: no webhook is registered)
        self.webhook_endpoint: WebhookEndpoint | None = None
        self.elector: LeaderElector | None = None
        self.shard_leases: ShardLeases | None = None
        #: sharded mode: the Lease whose holder runs the leader-only background tasks
        self.background_elector: LeaderElector | None = None
        #: sharded informer -> the range sets whose held ranges it must cache (their union)
        self.sharded: dict[Informer, list[ShardSet]] = {}
        self.group = RunGroup()
        self.loss = Loss()
        self.resharding = Resharding(self)
        self.started = asyncio.Event()
        self.exit_code = 0
        self.stopping = False
        #: shutdown hooks and background tasks a stop gave up on (they still run)
        self.left_running = 0
        self._stop: asyncio.Event | None = None
        #: the startup hooks all succeeded (the stop runs the shutdown hooks only then)
        self.started_up = False
        #: reviews the optional grants (warnings only), started with the informers
        self._review_optional: Callable[[], Coroutine[Any, Any, None]] | None = None

    @property
    def on_lost(self) -> Callable[[], None] | None:
        """Called (synchronously, once) the moment a Lease is lost: ``declop run`` arms its
        :class:`~declop.leases.watchdog.Watchdog` here, so the process is gone in time."""
        return self.loss.on_lost

    @on_lost.setter
    def on_lost(self, callback: Callable[[], None] | None) -> None:
        self.loss.on_lost = callback

    @property
    def leadership(self) -> asyncio.Event | None:
        """Set once this replica leads (None: no leader election); leader-only runnables wait for it."""
        return self.group.leadership

    @leadership.setter
    def leadership(self, event: asyncio.Event | None) -> None:
        self.group.leadership = event

    @property
    def webhooks(self) -> WebhookServer | None:
        return self.webhook_endpoint.server if self.webhook_endpoint is not None else None

    @property
    def webhook_cert(self) -> WebhookCert | None:
        return self.webhook_endpoint.cert if self.webhook_endpoint is not None else None

    @property
    def bind_address(self) -> str:
        """Where this process's servers listen (:attr:`Options.bind_address`, default 0.0.0.0)."""
        return self.options.bind_address or "0.0.0.0"

    # -- start ---------------------------------------------------------------------------------
    async def setup(self) -> None:
        """Connect, discover and build controllers (no informer runs yet)."""
        self.registry.freeze()
        registrations = self.registry.registrations
        if not registrations and not self.registry.webhooks:
            raise ConfigError(
                "no reconciler is registered; decorate a function with @declop.reconciler(\"pods\") "
                "in the files or modules you pass to 'declop run'"
            )
        o = self.options
        given_transport, given_discovery, given_executor = self._given
        if given_transport is None and self.configuration is None:
            # no configuration given: the @declop.on_login functions give it (one given wins,
            # e.g. declop dev's own control plane)
            if not any(h.kind == "login" for h in self.registry.hooks):
                raise ConfigError("no apiserver to talk to: pass a configuration (a kubeconfig's) or register an @declop.on_login function")
            self.configuration = await self._login()
        self.transport = transport = given_transport or Transport(self.configuration, user_agent=o.user_agent, qps=o.qps, burst=o.burst)
        if self.metrics is not None:
            transport.observer = self.metrics.request
        self.discovery = discovery = given_discovery or await preflight.discover(transport)
        self.informers = pool = InformerPool(transport, namespaces=o.namespaces, list_mode=o.list_mode)  # type: ignore[arg-type]
        if self.metrics is not None:
            self.metrics.watch_informers(lambda: self.informers or ())
        sync_workers = sum(r.max_concurrent for r in registrations if not r.is_async)
        self.executor = given_executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=o.handler_threads or max(sync_workers, 1) + 2,
            thread_name_prefix="declop-handler",
        )
        ctx = ClientContext(
            transport, discovery, pool, asyncio.get_running_loop(), field_manager=o.field_manager, recorder=EventRecorder(transport)
        )
        self.context = ctx
        await preflight.check_names(discovery, self.registry)
        for ix in self.registry.indexes:
            pool.add_indexer(discovery.resolve_cached(ix.resource), ix.name, ix.fn)
        for resource_name, fn in self.registry.transforms.items():
            info = discovery.resolve_cached(resource_name)
            pool.transforms[info.group_resource] = guarded(fn, info.group_resource)
        await preflight.check_fields(transport, discovery, pool, registrations)
        if o.check_permissions:
            self._review_optional = await preflight.check_permissions(transport, discovery, o, self.registry)
        self.lifecycle = Lifecycle(self.registry.hooks, ctx, self.executor)
        self._leases()
        self.controllers = [
            build_controller(
                reg, discovery=discovery, pool=pool, ctx=ctx, executor=self.executor, metrics=self.metrics,
                elector=self.elector, shard_leases=self.shard_leases, shards=o.shards, recent=o.debug_reconciles,
                clock=self.clocks.get("clock", MONOTONIC), sharded=self.sharded,
            )  # fmt: skip
            for reg in registrations
        ]
        if self.metrics is not None:
            for c in self.controllers:
                self.metrics.watch_queue(c.queue.statistics)
        debug = o.debug_reconciles
        if not isinstance(debug, int) or isinstance(debug, bool) or debug < 0:
            raise ConfigError(f"debug_reconciles must be an int >= 0 (0: off), got {debug!r}")
        if debug and not o.health_port:
            raise ConfigError("--debug-reconciles serves /debug/reconciles on the health port; pass --health-port too")
        if self.registry.webhooks:
            await self._setup_webhooks()
        if o.health_port or o.metrics_port:
            self._setup_probes()
        if not o.health_port and self.lifecycle.of("probe"):
            log.warning("@declop.on_probe functions are registered but no health port is served: /probes is not", extra={"kv": {"probes": [h.name for h in self.lifecycle.of("probe")]}})

    async def _login(self) -> Any:
        """The ``@declop.on_login`` answer as the configuration (:mod:`declop.kube.login`); a
        first login that fails is the start's :class:`~declop.errors.ConfigError`."""
        from declop.kube.login import LoginConfig
        from declop.lifecycle import login_function

        name = ", ".join(h.name for h in self.registry.hooks if h.kind == "login")
        try:
            return await LoginConfig.first(login_function(self.registry.hooks), name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ConfigError(f"login function {name!r} failed: {type(exc).__name__}: {exc}; the operator did not start") from exc

    def _leases(self) -> None:
        """The leader elector (leader election) or the range Leases (sharding)."""
        o = self.options
        timings = dict(lease_duration=o.lease_duration, renew_deadline=o.renew_deadline, retry_period=o.retry_period)
        namespace = o.leader_election_namespace or pod_namespace()
        if o.leader_elect:
            self.leadership = asyncio.Event()
            self.elector = LeaderElector(
                self.transport, name=o.leader_election_id, namespace=namespace, **timings, **self.clocks, on_change=self._report_leading
            )
            self._report_leading(False)
        if o.shards:
            if o.leader_elect:
                raise ConfigError("sharding replaces leader election: pass shards or leader_elect, not both")
            self.shard_leases = ShardLeases(
                self.transport, lease_id=o.leader_election_id, namespace=namespace, **timings, metrics=self.metrics,
                on_round=self.resharding.want, **self.clocks,
            )  # fmt: skip

    def _setup_probes(self) -> None:
        from declop.serving.cert import ServingCert
        from declop.serving.metricsauth import MetricsAuth
        from declop.serving.probes import ProbeServer

        o = self.options
        assert self.transport is not None
        tls, auth = None, None
        if o.metrics_port and o.metrics_secure:
            tls = ServingCert(o.metrics_cert_dir).context
        if o.metrics_secure and (o.metrics_port or o.debug_reconciles):
            # /metrics and /debug/reconciles: reviews on their own lane ("auth"), bounded
            auth = MetricsAuth(self.transport.request)
        self.probes = ProbeServer(
            host=self.bind_address,
            health_port=o.health_port,
            metrics_port=o.metrics_port,
            checks=self.checks,
            metrics=self.metrics.exposition if self.metrics is not None else None,
            metrics_tls=tls,
            metrics_auth=auth,
            reconciles=self.recent_reconciles if o.debug_reconciles else None,
            probes=self._probe_report(),
        )

    def _probe_report(self) -> Any:
        """``/probes``' source: the ``@declop.on_probe`` values (None: none is registered)."""
        if self.lifecycle is None or not self.lifecycle.of("probe"):
            return None
        from declop.handlers.probing import Probes

        return Probes(self.lifecycle.hooks, self.lifecycle.call).report

    def _report_leading(self, leading: bool) -> None:
        if self.metrics is not None:
            self.metrics.leader.labels(self.options.leader_election_id).set(int(leading))

    def recent_reconciles(self) -> dict[str, list[dict[str, Any]]]:
        """The last reconciles per controller, newest last (``/debug/reconciles``)."""
        return {c.name: list(c.recent or ()) for c in self.controllers}

    async def _setup_webhooks(self) -> None:
        """Resolve every webhook's resource, get the certificate (the CA Secret is read or created
        here) and build the server; it starts in :meth:`start`."""
        assert self.transport is not None and self.discovery is not None
        opts = self.options
        from declop.webhooks.endpoint import WebhookEndpoint

        await preflight.check_names(self.discovery, self.registry, webhooks=True)
        self.webhook_endpoint = await WebhookEndpoint.create(
            self.registry.webhooks, self.transport.request, port=opts.webhook_port, name=opts.webhook_name,
            cert_dir=opts.webhook_cert_dir, service=opts.webhook_service, url=opts.webhook_url,
            namespace=opts.webhook_namespace, cert_validity=opts.webhook_cert_validity, metrics=self.metrics,
            host=self.bind_address, max_body=opts.webhook_max_body,
        )  # fmt: skip

    def grants(self, resolve: Resolve | None = None) -> list[Grant]:
        """The RBAC grants this manager's registrations and options need (:mod:`declop.kube.rbac`)."""
        return preflight.grants(self.options, self.registry, resolve)

    def checks(self) -> list[Check]:
        """Readiness: one check per controller, failing until its caches synced; with leader
        election one more, failing while Lease requests are refused (401/403) — a replica that
        can never lead is not a standby. Leadership itself is not required: standbys are ready."""

        def synced(c: Controller) -> str:
            if c.synced.is_set():
                return ""
            waiting = [f"{i.name}: {i.last_error}" if i.last_error else i.name for i in c.informers() if not i.synced.is_set()]
            return "caches not synced: " + "; ".join(waiting)

        checks: list[Check] = [(f"informer-sync:{c.name}", functools.partial(synced, c)) for c in self.controllers]
        if self.elector is not None:
            elector = self.elector
            checks.append(("leader-election", lambda: elector.problem))
        if self.shard_leases is not None:
            checks.append(("sharding", self.shard_leases.problem))  # a member Lease refused: it can never own a range
        if self.webhook_endpoint is not None:
            endpoint = self.webhook_endpoint
            checks.append(("webhooks", lambda: "" if endpoint.registered else "webhook server not started"))
        return checks

    async def start(self) -> None:
        """Set up (if needed), start informers, and start every runnable."""
        if self.options.switch_interval is not None:
            sys.setswitchinterval(self.options.switch_interval)
        if self.transport is None:
            await self.setup()
        assert self.informers is not None
        if self.probes is not None:
            await self.probes.start()  # before the caches: /healthz answers while they sync
            if self.loop_lag is not None:
                self.loop_lag.start()
        if self.webhooks is not None:  # before startup hooks and informers: their writes may need it
            assert self.webhook_endpoint is not None and self.transport is not None
            hooks = [(h, self.discovery.resolve_cached(h.resource)) for h in self.registry.webhooks]  # type: ignore[union-attr]
            await self.webhook_endpoint.start(hooks, self.transport.request)
        if self.lifecycle is not None:
            await self.lifecycle.startup()  # a failure raises ConfigError: nothing else starts
        self.started_up = True
        self.informers.start()
        for c in self.controllers:
            self.group.start(Task(f"start {c.name}", functools.partial(c.start, self.leadership)))
        if self._review_optional is not None:
            self.group.start(Task(preflight.REVIEW, self._review_optional))
        if self.elector is not None:
            self.group.start(LeaderLease(self))
        if self.shard_leases is not None:
            self.group.start(RangeLeases(self))
        if self.lifecycle is not None and self.lifecycle.of("background"):
            self.group.start(Task(BACKGROUND, self._every_replica_background))
            if self.shard_leases is None:
                self.group.start(Task(LEADER_ONLY_BACKGROUND, self._leader_only_background, leader_only=True))
        self.started.set()

    async def _every_replica_background(self) -> None:
        """Once every cache synced: the every-replica background tasks; sharded, the Lease whose
        holder runs the leader-only ones."""
        assert self.lifecycle is not None
        await asyncio.gather(*(c.synced.wait() for c in self.controllers))
        self.lifecycle.start_background(every_replica=True)
        if self.shard_leases is not None and any(not h.every_replica for h in self.lifecycle.of("background")):
            self.group.start(BackgroundLease(self))

    async def _leader_only_background(self) -> None:
        """Once every cache synced and the Lease is ours (at once without leader election)."""
        assert self.lifecycle is not None
        await asyncio.gather(*(c.synced.wait() for c in self.controllers))
        if self.leadership is not None and (self.elector is None or not self.elector.valid()):
            return  # lost before we got here: the loss stops everything
        e = self.elector
        self.lifecycle.start_background(every_replica=False, lease=(e.valid, f"{e.namespace}/{e.name}") if e is not None else None)

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop, as SIGTERM does (a lost Lease does)."""
        if self._stop is not None:
            self._stop.set()

    def lose(self) -> None:
        """A Lease was lost under a running call: exit 1; from now on every step of the stop
        shares the loss's budget, and :attr:`on_lost` is called (once)."""
        self.exit_code = 1
        self.loss.declare()

    def running(self) -> int:
        """Calls, shutdown hooks and background tasks still running although the stop gave up
        on them. The leader Lease is not released while this is not 0 (invariant I6); range
        Leases count their own (:attr:`~declop.leases.shards.ShardSet.in_flight`)."""
        return sum(c.running() for c in self.controllers) + self.left_running

    def ready(self) -> bool:
        """True once every controller passed its sync gate (and the webhooks are registered)."""
        if self.webhook_endpoint is not None and not self.webhook_endpoint.registered:
            return False
        return bool(self.controllers or self.webhooks) and all(c.synced.is_set() for c in self.controllers)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await all_synced((c.synced for c in self.controllers), timeout)

    # -- run / stop -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully."""
        self._stop = stop
        collector.started()
        try:
            await self.start()
            await stop.wait()
            log.info("Stopping, waiting for in-flight reconciles", extra={"kv": {"gracePeriod": self.options.grace_period}})
        finally:
            try:
                await self.shutdown()
            finally:
                collector.ended()  # the last manager out thaws what the runs froze

    async def shutdown(self) -> bool:
        """Stop in :mod:`declop.manager.shutdown`'s order; True when every controller drained
        within the grace period."""
        return await shutdown(self)
