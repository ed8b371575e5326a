"""Webhook server: answers the apiserver's AdmissionReviews and ConversionReviews over HTTPS.

One aiohttp server on the manager's loop, on its own port, one path per webhook
(``/validate/<name>``, ``/mutate/<name>``, ``/convert/<name>``; see
:attr:`declop.webhooks.declaration.Webhook.path`). Plain handlers run in the manager's thread pool,
``async def`` ones on the loop.

What each answer is (docs/webhooks.md):

=====================================  ===============================================================
the handler…                           the answer
=====================================  ===============================================================
is not called: ``obj`` fails the        denied (422), the message naming each field path and what is
validator's typed model (``obj: W``)   wrong (``spec.replicas: Input should be …``), never a value
is not called: ``field=``/``value=``/  allowed as sent (no patch, no warnings; no model check), logged
``when=`` exclude the request          at debug as "Skipped"
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
- **fail closed**: once a review's ``uid`` is read, every answer is a review: an object nested
  deeper than :data:`~declop.webhooks.decode.MAX_DEPTH` levels is denied (admission) or fails
  the conversion naming it, a body with more than
  :data:`~declop.webhooks.decode.MAX_CONTAINERS` objects and arrays is denied (413) before it
  is decoded, and any failure of declop's own work around the handler (copy, diff, encoding)
  is a denial — never an HTTP 500 that ``failurePolicy: Ignore`` would admit;
- the server is built by :func:`declop.serving.http.serve`: bodies up to
  :data:`ADMISSION_MAX_BYTES` (admission) and :data:`CONVERSION_MAX_BYTES` (conversion),
  uncompressed, within the header, body and idle timeouts, at most :data:`MAX_IN_FLIGHT`
  requests and :data:`MAX_CONNECTIONS` connections at once (docs/webhooks.md, "Limits");
- a body above :data:`OFFLOAD_BYTES` is parsed, copied, diffed, encoded and freed in one
  thread of its own, in pieces (:func:`~declop.webhooks.decode.loads`, :func:`~declop.webhooks.decode.dismantle`):
  the loop, which also renews the Lease and answers probes, is never held for long; smaller
  ones are cheaper on the loop. The cyclic collector is *not* paused for them (why:
  docs/webhooks.md, "Memory and the event loop");
- such bodies share :data:`BODY_BUDGET` bytes (:class:`declop.serving.http.Budget`): one of the
  largest size at a time, the others wait their turn unread, so sixteen at once cost the memory
  of about one; a validator gets the objects uncopied, a mutator a copy of ``object`` only;
- nothing from the object or the exception leaves the process except a
  :class:`~declop.webhooks.declaration.Rejected` message the handler wrote, and the field paths and
  messages of a typed validator's model (pydantic's, without the input values);
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

from declop.errors import InvalidObject
from declop.logs import ReconcileLogger
from declop.serving.http import MiB, Guard, Limits, Serving, body, serve
from declop.webhooks.admission import AdmissionRequest, BadReview, Oversized, allow, deny, parse_admission
from declop.webhooks.conversion import ConversionRequest, converted, describe, failed, finish, parse_conversion
from declop.webhooks.declaration import Rejected, Webhook
from declop.webhooks.decode import TooDeep, bounded_clone, check_depth, dismantle
from declop.webhooks.patch import diff

__all__ = [
    "ADMISSION_MAX_BYTES", "CONVERSION_MAX_BYTES", "CONVERSION_TIMEOUT", "MAX_CONNECTIONS",
    "BODY_BUDGET", "MAX_IN_FLIGHT", "OFFLOAD_BYTES", "WebhookServer",
]

log = logging.getLogger("declop.webhook")

#: seconds a converter may take per review (the apiserver waits 30 s for a conversion webhook)
CONVERSION_TIMEOUT = 30

#: an AdmissionReview carries the object and, on UPDATE, the old one: each at most the
#: apiserver's request body limit (3 MiB, k8s.io/apiserver MaxRequestBodyBytes), plus the review
ADMISSION_MAX_BYTES = 7 * MiB
#: a ConversionReview of a list carries every object of it that needs converting: today's 8 MiB
CONVERSION_MAX_BYTES = 8 * MiB
#: requests answered at once (more get 429: the apiserver then applies the failurePolicy)
MAX_IN_FLIGHT = 64
#: connections open at once (the apiserver keeps a few per replica)
MAX_CONNECTIONS = 128
#: bodies above this are decoded, copied, diffed and encoded off the loop
OFFLOAD_BYTES = 64 * 1024
#: bytes of bodies above OFFLOAD_BYTES read or being answered at once: one request of the
#: largest size and a few smaller ones; the others wait their turn unread
BODY_BUDGET = 8 * MiB


#: answers one review body: (hook, request, body, trees to free after) → the response
_Answer = Callable[[Webhook, web.Request, bytes, list[Any]], Awaitable[web.Response]]


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
        max_request_bytes: int | None = None,
    ) -> None:
        self.webhooks = list(webhooks)
        self._paths = {h.path for h in self.webhooks}
        self.port, self.host = port, host
        self.ssl_context = ssl_context
        self.executor = executor
        self._serving: Serving | None = None
        by_path = {
            h.path: max_request_bytes or (CONVERSION_MAX_BYTES if h.kind == "converter" else ADMISSION_MAX_BYTES)
            for h in self.webhooks
        }
        self.guard = Guard(Limits(
            max_body=OFFLOAD_BYTES, max_body_by_path=by_path, header_timeout=10.0, body_timeout=30.0,
            idle_timeout=60.0, max_connections=MAX_CONNECTIONS, max_in_flight=MAX_IN_FLIGHT,
            body_budget=max([BODY_BUDGET, *by_path.values()]),
        ))
        self._decoder: concurrent.futures.ThreadPoolExecutor | None = None
        #: large requests' trees being freed (stop() waits for them)
        self._freeing: set[asyncio.Future[None]] = set()
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
        app = self.guard.application(outer=[self._observe])
        for hook in self.webhooks:
            answer = self._convert_body if hook.kind == "converter" else self._admit_body
            app.router.add_post(hook.path, functools.partial(self._handle, answer, hook))
        return app

    async def start(self) -> None:
        self._serving = await serve(self.app(), self.guard, self.host, self.port, self.ssl_context)
        self.port = self._serving.port
        log.info(
            "Serving webhooks",
            extra={"kv": {"port": self.port, "paths": [h.path for h in self.webhooks]}},
        )

    async def stop(self) -> None:
        if self._serving is not None:
            await self._serving.stop()
            self._serving = None
        if self._freeing:
            await asyncio.wait(set(self._freeing))
        if self._decoder is not None:
            self._decoder.shutdown(wait=False, cancel_futures=True)
            self._decoder = None

    async def _work(self, big: bool, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``: in the decoding thread for a large body, else here on the loop.

        One thread, so two large bodies never hold the interpreter at once."""
        if not big:
            return fn(*args)
        if self._decoder is None:
            self._decoder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="declop-webhook-decode")
        return await asyncio.get_running_loop().run_in_executor(self._decoder, functools.partial(fn, *args))

    # -- answers -------------------------------------------------------------------------------
    def _count(self, outcome: str) -> None:
        self.answers[outcome] = self.answers.get(outcome, 0) + 1

    def _reply(self, review: dict[str, Any], outcome: str) -> web.Response:
        self._count(outcome)
        return web.Response(body=_encode(review), content_type="application/json")

    async def _answer(self, review: dict[str, Any], outcome: str, big: bool) -> web.Response:
        """:meth:`_reply`, encoded off the loop for a large request (its answer may be large)."""
        encoded = await self._work(big, _encode, review)
        self._count(outcome)
        return web.Response(body=encoded, content_type="application/json")

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

    async def _handle(self, answer: _Answer, hook: Webhook, request: web.Request) -> web.Response:
        """Read the body and ``answer`` it; a large body's trees are freed after, off the loop."""
        data = await body(request)
        if len(data) <= OFFLOAD_BYTES:
            return await answer(hook, request, data, [])
        trees: list[Any] = []
        try:
            return await answer(hook, request, data, trees)
        finally:  # answer's frame is gone: ``trees`` holds declop's last references
            self._free(trees)

    async def _admit_body(self, hook: Webhook, request: web.Request, data: bytes, trees: list[Any]) -> web.Response:
        """Answer one AdmissionReview; a large one's trees go into ``trees`` (to :meth:`_free`)."""
        big = len(data) > OFFLOAD_BYTES
        try:
            review: AdmissionRequest = await self._work(big, parse_admission, data)
        except Oversized as exc:
            if exc.uid is None:
                return self._bad_request(hook, request, exc)
            log.warning("Denied a review too large to decode", extra={"kv": {"webhook": hook.name, "uid": exc.uid, "error": str(exc)}})
            return self._reply(deny(exc.uid, f"webhook {hook.name}: {exc}", code=413), "denied")
        except BadReview as exc:
            return self._bad_request(hook, request, exc)
        if big:
            trees += (review.obj, review.old_obj)
        try:
            return await self._admit_review(hook, review, big, trees)
        except Exception as exc:  # declop's own work failed: deny, never a 500 that Ignore admits
            log.exception("Webhook request failed outside the handler; the request is denied", extra={"kv": {"webhook": hook.name, "uid": review.uid}})
            message = f"webhook {hook.name} could not process this request ({type(exc).__name__}); the operator's log has the details"
            return self._reply(deny(review.uid, message, code=500), "error")

    def _free(self, trees: list[Any]) -> None:
        """Free a large request's trees in the decoding thread, in small steps (:meth:`stop`
        waits for it)."""
        if self._decoder is None:
            trees.clear()
            return
        freeing = asyncio.wrap_future(self._decoder.submit(dismantle, trees))
        self._freeing.add(freeing)
        freeing.add_done_callback(self._freeing.discard)

    async def _admit_review(self, hook: Webhook, review: AdmissionRequest, big: bool, trees: list[Any]) -> web.Response:
        uid = review.uid
        pairs = {"webhook": hook.name, "operation": review.operation, "namespace": review.namespace, "name": review.name, "uid": uid}
        logger = ReconcileLogger(logging.getLogger(f"declop.webhook.{hook.name}"), pairs)
        warnings: list[str] = []
        try:
            obj, old_obj, user_info = await self._work(big, _copies, review, hook.kind == "mutator")
        except TooDeep as exc:
            logger.info("Denied", reason=str(exc))
            return self._reply(deny(uid, f"webhook {hook.name}: {exc}", code=400), "denied")
        available = {
            "obj": obj,
            "old_obj": old_obj,
            "operation": review.operation,
            "user_info": user_info,
            "dry_run": review.dry_run,
            "subresource": review.subresource,
            "logger": logger,
            "request_uid": uid,
            "warnings": warnings,
        }
        try:
            selected = hook.selects(available)  # True at once without filters
        except Exception:
            log.exception("Webhook filter (value= or when=) raised; the request is denied", extra={"kv": pairs})
            return self._reply(deny(uid, _failed(hook), code=500), "error")
        if not selected:  # excluded by field=/value=/when=: allowed as sent, the handler is not called
            logger.debug("Skipped", reason="filters", dryRun=review.dry_run)
            return self._reply(allow(uid), "allowed")
        before: Any = None  # a typed mutator's model, as JSON, before the call
        if hook.model is not None and obj is not None:
            from declop.typed.view import view  # pydantic: only for a typed validator or mutator
            from declop.webhooks.typed import snapshot

            try:
                available["obj"] = view(hook.model, obj)
                before = snapshot(available["obj"]) if hook.kind == "mutator" else None
            except InvalidObject as exc:
                logger.info("Denied", reason="; ".join(exc.problems), dryRun=review.dry_run)
                return self._reply(deny(uid, "; ".join(exc.problems), code=422), "denied")
        started = time.monotonic()
        try:
            result = await self._call(hook, hook.arguments(available), hook.timeout)
        except Rejected as exc:
            logger.info("Denied", reason=exc.text, dryRun=review.dry_run)
            return self._reply(deny(uid, exc.text, code=exc.code, warnings=warnings), "denied")
        except _Overran:  # a late answer can still beat the apiserver's timeout: give the policy's outcome
            log.error(
                "Webhook handler took longer than its timeout; the failurePolicy applies",
                extra={"kv": {**pairs, "timeoutSeconds": hook.timeout, "failurePolicy": hook.failure_policy}},
            )
            message = f"webhook {hook.name} did not answer within its timeout of {hook.timeout} s"
            if hook.failure_policy == "Ignore":
                return self._reply(allow(uid, warnings=[f"{message}; admitted (failurePolicy Ignore)"]), "timeout")
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
        if before is not None:
            from declop.webhooks.typed import mutated as typed_mutated

            result = await self._work(big, typed_mutated, obj, before, available["obj"], result)
            result = result if result is not None else _WRONG
        if result is not None and not isinstance(result, dict):
            log.error(
                "Mutator returned something other than None or an object; the request is denied",
                extra={"kv": {**pairs, "returned": type(result).__name__}},
            )
            return self._reply(deny(uid, _failed(hook), code=500), "error")
        mutated = result if result is not None else obj
        if big:
            trees += (obj, mutated)
        patch = await self._work(big, diff, review.obj, mutated) if review.obj is not None and mutated is not None else []
        logger.debug("Allowed", seconds=seconds, dryRun=review.dry_run, patchOps=len(patch))
        return await self._answer(allow(uid, patch=patch, warnings=warnings), "allowed", big)

    async def _convert_body(self, hook: Webhook, request: web.Request, data: bytes, trees: list[Any]) -> web.Response:
        big = len(data) > OFFLOAD_BYTES
        try:
            review: ConversionRequest = await self._work(big, parse_conversion, data)
        except Oversized as exc:
            if exc.uid is None:
                return self._bad_request(hook, request, exc)
            log.warning("Refused a ConversionReview too large to decode", extra={"kv": {"webhook": hook.name, "uid": exc.uid, "error": str(exc)}})
            return self._reply(failed(exc.uid, f"webhook {hook.name}: {exc}"), "denied")
        except BadReview as exc:
            return self._bad_request(hook, request, exc)
        if big:
            trees.append(review.objects)
        try:
            return await self._convert_review(hook, review, big, trees)
        except Exception as exc:  # declop's own work failed: a failed conversion, never a 500
            log.exception("Conversion request failed outside the converter", extra={"kv": {"webhook": hook.name, "uid": review.uid}})
            message = f"webhook {hook.name} could not process this ConversionReview ({type(exc).__name__}); the operator's log has the details"
            return self._reply(failed(review.uid, message), "error")

    async def _convert_review(self, hook: Webhook, review: ConversionRequest, big: bool, trees: list[Any]) -> web.Response:
        desired = review.desired_api_version
        deep = await self._work(big, _too_deep, review.objects)
        if deep is not None:
            original, exc = deep
            log.warning("Conversion refused: object too deep", extra={"kv": {"webhook": hook.name, "object": describe(original), "limit": exc.limit}})
            return self._reply(failed(review.uid, f"converting {describe(original)} to {desired}: {exc}"), "denied")
        copies = await self._work(big, _copies_to_convert, review.objects, desired)
        out: list[dict[str, Any]] = []
        if big:
            trees += (copies, out)
        logger = ReconcileLogger(logging.getLogger(f"declop.webhook.{hook.name}"), {"webhook": hook.name, "uid": review.uid, "desiredAPIVersion": desired})
        deadline = time.monotonic() + CONVERSION_TIMEOUT
        for original, obj in zip(review.objects, copies):
            if obj is None:
                out.append(original)
                continue
            what = f"{describe(original)} from {original.get('apiVersion')} to {desired}"
            given: Any = obj
            if hook.model is not None:  # a typed converter: obj as its version's model
                from declop.webhooks.typed import converted as typed_converted, source_view

                try:
                    given = source_view(hook.model, obj)
                except (InvalidObject, ValueError) as exc:  # it fails its model, or has none (NoModel)
                    reason = "; ".join(exc.problems) if isinstance(exc, InvalidObject) else str(exc)
                    logger.info("Conversion refused", object=describe(original), reason=reason)
                    return self._reply(failed(review.uid, f"converting {what}: {reason}"), "denied")
            try:
                result = await self._call(
                    hook, hook.arguments({"obj": given, "desired_api_version": desired, "logger": logger}),
                    max(deadline - time.monotonic(), 0.001),
                )
                if hook.model is not None:
                    result = typed_converted(given, result)
                    result = _WRONG if result is None else result
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
        return await self._answer(converted(review.uid, out), "allowed", big)


