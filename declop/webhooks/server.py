"""Webhook server: answers the apiserver's AdmissionReviews and ConversionReviews over HTTPS.

One aiohttp server on the manager's loop, on its own port, one path per webhook
(``/validate/<name>``, ``/mutate/<name>``, ``/convert/<name>``; see
:attr:`declop.webhooks.declaration.Webhook.path`). Plain handlers run in the manager's thread pool,
``async def`` ones on the loop.

What each answer is (docs/webhooks.md):

=====================================  ===============================================================
the handler…                           the answer
=====================================  ===============================================================
returns None / warnings (validator)    allowed (with the warnings)
leaves obj / returns one (mutator)     allowed with the JSON Patch to it, or no patch when unchanged
raises :class:`~declop.webhooks.declaration.Rejected`  denied with its message (``field: message``) and code
raises anything else                   denied, "webhook <name> failed …" (500); the traceback is logged
runs past its ``timeout``              denied (the apiserver stopped waiting already); logged as an error
                                       naming the handler and the timeout
=====================================  ===============================================================

Invariants:
- a body that is not a review of the path's kind (not JSON, another kind, no ``request.uid``)
  gets HTTP 400 with one line saying what is wrong, logged once as a warning; the server keeps
  serving;
- nothing from the object or the exception leaves the process except a
  :class:`~declop.webhooks.declaration.Rejected` message the handler wrote;
- a converter is called once per object not already at ``desiredAPIVersion``; one failure fails
  the whole review (Kubernetes has no per-object result) with a message naming the object;
- a plain handler that overruns its timeout keeps its thread until it returns (threads cannot
  be cancelled); an ``async def`` one is cancelled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import ssl
import time
from typing import Any, Awaitable, Callable, Iterable

from aiohttp import web

from declop.webhooks.admission import BadReview, allow, deny, parse_admission
from declop.cache.store import clone
from declop.webhooks.conversion import converted, describe, failed, finish, parse_conversion
from declop.logs import ReconcileLogger
from declop.webhooks.patch import diff
from declop.webhooks.declaration import Rejected, Webhook

__all__ = ["CONVERSION_TIMEOUT", "WebhookServer"]

log = logging.getLogger("declop.webhook")

#: seconds a converter may take per review (the apiserver waits 30 s for a conversion webhook)
CONVERSION_TIMEOUT = 30


class _Overran(Exception):
    """The handler did not return within its timeout."""


class WebhookServer:
    """Serves ``webhooks`` on ``port`` with ``ssl_context``."""

    def __init__(
        self,
        webhooks: Iterable[Webhook],
        *,
        port: int,
        ssl_context: ssl.SSLContext | None,
        executor: concurrent.futures.Executor | None = None,
        host: str = "0.0.0.0",
    ) -> None:
        self.webhooks = list(webhooks)
        self._paths = {h.path for h in self.webhooks}
        self.port, self.host = port, host
        self.ssl_context = ssl_context
        self.executor = executor
        self._runner: web.AppRunner | None = None
        #: answers sent, by outcome ("allowed", "denied", "error", "timeout", "bad-request")
        self.answers: dict[str, int] = {}
        #: called with (path, HTTP status, seconds) after each request (declop.serving.metrics)
        self.observer: Callable[[str, int, float], None] | None = None
        #: called with (path, +1/-1) around each request (declop.serving.metrics)
        self.in_flight: Callable[[str, int], None] | None = None

    @web.middleware
    async def _observe(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        path, started = request.path, time.monotonic()
        if path not in self._paths:  # a scan of random paths must not grow the metrics without bound
            return await handler(request)
        if self.in_flight is not None:
            self.in_flight(path, 1)
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            if self.in_flight is not None:
                self.in_flight(path, -1)
            if self.observer is not None:
                self.observer(path, status, time.monotonic() - started)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[self._observe])
        for hook in self.webhooks:
            handler = self._convert if hook.kind == "converter" else self._admit
            app.router.add_post(hook.path, functools.partial(handler, hook))
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        log.info(
            "Serving webhooks",
            extra={"kv": {"port": self.port, "paths": [h.path for h in self.webhooks]}},
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- answers -------------------------------------------------------------------------------
    def _count(self, outcome: str) -> None:
        self.answers[outcome] = self.answers.get(outcome, 0) + 1

    def _reply(self, review: dict[str, Any], outcome: str) -> web.Response:
        self._count(outcome)
        return web.json_response(review, dumps=functools.partial(json.dumps, separators=(",", ":")))

    def _bad_request(self, hook: Webhook, request: web.Request, exc: BadReview) -> web.Response:
        self._count("bad-request")
        log.warning(
            "Bad webhook request",
            extra={"kv": {"webhook": hook.name, "path": request.path, "error": str(exc), "remote": request.remote}},
        )
        return web.Response(status=400, text=f"bad request: {exc}\n")

    async def _call(self, hook: Webhook, kwargs: dict[str, Any], timeout: float) -> Any:
        """Run the handler within ``timeout`` seconds; raises :class:`_Overran` past it."""
        loop = asyncio.get_running_loop()
        if hook.is_async:
            future: asyncio.Future[Any] = asyncio.ensure_future(hook.fn(**kwargs))
        else:
            future = asyncio.wrap_future(loop.run_in_executor(self.executor, functools.partial(hook.fn, **kwargs)))
        done, _ = await asyncio.wait({future}, timeout=timeout)
        if not done:
            future.cancel()
            raise _Overran()
        return future.result()

    async def _admit(self, hook: Webhook, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            review = parse_admission(body)
        except BadReview as exc:
            return self._bad_request(hook, request, exc)
        uid = review.uid
        pairs = {"webhook": hook.name, "operation": review.operation, "namespace": review.namespace, "name": review.name, "uid": uid}
        logger = ReconcileLogger(logging.getLogger(f"declop.webhook.{hook.name}"), pairs)
        warnings: list[str] = []
        obj = clone(review.obj) if review.obj is not None else None
        available = {
            "obj": obj,
            "old_obj": clone(review.old_obj) if review.old_obj is not None else None,
            "operation": review.operation,
            "user_info": clone(review.user_info),
            "dry_run": review.dry_run,
            "subresource": review.subresource,
            "logger": logger,
            "request_uid": uid,
            "warnings": warnings,
        }
        started = time.monotonic()
        try:
            result = await self._call(hook, hook.arguments(available), hook.timeout)
        except Rejected as exc:
            logger.info("Denied", reason=exc.text, dryRun=review.dry_run)
            return self._reply(deny(uid, exc.text, code=exc.code, warnings=warnings), "denied")
        except _Overran:
            log.error(
                "Webhook handler took longer than its timeout; the apiserver applied the failurePolicy",
                extra={"kv": {**pairs, "timeoutSeconds": hook.timeout, "failurePolicy": hook.failure_policy}},
            )
            message = f"webhook {hook.name} did not answer within its timeout of {hook.timeout} s"
            return self._reply(deny(uid, message, code=500), "timeout")
        except Exception:
            log.exception("Webhook handler raised; the request is denied", extra={"kv": pairs})
            return self._reply(deny(uid, _failed(hook), code=500), "error")
        seconds = round(time.monotonic() - started, 4)
        if hook.kind == "validator":
            extra = _warnings(result)
            if extra is None:
                log.error(
                    "Validator returned something other than None, a warning string or a list of them; the request is denied",
                    extra={"kv": {**pairs, "returned": type(result).__name__}},
                )
                return self._reply(deny(uid, _failed(hook), code=500), "error")
            logger.debug("Allowed", seconds=seconds, dryRun=review.dry_run, warnings=len(warnings) + len(extra))
            return self._reply(allow(uid, warnings=[*warnings, *extra]), "allowed")
        # mutator
        if result is not None and not isinstance(result, dict):
            log.error(
                "Mutator returned something other than None or an object; the request is denied",
                extra={"kv": {**pairs, "returned": type(result).__name__}},
            )
            return self._reply(deny(uid, _failed(hook), code=500), "error")
        mutated = result if result is not None else obj
        patch = diff(review.obj, mutated) if review.obj is not None and mutated is not None else []
        logger.debug("Allowed", seconds=seconds, dryRun=review.dry_run, patchOps=len(patch))
        return self._reply(allow(uid, patch=patch, warnings=warnings), "allowed")

    async def _convert(self, hook: Webhook, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            review = parse_conversion(body)
        except BadReview as exc:
            return self._bad_request(hook, request, exc)
        desired = review.desired_api_version
        logger = ReconcileLogger(logging.getLogger(f"declop.webhook.{hook.name}"), {"webhook": hook.name, "uid": review.uid, "desiredAPIVersion": desired})
        deadline = time.monotonic() + CONVERSION_TIMEOUT
        out: list[dict[str, Any]] = []
        for original in review.objects:
            if original.get("apiVersion") == desired:
                out.append(original)
                continue
            obj = clone(original)
            what = f"{describe(original)} from {original.get('apiVersion')} to {desired}"
            try:
                result = await self._call(
                    hook, hook.arguments({"obj": obj, "desired_api_version": desired, "logger": logger}),
                    max(deadline - time.monotonic(), 0.001),
                )
                if result is not None and not isinstance(result, dict):
                    raise TypeError(f"the converter returned {type(result).__name__}, not an object or None")
            except Rejected as exc:
                logger.info("Conversion refused", object=describe(original), reason=exc.text)
                return self._reply(failed(review.uid, f"converting {what}: {exc.text}"), "denied")
            except _Overran:
                log.error(
                    "Converter took longer than the conversion timeout",
                    extra={"kv": {"webhook": hook.name, "timeoutSeconds": CONVERSION_TIMEOUT, "object": describe(original)}},
                )
                return self._reply(failed(review.uid, f"converting {what}: webhook {hook.name} did not answer within {CONVERSION_TIMEOUT} s"), "timeout")
            except Exception as exc:
                log.exception("Converter raised", extra={"kv": {"webhook": hook.name, "object": describe(original), "desiredAPIVersion": desired}})
                return self._reply(
                    failed(review.uid, f"converting {what} failed: webhook {hook.name} raised {type(exc).__name__}; the operator's log has the details"),
                    "error",
                )
            out.append(finish(original, result if result is not None else obj, desired))
        return self._reply(converted(review.uid, out), "allowed")


def _failed(hook: Webhook) -> str:
    return f"webhook {hook.name} failed on this request; the operator's log has the details"


def _warnings(result: Any) -> list[str] | None:
    """A validator's return value as warnings; ``None`` when it is not None/str/list of str."""
    if result is None:
        return []
    if isinstance(result, str):
        return [result]
    if isinstance(result, (list, tuple)) and all(isinstance(w, str) for w in result):
        return list(result)
    return None


