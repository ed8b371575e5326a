"""Webhook: what ``@declop.validator``, ``@declop.mutator`` and ``@declop.converter`` declare.

A validator or mutator is called once per admission request the apiserver sends for its
resource; a converter once per object of a ``ConversionReview``. They are plain functions (or
``async def``) that declare the keyword arguments they want, like reconcilers:

* validators and mutators: ``obj``, ``old_obj``, ``operation``, ``user_info``, ``dry_run``,
  ``subresource``, ``logger``, ``request_uid``, ``warnings`` (a list to append warnings to);
* converters: ``obj``, ``desired_api_version``, ``logger``.

A validator returns ``None`` (allow), a warning string or a list of them (allow, with
warnings), or raises :class:`Rejected` (deny). A mutator changes the copy of ``obj`` it got in
place, or returns a new object; declop sends the JSON Patch between the two. A converter
changes ``obj`` in place or returns the converted object.

Invariants:
- the decorators return the function **unchanged** (callable in unit tests);
- a :class:`Webhook` is frozen; its ``name`` is a qualified name of three or more DNS labels
  (what the apiserver requires of a webhook name and shows in its errors), unique per kind;
- argument names are checked at registration: an unknown one without a default, or a
  defaulted one within a typo of a known one, is a :class:`~declop.errors.RegistrationError`
  with "did you mean";
- ``failure_policy`` is ``"Fail"`` or ``"Ignore"``, ``timeout`` 1–30 seconds (the apiserver's
  bounds), ``operations`` a non-empty subset of CREATE, UPDATE, DELETE, CONNECT;
- ``system_namespaces`` is ``True`` or ``False`` (default): only with ``True`` does a validator or
  mutator see requests in :data:`SYSTEM_NAMESPACES` (a converter has no namespace scope);
- ``subresources`` is empty (the main resource only, ``widgets``) or names subresources
  (``status``, ``scale``): then the rule matches ``widgets/status`` … and not the main resource;
  ``*`` matches ``widgets/*``: the main resource and every subresource (Kubernetes' matching,
  Kopf's meaning of ``"*"``);
- the filters (``field=``, ``value=``, ``when=``) are decided per request from the request
  alone (:meth:`Webhook.selects`): a request they exclude is allowed unchanged, without calling
  the handler.
"""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping

from declop.errors import DeclopError, RegistrationError
from declop.hints import did_you_mean
from declop.kube.labels import parse_selector

__all__ = [
    "ADMISSION_INJECTABLE",
    "ANY_VALUE",
    "CONVERSION_INJECTABLE",
    "OPERATIONS",
    "Rejected",
    "SYSTEM_NAMESPACES",
    "Webhook",
    "WebhookKind",
    "make_webhook",
]

WebhookKind = Literal["validator", "mutator", "converter"]

#: keyword arguments a validator or mutator may declare
ADMISSION_INJECTABLE = frozenset(
    {"obj", "old_obj", "operation", "user_info", "dry_run", "subresource", "logger", "request_uid", "warnings"}
)
#: keyword arguments a converter may declare
CONVERSION_INJECTABLE = frozenset({"obj", "desired_api_version", "logger"})

OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

#: namespaces a validator or mutator skips unless ``system_namespaces=True``: a ``Fail`` webhook
#: that is down must not block CoreDNS, the CNI or node heartbeats while the cluster recovers
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

_TYPO_CUTOFF = 0.8
_LABEL = re.compile(r"[^a-z0-9]+")
_SUBRESOURCE = re.compile(r"[a-z][a-z0-9-]{0,62}|\*")


class _AnyValue:
    def __repr__(self) -> str:
        return "ANY_VALUE"


#: ``value=`` not given: ``field=`` only asks that the field be present
ANY_VALUE: Any = _AnyValue()


