"""Webhook endpoint: this process's webhooks as the apiserver reaches them — the serving
certificate, the HTTPS server, and the configurations that point the apiserver at both.

The manager builds one with :meth:`WebhookEndpoint.create` while it sets up (once every webhook's
resource resolved) and starts it with :meth:`WebhookEndpoint.start` before the startup hooks and
the informers, whose writes may already need it; it stops the server and the certificate itself,
each step bounded, then calls :meth:`WebhookEndpoint.close`.

Invariants:
- nothing is sent to a webhook before it answers: :meth:`~WebhookEndpoint.start` starts the
  certificate and the server first and applies the Validating/MutatingWebhookConfigurations and
  CRD conversions only then; :attr:`~WebhookEndpoint.registered` turns true once they are applied
  (readiness waits for it);
- the apiserver calls ``webhook_service`` (``namespace/name[:port]``, in-cluster) or an
  ``https://`` URL (default ``https://127.0.0.1:<port>``); any other URL is a
  :class:`~declop.errors.ConfigError` before anything is created;
- the operator's namespace (``webhook_namespace``, else the Service's, else the Pod's) is
  excluded from admission and holds the CA Secret; out of a cluster none is excluded and the
  Secret goes to ``default``;
- the ``caBundle`` of every configuration is the certificate's own (mounted ``ca.crt``, or the
  CA in the Secret ``<name>-webhook-ca``);
- plain ``def`` handlers run in a pool of 8 threads owned here; :meth:`~WebhookEndpoint.close`
  shuts it down without waiting.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from declop.errors import ConfigError
from declop.kube.discovery import ResourceInfo
from declop.kube.kubeconfig import pod_namespace
from declop.webhooks.certs import GeneratedCert, MountedCert, WebhookCert, load_or_create_ca
from declop.webhooks.configuration import ClientConfig, apply_configurations, parse_service
from declop.webhooks.declaration import Webhook
from declop.webhooks.server import WebhookServer

if TYPE_CHECKING:
    from declop.serving.metrics import Metrics

__all__ = ["WebhookEndpoint"]

Request = Callable[..., Awaitable[Any]]


class WebhookEndpoint:
    """The certificate, server and client configuration of one process's webhooks."""

    def __init__(
        self,
        server: WebhookServer,
        cert: WebhookCert,
        client: ClientConfig,
        executor: concurrent.futures.ThreadPoolExecutor,
        *,
        name: str,
        own_namespace: str | None,
    ) -> None:
        self.server = server
        self.cert = cert
        #: how the apiserver reaches the server (URL or Service) and the ``caBundle`` it trusts
        self.client = client
        self.executor = executor
        #: names the webhook configurations
        self.name = name
        #: excluded from admission (None: nothing is)
        self.own_namespace = own_namespace
        #: the configurations are applied: the apiserver calls the server
        self.registered = False

    @classmethod
    async def create(
        cls,
        hooks: list[Webhook],
        request: Request,
        *,
        port: int,
        name: str,
        cert_dir: str | None,
        service: str | None,
        url: str | None,
        namespace: str | None,
        cert_validity: float,
        metrics: Metrics | None,
        host: str = "0.0.0.0",
        max_body: int | None = None,
    ) -> WebhookEndpoint:
        """Get the certificate (the CA Secret is read or created here) and build the server for
        ``hooks``; nothing listens yet."""
        if service:
            svc_ns, svc_name, svc_port = parse_service(service)
            excluded: str | None = namespace or svc_ns
            probe = ClientConfig(b"", service_namespace=svc_ns, service_name=svc_name, service_port=svc_port)
        else:
            url = url or f"https://127.0.0.1:{port}"
            if not url.startswith("https://"):
                raise ConfigError(f"--webhook-url {url!r} must start with https:// (the apiserver calls webhooks over TLS only)")
            # out of a cluster (declop dev, a local run) there is no namespace of the operator to spare
            excluded = namespace or pod_namespace(fallback=None)
            probe = ClientConfig(b"", url=url)
        own = excluded or "default"
        if cert_dir:
            cert: WebhookCert = MountedCert(cert_dir)
        else:
            ca = await load_or_create_ca(request, own, f"{name}-webhook-ca")
            cert = GeneratedCert(ca, probe.hosts, cert_validity)
        client = ClientConfig(
            cert.ca_bundle, url=probe.url, service_namespace=probe.service_namespace,
            service_name=probe.service_name, service_port=probe.service_port,
        )
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="declop-webhook")
        server = WebhookServer(hooks, port=port, ssl_context=cert.context, executor=executor, host=host, max_request_bytes=max_body)
        if metrics is not None:  # None: /metrics is not served
            server.observer = metrics.webhook
            server.in_flight = metrics.webhook_serving
        return cls(server, cert, client, executor, name=name, own_namespace=excluded)

    async def start(self, hooks: list[tuple[Webhook, ResourceInfo]], request: Request) -> None:
        """Start the certificate and the server, then apply the configurations of ``hooks``."""
        await self.cert.start()
        try:
            await self.server.start()
        except OSError as exc:
            raise ConfigError(
                f"cannot serve webhooks on port {self.server.port}: {exc.strerror or exc}; "
                "pick another with --webhook-port"
            ) from None
        await apply_configurations(request, self.name, hooks, self.client, self.own_namespace)
        self.registered = True

    def close(self) -> None:
        """Shut the handler threads down without waiting (after the server stopped)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