#: what a typed handler's unusable answer becomes: refused like an untyped one's
_WRONG = object()


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


def _encode(review: dict[str, Any]) -> bytes:
    return json.dumps(review, separators=(",", ":")).encode()


def _copies(review: AdmissionRequest, mutator: bool) -> tuple[Any, Any, dict[str, Any]]:
    """What the handler gets: the object (a copy for a mutator: the original is diffed against
    it), the old object and the user, each checked to nest at most MAX_DEPTH; :class:`TooDeep`.

    A validator's answer does not depend on what it does to them, so it gets them uncopied."""
    obj = review.obj
    if obj is not None:
        if mutator:
            obj = bounded_clone(obj)
        else:
            check_depth(obj)
    if review.old_obj is not None:
        check_depth(review.old_obj)
    check_depth(review.user_info)
    return obj, review.old_obj, review.user_info


def _too_deep(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], TooDeep] | None:
    """The first object nested too deep, with the error naming the limit; None when none is."""
    for obj in objects:
        try:
            check_depth(obj)
        except TooDeep as exc:
            return obj, exc
    return None


def _copies_to_convert(objects: list[dict[str, Any]], desired: str) -> list[dict[str, Any] | None]:
    """A copy of each object to convert (None for those already at ``desired``)."""
    return [None if o.get("apiVersion") == desired else bounded_clone(o) for o in objects]