class Rejected(DeclopError):
    """Raised by a validator (or mutator) to deny the request.

    ``message`` is what ``kubectl`` shows after ``admission webhook "<name>" denied the
    request:``; with ``field`` (``"spec.size"``) it reads ``spec.size: <message>``. ``code``
    is the HTTP status the apiserver answers with (default 403, as for any denial; 422 says
    "Invalid"). Never put secrets in it: it is returned to the caller.
    """

    def __init__(self, message: str, *, field: str | None = None, code: int = 403) -> None:
        if not isinstance(code, int) or not 400 <= code <= 599:
            raise ValueError(f"Rejected(code=...) must be an HTTP error status 400-599, got {code!r}")
        self.message = str(message)
        self.field = field
        self.code = code
        super().__init__(self.text)

    @property
    def text(self) -> str:
        """The message as the caller sees it: ``field: message`` when a field is named."""
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(frozen=True, slots=True)
class Webhook:
    """One validator, mutator or converter as declared by its decorator."""

    fn: Callable[..., Any]
    kind: WebhookKind
    #: the webhook's qualified name (``check-size.widgets.example.com``), shown by kubectl
    name: str
    #: the resource as written (``"widgets.example.com"``); resolved by discovery at start
    resource: str
    is_async: bool
    operations: tuple[str, ...] = ()
    failure_policy: str = "Fail"
    #: seconds the apiserver waits for an answer (also the budget the server gives the handler)
    timeout: int = 10
    #: an object label selector (canonical form), "" for every object
    labels: str = ""
    #: the injectable names the handler declares; None when it takes **kwargs (gets them all)
    wants: frozenset[str] | None = None
    #: also admit requests in :data:`SYSTEM_NAMESPACES` (validators and mutators; opt-in)
    system_namespaces: bool = False
    #: a validator's or mutator's typed model (``obj: Widget``): ``obj`` is validated first, and
    #: an object that fails is denied (422) with each field path, without calling the handler;
    #: a converter's: the tuple of version models ``obj`` names (``obj: WidgetV1 | WidgetV2``)
    model: Any = None
    #: subresources the rule matches (``("status",)``); empty: the main resource only
    subresources: tuple[str, ...] = ()
    #: ``field=`` as its path of keys (``("spec", "replicas")``); empty: no field filter
    field: tuple[str, ...] = ()
    #: ``value=``: the value the field must equal, or a callable of it; :data:`ANY_VALUE`: present
    value: Any = ANY_VALUE
    #: ``when=``: a callable of the injectable arguments it declares, decided per request
    when: Callable[..., Any] | None = None
    #: the names ``when`` declares (None: it takes **kwargs)
    when_wants: frozenset[str] | None = None

    @property
    def path(self) -> str:
        """The URL path the server answers this webhook on."""
        return f"/{_PATH_PREFIX[self.kind]}/{self.name}"

    def arguments(self, available: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for one call: only those the handler declares."""
        if self.wants is None:
            return dict(available)
        return {k: v for k, v in available.items() if k in self.wants}

    def selects(self, available: Mapping[str, Any]) -> bool:
        """Whether the filters let this request through to the handler (``True`` without
        filters). ``available`` is what the handler could get (``obj``, ``old_obj``, …).

        ``field=`` reads ``obj`` — the object as it will be stored (CREATE, UPDATE, CONNECT;
        for a ``scale`` request the ``Scale``) — and ``old_obj`` on DELETE, where there is no
        new object. The field is present when every key on its path is there and its value is
        not ``null``; with ``value=`` it must also equal the value (or the callable ``value(v)``
        must return true). Then ``when(...)`` must return true. Exceptions propagate (the
        server denies, as for a handler that raises)."""
        if self.field:
            obj = available.get("obj")
            found = _lookup(obj if obj is not None else available.get("old_obj"), self.field)
            if found is None:
                return False
            if self.value is not ANY_VALUE:
                if not (self.value(found) if callable(self.value) else found == self.value):
                    return False
        if self.when is not None:
            args = dict(available) if self.when_wants is None else {k: v for k, v in available.items() if k in self.when_wants}
            return bool(self.when(**args))
        return True


def _lookup(obj: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` (keys of nested objects) in ``obj``; ``None`` when absent."""
    for key in path:
        if not isinstance(obj, dict) or key not in obj:  # JSON objects are dicts (an ABC check costs more)
            return None
        obj = obj[key]
    return obj


_PATH_PREFIX: dict[str, str] = {"validator": "validate", "mutator": "mutate", "converter": "convert"}


def default_name(fn_name: str, resource: str) -> str:
    """``check_size`` on ``widgets.example.com`` → ``check-size.widgets.example.com``; a core
    resource (``configmaps``) gets ``.core`` so the name has the three labels required."""
    head = _LABEL.sub("-", fn_name.lower()).strip("-") or "webhook"
    tail = ".".join(_LABEL.sub("-", part.lower()).strip("-") for part in resource.split("."))
    name = f"{head[:63]}.{tail}"
    return name if name.count(".") >= 2 else f"{name}.core"


def _valid_name(name: str) -> bool:
    labels = name.split(".")
    return (
        len(labels) >= 3
        and len(name) <= 253
        and all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", part) for part in labels)
    )


def make_webhook(
    fn: Any,
    kind: WebhookKind,
    resource: str,
    *,
    name: str | None = None,
    operations: Iterable[str] = ("CREATE", "UPDATE"),
    failure_policy: str = "Fail",
    timeout: int = 10,
    labels: str | Mapping[str, str] | None = None,
    system_namespaces: bool = False,
    subresource: str | Iterable[str] | None = None,
    field: str | Iterable[str] | None = None,
    value: Any = ANY_VALUE,
    when: Callable[..., Any] | None = None,
) -> Webhook:
    """Check ``fn`` and the options for use as a ``kind`` webhook of ``resource``, and describe it.

    Raises:
        RegistrationError: one line naming the handler and what is wrong.
    """
    decorator = f"@declop.{kind}"
    if not callable(fn) or isinstance(fn, type):
        raise RegistrationError(f"{decorator} decorates a function, got {fn!r}")
    if not isinstance(resource, str) or not resource.strip():
        raise RegistrationError(f"{decorator}: resource must be a name like 'widgets.example.com', got {resource!r}")
    resource = resource.strip()
    fn_name = str(getattr(fn, "__name__", "") or "webhook")
    hook_name = name if name is not None else default_name(fn_name, resource)
    if not isinstance(hook_name, str) or not _valid_name(hook_name):
        raise RegistrationError(
            f"{decorator} {fn_name!r}: name={hook_name!r} is not a qualified name; use three or more "
            "lowercase DNS labels, e.g. 'check-size.widgets.example.com'"
        )
    if isinstance(operations, str):
        operations = (operations,)
    ops = tuple(str(o).upper() for o in operations)
    if kind != "converter":
        bad = [o for o in ops if o not in OPERATIONS]
        if not ops or bad:
            raise RegistrationError(
                f"{decorator} {hook_name!r}: operations must be some of {', '.join(OPERATIONS)}, got {list(operations)!r}"
            )
    if failure_policy not in ("Fail", "Ignore"):
        hint = did_you_mean(str(failure_policy), ("Fail", "Ignore")) or "use 'Fail' or 'Ignore'"
        raise RegistrationError(f"{decorator} {hook_name!r}: failure_policy={failure_policy!r}: {hint}")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 30:
        raise RegistrationError(
            f"{decorator} {hook_name!r}: timeout must be whole seconds from 1 to 30 (the apiserver's limit), got {timeout!r}"
        )
    if not isinstance(system_namespaces, bool):
        raise RegistrationError(
            f"{decorator} {hook_name!r}: system_namespaces must be True or False, got {system_namespaces!r}"
        )
    if system_namespaces and kind == "converter":
        raise RegistrationError(
            f"{decorator} {hook_name!r}: system_namespaces applies to validators and mutators; "
            "a conversion webhook converts objects of every namespace"
        )
    try:
        selector = str(parse_selector(labels)) if labels else ""
    except ValueError as exc:
        raise RegistrationError(f"{decorator} {hook_name!r}: labels=: {exc}") from None
    injectable = CONVERSION_INJECTABLE if kind == "converter" else ADMISSION_INJECTABLE
    subresources = _subresources(subresource, decorator, hook_name)
    path = _field_path(field, decorator, hook_name)
    if value is not ANY_VALUE and not path:
        raise RegistrationError(f"{decorator} {hook_name!r}: value= needs field=, the field it compares, e.g. field='spec.size', value=3")
    when_wants = None
    if when is not None:
        if not callable(when) or inspect.iscoroutinefunction(when):
            raise RegistrationError(
                f"{decorator} {hook_name!r}: when= must be a plain function (obj, old_obj, operation, ...) -> bool, "
                f"got {when!r}; it runs per request and must be cheap"
            )
        when_wants = _wanted(when, hook_name, f"{decorator} when=", ADMISSION_INJECTABLE)
    if kind == "converter" and (subresources or path or when is not None):
        raise RegistrationError(f"{decorator} {hook_name!r}: subresource=, field=, value= and when= apply to validators and mutators")
    return Webhook(
        fn=fn,
        kind=kind,
        name=hook_name,
        resource=resource,
        is_async=inspect.iscoroutinefunction(fn),
        operations=() if kind == "converter" else ops,
        failure_policy=failure_policy,
        timeout=timeout,
        labels=selector,
        wants=_wanted(fn, hook_name, decorator, injectable),
        system_namespaces=system_namespaces,
        subresources=subresources,
        field=path,
        value=value,
        when=when,
        when_wants=when_wants,
    )


def _subresources(given: str | Iterable[str] | None, decorator: str, name: str) -> tuple[str, ...]:
    """``subresource=`` as a tuple of subresource names; RegistrationError for anything else."""
    if given is None:
        return ()
    names = (given,) if isinstance(given, str) else tuple(given) if isinstance(given, (list, tuple, set, frozenset)) else None
    if not names or not all(isinstance(n, str) and _SUBRESOURCE.fullmatch(n) for n in names) or ("*" in names and len(names) > 1):
        raise RegistrationError(
            f"{decorator} {name!r}: subresource={given!r}: name subresources such as 'status' or 'scale' "
            "(a string or a list), or '*' for the main resource and all of them; leave it out for the main resource only"
        )
    return tuple(dict.fromkeys(names))


def _field_path(given: str | Iterable[str] | None, decorator: str, name: str) -> tuple[str, ...]:
    """``field=`` (``"spec.size"`` or ``["spec", "size"]``) as its keys; RegistrationError for anything else."""
    if given is None:
        return ()
    keys = given.split(".") if isinstance(given, str) else list(given) if isinstance(given, (list, tuple)) else None
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise RegistrationError(
            f"{decorator} {name!r}: field={given!r}: use a dotted path such as 'spec.size' "
            "(or a list of keys when a key holds a dot)"
        )
    return tuple(keys)


def _wanted(fn: Callable[..., Any], name: str, decorator: str, injectable: frozenset[str]) -> frozenset[str] | None:
    """The names ``fn`` declares, ``None`` with ``**kwargs``; refuses unknown or misspelt ones."""
    wants: set[str] = set()
    takes_all = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            takes_all = True
            continue
        if p.kind is p.VAR_POSITIONAL:
            continue
        if p.name in injectable:
            if p.kind is p.POSITIONAL_ONLY:
                raise RegistrationError(f"{decorator} {name!r}: {p.name!r} must not be positional-only; remove the '/'")
            wants.add(p.name)
            continue
        known = ", ".join(sorted(injectable))
        if p.default is p.empty:
            hint = did_you_mean(p.name, injectable)
            lead = f"{hint} " if hint else ""
            raise RegistrationError(
                f"{decorator} {name!r} takes an unknown argument {p.name!r}: {lead}declop passes only {known}"
            )
        close = difflib.get_close_matches(p.name, injectable, n=1, cutoff=_TYPO_CUTOFF)
        if close:
            raise RegistrationError(
                f"{decorator} {name!r} takes an unknown argument {p.name!r}, which would always keep its "
                f"default: did you mean {close[0]!r}? declop passes only {known}"
            )
    return None if takes_all else frozenset(wants)
