"""Manager: owns the transport, discovery, the shared informers and every controller of one process.

Start order: connect and discover → freeze the registry and resolve every resource name (and
check every field selector with the apiserver) → review the permissions declop needs
(SelfSubjectAccessReview, :mod:`declop.kube.access`; a missing one stops the start here) →
build one shared informer per (resource, namespace, selectors, metadata only) and one
controller per registration → probes → webhook server, then its configurations (so nothing is
sent to a webhook before it answers) → startup hooks → start informers (and review the optional
writes meanwhile) → each controller waits for its caches (and, with leader election, for the
Lease), then starts its workers; background tasks start once every cache synced (leader-only
ones once the Lease is ours too).

Graceful stop (SIGTERM): controllers stop taking keys and drain in-flight reconciles within the
grace period, background tasks are told to stop within it too, **while the Lease keeps being
renewed** → shutdown hooks → only then is the Lease released (a standby may start at once) —
unless a call under it still runs (a plain handler's thread outlived the grace period, a
shutdown hook or background task that would not stop): then it is left to expire, with one log
line, and that is a loss — the stuck rest dies with the process within 2 s (exit 1, the
watchdog; the steps below share the loss's budget), before another replica may take the Lease →
informers stop → the transport closes → probes stop last.

Lease lost: intake stops at once (queues shut down, workers and leader-only background tasks
cancelled, the fence is closed), no drain — another replica may already reconcile — and the
process exits non-zero within :data:`~declop.leases.watchdog.EXIT_BOUND` (2 s) of the loss: every
step after it shares one budget (:data:`LOST_CLEANUP_SECONDS`), and :attr:`Manager.on_lost`
(the CLI arms its :class:`~declop.leases.watchdog.Watchdog` there) ends the process if something still
holds it; ``/healthz`` answers until the probes stop, right before the exit.

Invariants:
- everything runs on the one event loop that called :meth:`Manager.run`; plain handlers run in
  one bounded thread pool owned here;
- an informer is shared by every controller that needs the same (resource, namespace, selector);
- user errors found at start (unknown resource, unreachable apiserver, nothing registered) raise
  :class:`~declop.errors.ConfigError` before any controller starts;
- with leader election every controller gets the elector's :meth:`~declop.leases.leader.LeaderElector.valid`
  as its fence: no reconcile starts unless the Lease is known valid on the monotonic clock;
- no Lease is released while a call under it still runs (:meth:`Manager.running`; issue 22, I6);
- after a loss no step waits past :data:`LOST_CLEANUP_SECONDS` from the loss;
- with sharding (``shards`` > 0; never together with leader election) every controller gets a
  :class:`~declop.leases.shards.ShardSet`: it reconciles only keys of the ranges whose Leases this
  replica holds and knows valid. On a graceful stop the controllers drain first, then the range
  Leases are released and the member Lease deleted; a range lost while a reconcile of it ran
  makes the process exit 1, like a lost leader Lease.
"""

# size: one piece: the start order and the stop order above, kept in one class because each step
# reads the state of the others (controllers, the leader and range Leases, background tasks,
# webhooks, probes). What a step builds lives in its own package; the webhook certificate, server
# and configurations in declop.webhooks.endpoint.

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, TypeVar

from declop.cache.store import guarded
from declop.clock import MONOTONIC, Clock
from declop.reconcile.client import AsyncClient, ClientContext
from declop.reconcile.controller import Controller, Source
from declop.kube.discovery import Discovery, ResourceInfo
from declop.errors import ApiError, ConfigError, Forbidden
from declop.reconcile.events import EventRecorder
from declop.cache.informer import Informer, InformerPool
from declop.leases.leader import LeaderElector
from declop.leases.hashing import ShardFilter, ShardRange
from declop.leases.shards import ShardLeases, ShardSet
from declop.lifecycle import Lifecycle
from declop.reconcile.mapping import enqueue_mapped, enqueue_owner, enqueue_self
from declop.reconcile.registration import Registration
from declop.registry import Registry, default_registry
from declop.kube.kubeconfig import pod_namespace
from declop.kube.access import check_access
from declop.kube.rbac import Grant, Resolve, group_resource, is_cluster_scoped
from declop.kube.transport import Transport

if TYPE_CHECKING:
    # imported where used: a run without probes, metrics or webhooks (``declop run`` by default,
    # every ``declop dev`` reload) does not pay for aiohttp.web and the servers (~35 ms of its start)
    from declop.serving.metrics import LoopLag, Metrics
    from declop.serving.probes import Check, ProbeServer
    from declop.webhooks.certs import WebhookCert
    from declop.webhooks.endpoint import WebhookEndpoint
    from declop.webhooks.server import WebhookServer

__all__ = ["Manager", "Options"]

log = logging.getLogger("declop.manager")

T = TypeVar("T")


class _BadShardKey(ConfigError):
    """A shard key that cannot spread a controller's objects: a usage error (exit 2)."""

    exit_code = 2


@dataclass
class Options:
    """Settings of one manager; ``cli.py`` fills them from flags and ``DECLOP_*`` variables."""

    namespaces: tuple[str, ...] = ()
    grace_period: float = 30.0
    user_agent: str = "declop"
    field_manager: str = "declop"
    handler_threads: int | None = None
    health_port: int | None = None
    metrics_port: int | None = None
    #: /metrics over HTTPS, callers checked with TokenReview + SubjectAccessReview (False: plain HTTP)
    metrics_secure: bool = True
    #: tls.crt/tls.key for the metrics server (None: a self-signed pair generated at start)
    metrics_cert_dir: str | None = None
    leader_elect: bool = False
    leader_election_id: str = "declop"
    leader_election_namespace: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: sharded mode: split every controller's hash space into this many ranges, one Lease each
    #: (0: off). The Leases live in ``leader_election_namespace`` and are named after
    #: ``leader_election_id``.
    shards: int = 0
    qps: float = 20.0
    burst: int = 30
    #: how informers sync: "auto" (streaming list, logged fallback to paginated LIST when the
    #: apiserver refuses it), "stream" or "paged" (forced)
    list_mode: str = "auto"
    #: keep the last N reconciles per controller and serve them on /debug/reconciles (health
    #: port); 0: off
    debug_reconciles: int = 0
    #: seconds a thread may keep the interpreter while another waits for it
    #: (``sys.setswitchinterval``, process-wide, set at start; None: leave Python's 5 ms). The
    #: loop gives the interpreter up at every socket call and waits up to this long to get it
    #: back while a thread (a plain ``def`` handler, a large webhook body) computes: under load,
    #: tens of such waits a second stall the loop (docs/webhooks.md, "Limits")
    switch_interval: float | None = 0.001
    #: the address the probe, metrics and webhook servers listen on (None: every interface,
    #: 0.0.0.0 — what a Pod needs; ``declop dev`` uses 127.0.0.1)
    bind_address: str | None = None
    #: HTTPS port of the webhook server (served only when webhooks are registered)
    webhook_port: int = 9443
    #: tls.crt/tls.key (and ca.crt) mounted for the webhook server; None: declop's own CA in a Secret
    webhook_cert_dir: str | None = None
    #: "namespace/name[:port]" of the Service in front of the operator (in-cluster); None: the URL form
    webhook_service: str | None = None
    #: where the apiserver reaches this process, without the path (default https://127.0.0.1:<port>)
    webhook_url: str | None = None
    #: names the webhook configurations and the CA Secret (<name>-webhook-ca)
    webhook_name: str = "declop"
    #: the operator's namespace: holds the CA Secret, excluded from admission (default: the
    #: Service's, else the Pod's; out of a cluster none is excluded and the Secret goes to "default")
    webhook_namespace: str | None = None
    #: ask the apiserver (SelfSubjectAccessReview) for every grant the registrations need before
    #: informers start; a missing one stops the start (docs/rbac.md)
    check_permissions: bool = True
    #: the command that prints the RBAC the handlers need, named when a permission is missing
    rbac_command: str = "declop rbac <your handler files>"
    #: seconds a generated serving certificate is valid; renewed after two thirds of it
    webhook_cert_validity: float = 365 * 86400.0
    #: bytes a webhook request body may have (None: 7 MiB admission, 8 MiB conversion); one
    #: such body is decoded at a time, and costs about five times its size in memory
    webhook_max_body: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
        built from ``configuration`` unless given: the simulator (:mod:`declop.testing.simworld`)
        gives its own, so that several managers run in one process on virtual time."""
        self.configuration = configuration
        self._given = (transport, discovery, executor)
        #: the Lease clocks (``clock``, ``wall_clock``) when given: passed to the electors
        self._clocks: dict[str, Clock] = {k: v for k, v in (("clock", clock), ("wall_clock", wall_clock)) if v is not None}
        self.registry = registry if registry is not None else default_registry
        self.options = options or Options()
        #: None when nobody can scrape them (no ``metrics_port``, none given): nothing is recorded
        #: on the hot path and prometheus-client is never imported (issue 24: ~10 µs of CPU per
        #: reconcile, ~28 ms of start-up)
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
        self.started = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: reviews the optional grants (warnings only), started with the informers
        self._review_optional: Callable[[], Coroutine[Any, Any, None]] | None = None
        self.elector: LeaderElector | None = None
        self.shard_leases: ShardLeases | None = None
        #: sharded informer -> the range sets whose held ranges it must cache (their union)
        self._sharded: dict[Informer, list[ShardSet]] = {}
        self._resharding: asyncio.Task[None] | None = None
        self._reshard_again = False
        self._sharding: asyncio.Task[None] | None = None
        self.leadership: asyncio.Event | None = None
        self.probes: ProbeServer | None = None
        self.exit_code = 0
        self._stop: asyncio.Event | None = None
        self._leading: asyncio.Task[None] | None = None
        self.lifecycle: Lifecycle | None = None
        self._started_up = False  # the startup hooks all succeeded
        self._background: asyncio.Task[None] | None = None
        #: sharded mode: the Lease whose holder runs the leader-only background tasks
        self.background_elector: LeaderElector | None = None
        self._singleton: asyncio.Task[None] | None = None
        self._stopping = False
        #: the webhook certificate, server and configurations (None: no webhook is registered)
        self.webhook_endpoint: WebhookEndpoint | None = None
        #: called (synchronously, once) the moment a Lease is lost: ``declop run`` arms its
        #: :class:`~declop.leases.watchdog.Watchdog` here, so the process is gone within 2 s
        self.on_lost: Callable[[], None] | None = None
        #: loop time by which the clean-up after a loss must be over (None: no loss)
        self._lost_by: float | None = None
        self._lost_event = asyncio.Event()
        #: shutdown hooks and background tasks a stop gave up on (they still run)
        self._left_running = 0

    @property
    def webhooks(self) -> WebhookServer | None:
        return self.webhook_endpoint.server if self.webhook_endpoint is not None else None

    @property
    def webhook_cert(self) -> WebhookCert | None:
        return self.webhook_endpoint.cert if self.webhook_endpoint is not None else None

    # -- start ---------------------------------------------------------------------------------
    async def _discover(self) -> Discovery:
        assert self.transport is not None
        transport = self.transport

        async def get_json(path: str, accept: str) -> Any:
            return await transport.request("GET", path, accept=accept)

        discovery = Discovery(get_json)
        try:
            await discovery.refresh()
        except Forbidden as exc:
            raise ConfigError(f"the apiserver at {transport.host} forbids API discovery to this identity: {exc}") from exc
        except ApiError as exc:
            if exc.status == 0 and exc.reason in ("Unreachable", "Timeout"):
                raise ConfigError(
                    f"cannot reach the apiserver at {transport.host} ({exc.reason}); is the cluster running, "
                    "and are --kubeconfig/--context right?"
                ) from exc
            if exc.status == 0:  # TLS verification, exec plugin: the message says it all
                raise ConfigError(str(exc)) from exc
            if exc.status == 401:
                raise ConfigError(transport.configuration.explain_401()) from exc
            raise ConfigError(f"API discovery failed at {transport.host}: {exc}") from exc
        return discovery

    async def setup(self) -> None:
        """Connect, discover and build controllers (no informer runs yet)."""
        self.registry.freeze()
        registrations = self.registry.registrations
        if not registrations and not self.registry.webhooks:
            raise ConfigError(
                "no reconciler is registered; decorate a function with @declop.reconciler(\"pods\") "
                "in the files or modules you pass to 'declop run'"
            )
        given_transport, given_discovery, given_executor = self._given
        self.transport = given_transport or Transport(
            self.configuration, user_agent=self.options.user_agent, qps=self.options.qps, burst=self.options.burst
        )
        if self.metrics is not None:
            self.transport.observer = self.metrics.request
        self.discovery = given_discovery or await self._discover()
        self.informers = InformerPool(
            self.transport, namespaces=self.options.namespaces, list_mode=self.options.list_mode  # type: ignore[arg-type]
        )
        if self.metrics is not None:
            self.metrics.watch_informers(lambda: self.informers or ())
        loop = asyncio.get_running_loop()
        sync_workers = sum(r.max_concurrent for r in registrations if not r.is_async)
        self.executor = given_executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=self.options.handler_threads or max(sync_workers, 1) + 2,
            thread_name_prefix="declop-handler",
        )
        ctx = ClientContext(
            self.transport,
            self.discovery,
            self.informers,
            loop,
            field_manager=self.options.field_manager,
            recorder=EventRecorder(self.transport),
        )
        self.context = ctx
        # resolve every name up front (refreshing discovery once for a CRD installed just now)
        for ix in self.registry.indexes:
            await self._check(ix.resource, f"index {ix.name!r}")
        for resource_name in self.registry.transforms:
            await self._check(resource_name, f"transform of {resource_name!r}")
        for reg in registrations:
            await self._check(reg.resource, f"controller {reg.name!r}")
            for owned in reg.owns:
                await self._check(owned.name, f"controller {reg.name!r} owns=")
            for watched, _fn in reg.watches:
                await self._check(watched.name, f"controller {reg.name!r} watches=")
        for ix in self.registry.indexes:
            self.informers.add_indexer(self._resolve(ix.resource), ix.name, ix.fn)
        for resource_name, fn in self.registry.transforms.items():
            info = self._resolve(resource_name)
            self.informers.transforms[info.group_resource] = guarded(fn, info.group_resource)
        await self._check_fields(registrations)
        if self.options.check_permissions:
            await self._check_access()
        self.lifecycle = Lifecycle(self.registry.hooks, ctx, self.executor)
        if self.options.leader_elect:
            self.leadership = asyncio.Event()
            self.elector = LeaderElector(
                self.transport,
                name=self.options.leader_election_id,
                namespace=self.options.leader_election_namespace or pod_namespace(),
                lease_duration=self.options.lease_duration,
                renew_deadline=self.options.renew_deadline,
                retry_period=self.options.retry_period,
                **self._clocks,  # type: ignore[arg-type]
                on_change=self._report_leading,
            )
            self._report_leading(False)
        if self.options.shards:
            if self.options.leader_elect:
                raise ConfigError("sharding replaces leader election: pass shards or leader_elect, not both")
            self.shard_leases = ShardLeases(
                self.transport,
                lease_id=self.options.leader_election_id,
                namespace=self.options.leader_election_namespace or pod_namespace(),
                lease_duration=self.options.lease_duration,
                renew_deadline=self.options.renew_deadline,
                retry_period=self.options.retry_period,
                metrics=self.metrics,
                on_round=self._want_reshard,
                **self._clocks,  # type: ignore[arg-type]
            )
        self.controllers = [self._build(reg, ctx) for reg in registrations]
        if self.metrics is not None:
            for c in self.controllers:
                self.metrics.watch_queue(c.queue.statistics)
        debug = self.options.debug_reconciles
        if not isinstance(debug, int) or isinstance(debug, bool) or debug < 0:
            raise ConfigError(f"debug_reconciles must be an int >= 0 (0: off), got {debug!r}")
        if debug and not self.options.health_port:
            raise ConfigError(
                "--debug-reconciles serves /debug/reconciles on the health port; pass --health-port too"
            )
        if self.registry.webhooks:
            await self._setup_webhooks()
        if self.options.health_port or self.options.metrics_port:
            from declop.serving.cert import ServingCert
            from declop.serving.metricsauth import MetricsAuth
            from declop.serving.probes import ProbeServer

            tls, auth = None, None
            if self.options.metrics_port and self.options.metrics_secure:
                tls = ServingCert(self.options.metrics_cert_dir).context
            if self.options.metrics_secure and (self.options.metrics_port or debug):
                # /metrics and /debug/reconciles: reviews on their own lane ("auth"), bounded
                auth = MetricsAuth(self.transport.request)
            self.probes = ProbeServer(
                host=self.bind_address,
                health_port=self.options.health_port,
                metrics_port=self.options.metrics_port,
                checks=self.checks,
                metrics=self.metrics.exposition if self.metrics is not None else None,
                metrics_tls=tls,
                metrics_auth=auth,
                reconciles=self.recent_reconciles if debug else None,
            )

    def _report_leading(self, leading: bool) -> None:
        if self.metrics is not None:
            self.metrics.leader.labels(self.options.leader_election_id).set(int(leading))

    @property
    def bind_address(self) -> str:
        """Where this process's servers listen (:attr:`Options.bind_address`, default 0.0.0.0)."""
        return self.options.bind_address or "0.0.0.0"

    def recent_reconciles(self) -> dict[str, list[dict[str, Any]]]:
        """The last reconciles per controller, newest last (``/debug/reconciles``)."""
        return {c.name: list(c.recent or ()) for c in self.controllers}

    async def _setup_webhooks(self) -> None:
        """Resolve every webhook's resource, get the certificate (the CA Secret is read or created
        here) and build the server; it starts in :meth:`start`."""
        assert self.transport is not None
        opts = self.options
        from declop.webhooks.endpoint import WebhookEndpoint

        for hook in self.registry.webhooks:
            await self._check(hook.resource, f"{hook.kind} {hook.name!r}")
        self.webhook_endpoint = await WebhookEndpoint.create(
            self.registry.webhooks, self.transport.request, port=opts.webhook_port, name=opts.webhook_name,
            cert_dir=opts.webhook_cert_dir, service=opts.webhook_service, url=opts.webhook_url,
            namespace=opts.webhook_namespace, cert_validity=opts.webhook_cert_validity, metrics=self.metrics,
            host=self.bind_address, max_body=opts.webhook_max_body,
        )  # fmt: skip

    async def _start_webhooks(self) -> None:
        assert self.webhook_endpoint is not None and self.transport is not None
        hooks = [(h, self._resolve(h.resource)) for h in self.registry.webhooks]
        await self.webhook_endpoint.start(hooks, self.transport.request)

    async def _check(self, name: str, who: str) -> None:
        assert self.discovery is not None
        try:
            await self.discovery.resolve(name)
        except ConfigError as exc:
            raise ConfigError(f"{who}: {exc}") from None

    async def _check_fields(self, registrations: list[Registration]) -> None:
        """Ask the apiserver once per (resource, field selector) whether it supports the selector's
        field labels (a LIST of at most one object); a 400 becomes one ConfigError line."""
        assert self.transport is not None
        seen: set[tuple[str, str]] = set()
        for reg in registrations:
            declared = [(reg.primary, "")] + [(o, " owns=") for o in reg.owns] + [(w, " watches=") for w, _ in reg.watches]
            for res, where in declared:
                if not res.fields:
                    continue
                info = self._resolve(res.name)
                if (info.group_resource, res.fields) in seen:
                    continue
                seen.add((info.group_resource, res.fields))
                scope = self.informers.scope(info, reg.namespaces) if self.informers is not None else ("",)
                path = info.path(namespace=scope[0] or None)
                try:
                    await self.transport.request("GET", path, params={"limit": 1, "fieldSelector": res.fields}, lane="informer")
                except ApiError as exc:
                    if exc.status != 400:
                        continue  # not the selector's fault (403, 5xx): the informer reports it as usual
                    raise ConfigError(
                        f"controller {reg.name!r}{where}: field selector {res.fields!r} is not supported for "
                        f"{info.group_resource} ({exc}); select on a field the apiserver supports for it, "
                        "or drop fields= and filter with a predicate"
                    ) from None

    def grants(self, resolve: Resolve | None = None) -> list[Grant]:
        """The RBAC grants this manager's registrations and options need (:mod:`declop.kube.rbac`)."""
        o = self.options
        lease_ns = o.leader_election_namespace or pod_namespace()
        ca_ns = None
        if not o.webhook_cert_dir:
            service_ns = o.webhook_service.partition("/")[0] if o.webhook_service and "/" in o.webhook_service else None
            ca_ns = o.webhook_namespace or service_ns or pod_namespace(fallback=None) or "default"
        return self.registry.grants(
            resolve or group_resource,
            leader=(lease_ns, o.leader_election_id) if o.leader_elect else None,
            shards=lease_ns if o.shards else None,
            webhook_name=o.webhook_name,
            ca_secret_namespace=ca_ns,
            metrics_auth=bool(o.metrics_secure and (o.metrics_port or o.debug_reconciles)),
        )

    async def _check_access(self) -> None:
        """Review every grant with the apiserver before informers start (:mod:`declop.kube.access`)."""
        assert self.transport is not None and self.discovery is not None
        discovery = self.discovery

        def resolve(name: str) -> tuple[str, str]:
            try:
                info = discovery.resolve_cached(name)
            except ConfigError:
                return group_resource(name)  # not served (yet): the offline reading
            return info.group, info.plural

        scopes = {(r.group, r.plural): r.namespaced for r in discovery.resources()}

        def cluster_scoped(group: str, resource: str) -> bool:
            namespaced = scopes.get((group, resource.partition("/")[0]))
            return is_cluster_scoped(group, resource) if namespaced is None else not namespaced

        grants = self.grants(resolve)
        started = asyncio.get_running_loop().time()
        check = functools.partial(
            check_access, self.transport.request, namespaces=self.options.namespaces,
            command=self.options.rbac_command, cluster_scoped=cluster_scoped,
        )  # fmt: skip
        await check([g for g in grants if g.required])
        log.debug("Checked the permissions declop needs", extra={"kv": {"seconds": round(asyncio.get_running_loop().time() - started, 4)}})
        # the writes a handler may do only warn: reviewed while the caches fill, not before
        optional = [g for g in grants if not g.required]
        self._review_optional = (lambda: check(optional)) if optional else None

    def _resolve(self, name: str, who: str = "") -> ResourceInfo:
        assert self.discovery is not None
        return self.discovery.resolve_cached(name)

    def _build(self, reg: Registration, ctx: ClientContext) -> Controller:
        assert self.informers is not None
        primary = self._resolve(reg.resource, f"controller {reg.name!r}")
        pool = self.informers
        shards = None
        if self.shard_leases is not None:
            if reg.shard_by == "namespace" and not primary.namespaced:
                raise _BadShardKey(
                    f"controller {reg.name!r}: shard_by='namespace' on {primary.group_resource}, which is cluster-scoped: "
                    "every object has the empty namespace, so one replica would own them all; use shard_by='uid'"
                )
            shards = self.shard_leases.add(reg.name, self.options.shards, reg.shard_by)
        # sharded: the primary's informers cache only the held ranges (empty until the first is
        # taken); owned resources too when sharded by namespace (a child's uid is not its owner's,
        # so by uid they are cached whole and mapped to the owner's key, whose range decides)
        own = ShardFilter(reg.shard_by, ()) if shards is not None else None  # type: ignore[arg-type]
        primary_informers = pool.for_resource(
            primary, reg.namespaces, reg.labels, field_selector=reg.fields, metadata_only=reg.metadata_only, shard=own
        )
        sharded = list(primary_informers)
        sources = [
            Source(
                tuple(primary_informers),
                enqueue_self,
                reg.predicates,
                primary=True,
            )
        ]
        for owned in reg.owns:
            info = self._resolve(owned.name, f"controller {reg.name!r} owns=")
            mapper = enqueue_owner(primary.group, primary.kind, namespaced=primary.namespaced)
            by_namespace = own if reg.shard_by == "namespace" and info.namespaced else None
            informers = pool.for_resource(
                info, reg.namespaces, field_selector=owned.fields, metadata_only=owned.metadata_only, shard=by_namespace
            )
            if by_namespace is not None:
                sharded += informers
            sources.append(Source(tuple(informers), mapper, label=f"owns:{info.kind}"))
        for watched, fn in reg.watches:
            info = self._resolve(watched.name, f"controller {reg.name!r} watches=")
            informers = pool.for_resource(info, reg.namespaces, field_selector=watched.fields, metadata_only=watched.metadata_only)
            sources.append(
                Source(
                    tuple(informers),
                    enqueue_mapped(fn, AsyncClient(ctx)),
                    label=f"watches:{info.group_resource}",
                    via=getattr(fn, "__name__", "map function"),
                )
            )
        fence = self.elector.valid if self.elector is not None else None
        if shards is not None:
            for informer in sharded:
                self._sharded.setdefault(informer, []).append(shards)
        controller = Controller(
            reg, primary, sources, ctx, executor=self.executor, metrics=self.metrics, fence=fence,
            recent=self.options.debug_reconciles, shards=shards, clock=self._clocks.get("clock", MONOTONIC),
        )
        if shards is not None:  # join and take ranges only once this controller's caches synced
            shards.synced = controller.synced.is_set
        return controller

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
            shard_leases = self.shard_leases  # a member Lease refused (401/403): it can never own a range
            checks.append(("sharding", shard_leases.problem))
        if self.webhook_endpoint is not None:
            endpoint = self.webhook_endpoint
            checks.append(("webhooks", lambda: "" if endpoint.registered else "webhook server not started"))
        return checks

    async def start(self) -> None:
        """Set up (if needed), start informers, and start every controller's sync gate."""
        if self.options.switch_interval is not None:
            sys.setswitchinterval(self.options.switch_interval)
        if self.transport is None:
            await self.setup()
        assert self.informers is not None
        if self.probes is not None:
            await self.probes.start()  # before the caches: /healthz answers while they sync
            if self.loop_lag is not None:
                self.loop_lag.start()
        if self.webhooks is not None:
            await self._start_webhooks()  # before startup hooks and informers: their writes may need it
        if self.lifecycle is not None:
            await self.lifecycle.startup()  # a failure raises ConfigError: nothing else starts
        self._started_up = True
        self.informers.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(c.start(self.leadership), name=f"start {c.name}") for c in self.controllers]
        if self._review_optional is not None:  # cancelled with the other start tasks on shutdown
            self._tasks.append(loop.create_task(self._review_optional(), name="permission check (optional writes)"))
        if self.elector is not None:
            self._leading = loop.create_task(self._lead(), name="leader election")
        if self.shard_leases is not None:
            self._sharding = loop.create_task(self._shard(), name="shard leases")
        if self.lifecycle is not None and self.lifecycle.of("background"):
            self._background = loop.create_task(self._start_background(), name="background tasks")
        self.started.set()

    async def _start_background(self) -> None:
        """Start background tasks once every cache synced: every-replica ones then, leader-only
        ones once the Lease is ours too (at once without leader election)."""
        assert self.lifecycle is not None
        await asyncio.gather(*(c.synced.wait() for c in self.controllers))
        self.lifecycle.start_background(every_replica=True)
        if self.shard_leases is not None:
            if any(not h.every_replica for h in self.lifecycle.of("background")):
                self._singleton = asyncio.get_running_loop().create_task(self._lead_background(), name="background lease")
            return
        if self.leadership is not None:
            await self.leadership.wait()
            if self.elector is None or not self.elector.valid():
                return  # lost before we got here: _lead is stopping everything
        self.lifecycle.start_background(every_replica=False)

    async def _lead_background(self) -> None:
        """Sharded mode has no leader, but a leader-only background task must still run on one
        replica at a time: the holder of the Lease named ``--leader-election-id`` (leader
        election's own Lease, so a task stays single across a switch between the two modes),
        acquired, renewed and released exactly as in leader election. Lost: its tasks are
        cancelled at once (they are ``async def``) and this replica is a candidate again — the
        ranges and their reconciles are not affected. Renewed until the shutdown stopped them."""
        assert self.lifecycle is not None
        o = self.options
        while not self._stopping:
            e = self.background_elector = LeaderElector(
                self.transport, name=o.leader_election_id, namespace=o.leader_election_namespace or pod_namespace(),
                lease_duration=o.lease_duration, renew_deadline=o.renew_deadline, retry_period=o.retry_period,
                **self._clocks,  # type: ignore[arg-type]
            )  # fmt: skip
            await e.acquire()
            if self._stopping or not e.valid():
                continue  # the shutdown releases it
            log.info("Holding the background lease; starting leader-only background tasks", extra={"kv": {"lease": f"{e.namespace}/{e.name}"}})
            self.lifecycle.start_background(every_replica=False)
            await e.hold()
            log.warning("Background lease lost; leader-only background tasks stopped", extra={"kv": {"lease": f"{e.namespace}/{e.name}"}})
            left = await self.lifecycle.stop_background(grace=0, leader_only=True)
            if left:  # a task that would not stop must not run twice: no new candidacy
                self._left_running += len(left)
                return

    async def _lead(self) -> None:
        """Acquire the lease, let the workers start, hold it; on loss stop reconciling at once."""
        assert self.elector is not None and self.leadership is not None
        try:
            await self.elector.acquire()
            self.leadership.set()
            await self.elector.hold()
        except Exception:  # a bug in leader election must not leave a leader without renewals
            log.exception("Leader election failed; stopping", extra={"kv": {"lease": self.options.leader_election_id}})
            self.elector.lose("leader election failed")
        # lost: no drain (another replica may already be reconciling), and exit non-zero
        self._lost()
        for c in self.controllers:
            c.halt()  # intake stops now, before any await
        if self._background is not None:
            self._background.cancel()
        stopping: list[Coroutine[Any, Any, Any]] = [c.stop(0) for c in self.controllers]
        if self.lifecycle is not None:
            stopping.append(self.lifecycle.stop_background(grace=0, leader_only=True, settle=min(0.5, self._left())))
        await self._bounded(asyncio.gather(*stopping), LOST_CLEANUP_SECONDS, "stopping the workers after the loss")
        if self._stop is not None:
            self._stop.set()

    def _lost(self) -> None:
        """A Lease was lost under a running call: exit 1, and from now on every step shares the
        clean-up budget; :attr:`on_lost` is called (once)."""
        self.exit_code = 1
        if self._lost_by is not None:
            return
        self._lost_by = asyncio.get_running_loop().time() + LOST_CLEANUP_SECONDS
        self._lost_event.set()
        if self.on_lost is not None:
            self.on_lost()

    def _left(self) -> float:
        """Seconds left of the clean-up budget after a loss (0 when used up)."""
        assert self._lost_by is not None
        return max(0.0, self._lost_by - asyncio.get_running_loop().time())

    def running(self) -> int:
        """Calls, shutdown hooks and background tasks still running although the stop gave up
        on them. The leader Lease is not released while this is not 0 (invariant I6); range
        Leases count their own (:attr:`~declop.leases.shards.ShardSet.in_flight`)."""
        return sum(c.running() for c in self.controllers) + self._left_running

    def _want_reshard(self) -> None:
        """Move the informers' shard filters, in a task of its own (at most one at a time; a
        request while one runs makes it run once more)."""
        if self._resharding is not None and not self._resharding.done():
            self._reshard_again = True
            return
        self._reshard_again = False
        self._resharding = asyncio.get_running_loop().create_task(self._reshard(), name="shard filters")

    async def _reshard(self) -> None:
        """After a Lease round: every sharded informer caches the union of the ranges its
        controllers hold (draining ones included: their in-flight reconciles read the cache).
        A gained range is re-listed (its objects arrive as additions and are queued); a released
        one leaves the cache without deletions."""
        for informer, sets in self._sharded.items():
            wanted: set[ShardRange] = set()
            for s in sets:
                wanted.update(s.ranges[i] for i in s.held())
            assert informer.shard is not None
            if set(informer.shard.ranges) == set(informer.shard.with_ranges(wanted).ranges):
                continue
            try:
                change = await informer.set_shard(wanted)
                for c in self.controllers:
                    if c.shards in sets:
                        c.forget(informer, change.released)
                if wanted:
                    # an informer that owned nothing was never started (Informer.start returns
                    # at once for empty ranges) and set_shard restarts only a running one
                    informer.start()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("Could not change the shard ranges of an informer", extra={"kv": {"informer": informer.name}})
        if self._reshard_again:
            self._reshard_again = False
            await self._reshard()

    async def _shard(self) -> None:
        """Hold and balance the range Leases; when a range is lost under a running reconcile,
        stop reconciling at once and exit 1 (as after a lost leader Lease)."""
        assert self.shard_leases is not None
        try:
            await self.shard_leases.run()
        except Exception:  # a bug in the Lease loop must not leave ranges held without renewals
            log.exception("Shard leases failed; stopping")
        self._lost()
        for c in self.controllers:
            c.halt()
        await self._bounded(asyncio.gather(*(c.stop(0) for c in self.controllers)), LOST_CLEANUP_SECONDS, "stopping the workers after the loss")
        if self._stop is not None:
            self._stop.set()

    def ready(self) -> bool:
        """True once every controller passed its sync gate (and the webhooks are registered)."""
        if self.webhook_endpoint is not None and not self.webhook_endpoint.registered:
            return False
        return bool(self.controllers or self.webhooks) and all(c.synced.is_set() for c in self.controllers)

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(asyncio.gather(*(c.synced.wait() for c in self.controllers)), timeout)

    # -- run / stop -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop`` is set, then shut down gracefully."""
        self._stop = stop
        try:
            await self.start()
            await stop.wait()
            log.info("Stopping, waiting for in-flight reconciles", extra={"kv": {"gracePeriod": self.options.grace_period}})
        finally:
            await self.shutdown()

    async def shutdown(self) -> bool:
        """Stop intake and drain in-flight reconciles within the grace period while the Lease is
        still renewed; then release the Lease (unless a call under it still runs) and close
        watches, transport and probes.

        After a lost Lease (before or during this stop) there is no drain and every step shares
        :data:`LOST_CLEANUP_SECONDS` from the loss, so the process can exit within 2 s even with
        a handler stuck in a thread, a shutdown hook stuck, or a background task that ignores
        its cancellation."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._background is not None:
            self._background.cancel()
        if self.shard_leases is not None:
            self.shard_leases.stopping = True  # renew only: take no range while draining
        grace = 0.0 if self._lost_by is not None else self.options.grace_period
        stopping: list[Coroutine[Any, Any, Any]] = [c.stop(grace) for c in self.controllers]
        if self.lifecycle is not None:
            stopping.append(self.lifecycle.stop_background(grace=grace, settle=min(0.5, self._left()) if self._lost_by else 1.0))
        results = await self._bounded(asyncio.gather(*stopping), grace + 2.0, "draining")
        clean = results is not None and all(r is not False for r in results[: len(self.controllers)])
        if results is not None and self.lifecycle is not None:
            self._left_running += len(results[-1])
        lost = self._lost_by is not None  # also when the Lease was lost during the drain
        if not clean and not lost:
            log.warning("Grace period over; some reconciles did not finish", extra={"kv": {"gracePeriod": self.options.grace_period}})
        if self.lifecycle is not None and self._started_up:
            # after the drain, while the Lease is held and the client works; bounded after a loss
            ok = await self._bounded(self.lifecycle.shutdown(), 1.0 if lost else self.options.grace_period, "running the shutdown hooks")
            if ok is None:
                self._left_running += 1  # a hook still runs (in its thread): the Lease stays
            if ok is not True:
                self.exit_code = 1
        if self._leading is not None:  # renewing stops only now that no worker runs
            self._leading.cancel()
            await self._bounded(asyncio.gather(self._leading, return_exceptions=True), 1.0, "stopping leader election")
            self._leading = None
        if self.elector is not None:
            self.elector.running = self.running
            if self._lost_by is None and self.running() and self.elector.is_leader:
                # left to expire under a running call: a loss — gone within 2 s, before a
                # standby may take it (lease duration - renew deadline after our last renewal)
                self._lost()
            await self._bounded(self.elector.release(), self.options.renew_deadline, "releasing the Lease")
        if self._singleton is not None:  # renewed while the background tasks stopped
            self._singleton.cancel()
            await self._bounded(asyncio.gather(self._singleton, return_exceptions=True), 1.0, "stopping the background lease")
            self._singleton = None
        if self.background_elector is not None and not lost:
            self.background_elector.running = lambda: self._left_running
            await self._bounded(self.background_elector.release(), self.options.renew_deadline, "releasing the background Lease")
        if self._resharding is not None:
            self._resharding.cancel()
        if self._sharding is not None:  # renewed through the drain; released now that no worker runs
            self._sharding.cancel()
            await self._bounded(asyncio.gather(self._sharding, return_exceptions=True), 1.0, "stopping the shard leases")
            self._sharding = None
        if self.shard_leases is not None and not self._lost_by:
            if self.shard_leases.busy():
                # ranges left to expire under running calls: a loss — the process is gone within
                # 2 s (the watchdog), before another replica may take them; release_all closes
                # their fences first, then releases the idle ranges within what is left of the
                # budget (under a partition each request would wait 5 s: shared-id seed 402)
                self._lost()
            await self._bounded(self.shard_leases.release_all(), self.options.renew_deadline, "releasing the shard Leases")
        # after a loss every remaining step shares one budget, so the exit comes within 2 s
        if self.webhooks is not None:  # served through the drain: another replica may not be up yet
            await self._bounded(self.webhooks.stop(), 30.0, "stopping the webhook server")
        if self.webhook_cert is not None:
            await self._bounded(self.webhook_cert.stop(), 30.0, "stopping certificate renewal")
        if self.webhook_endpoint is not None:
            self.webhook_endpoint.close()
        if self.informers is not None:
            await self._bounded(self.informers.stop(), 30.0, "stopping the informers")
        if self.transport is not None:
            await self._bounded(self.transport.close(), 30.0, "closing the connections")
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        if self.loop_lag is not None:
            await self._bounded(self.loop_lag.stop(), 1.0, "stopping the loop lag probe")
        if self.probes is not None:  # last: /healthz answers until the process goes
            await self._bounded(self.probes.stop(), 30.0, "stopping the probe server")
        return clean

    async def _bounded(self, step: Awaitable[T], seconds: float, what: str) -> T | None:
        """Await one shutdown step for at most ``seconds`` (at least 50 ms) — and, once a Lease is
        lost (before or during the step), no later than the clean-up budget's end; return its
        result, or log and return None if it takes longer (the step is cancelled, and not
        waited for: it may ignore the cancellation)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(step)
        end = loop.time() + max(seconds, 0.05)
        lost = None if self._lost_by is not None else asyncio.ensure_future(self._lost_event.wait())
        try:
            while not task.done():
                if self._lost_by is not None:
                    end = min(end, self._lost_by)
                left = end - loop.time()
                if left <= 0:
                    break
                await asyncio.wait([task] if lost is None or lost.done() else [task, lost], timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if lost is not None:
                lost.cancel()
            if not task.done():
                task.cancel()
                task.add_done_callback(_retrieve)
        if not task.done() or task.cancelled():
            log.warning("Shutdown step timed out; going on", extra={"kv": {"step": what, "seconds": round(max(seconds, 0.05), 3)}})
            return None
        return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A step given up on: its end is nobody's business any more (no "never retrieved" line)."""
    if not task.cancelled():
        task.exception()


#: seconds the clean-up after a lost Lease may take in all (the process must be gone within
#: :data:`~declop.leases.watchdog.EXIT_BOUND`, 2 s; the watchdog fires at 1.75 s)
LOST_CLEANUP_SECONDS = 1.5
