"""A decorator call: the options it forwards, and the mistakes it refuses with a hint.

The reconciler decorators take ``**options`` and forward them to the dataclass that names,
defaults and checks them (:class:`~declop.registry.options.ReconcilerOptions`).
:func:`keywords_of` and :func:`method_keywords_of` give such a decorator the dataclass's
keywords as its signature, twice over: statically (a ``ParamSpec`` captured from the dataclass,
so type checkers and IDEs see and check every option) and at run time (``__signature__``, so
``help()`` and ``inspect.signature`` show them).

Invariants:
- an extra positional argument (Kopf's ``"group", "version", "plural"``) or an unknown option is
  a one-line :class:`~declop.errors.RegistrationError` (:func:`check_call`) naming the one
  string or the closest option meant, never Python's bare ``TypeError``;
- the options of a decorator are listed in one order everywhere: its signature, the "the
  options are ..." hint.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Concatenate, Mapping, ParamSpec, Protocol, Sequence, TypeVar

from declop.errors import RegistrationError
from declop.hints import KOPF_OPTIONS, did_you_mean, resource_in_parts

if TYPE_CHECKING:
    from declop.registry.options import ResourceLike

__all__ = ["Decorator", "check_call", "keywords_of", "method_keywords_of"]

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")


class Decorator(Protocol):
    """What a decorator factory returns: it records the function and returns it unchanged."""

    def __call__(self, fn: F, /) -> F: ...


def keywords_of(
    options: Callable[P, object],
) -> Callable[[Callable[..., T]], Callable[Concatenate[ResourceLike, P], T]]:
    """Type a ``(resource, *parts, **options)`` function as taking ``options``' keywords."""

    def apply(fn: Callable[..., T]) -> Callable[Concatenate[ResourceLike, P], T]:
        _sign(fn, options)
        return fn

    return apply


def method_keywords_of(
    options: Callable[P, object],
) -> Callable[[Callable[..., T]], Callable[Concatenate[S, ResourceLike, P], T]]:
    """:func:`keywords_of` for a method: ``(self, resource, *parts, **options)``."""

    def apply(fn: Callable[..., T]) -> Callable[Concatenate[S, ResourceLike, P], T]:
        _sign(fn, options)
        return fn

    return apply


def _sign(fn: Callable[..., Any], options: Callable[..., object]) -> None:
    """``fn.__signature__``: its own parameters, with ``**options`` replaced by ``options``'
    keyword-only parameters (names, defaults and annotations as the dataclass declares them)."""
    own = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(options).parameters.values()]
    fn.__signature__ = inspect.Signature([*own, *keywords], return_annotation=inspect.signature(fn).return_annotation)  # type: ignore[attr-defined]


def check_call(decorator: str, positional: tuple[Any, ...], given: Mapping[str, Any], options: Sequence[str]) -> None:
    """Refuse extra positional arguments and any keyword of ``given`` not among ``options``
    with a hint instead of Python's bare ``TypeError`` (which says neither what was meant nor
    what to write)."""
    if len(positional) > 1:
        shown = ", ".join(_short(p) for p in positional)
        raise RegistrationError(f"@{decorator}({shown}): {resource_in_parts(positional)}")
    for option in given:
        if option in options:
            continue
        # an exact Kopf option first: Kopf's field= is not declop's fields= (a field selector)
        hint = KOPF_OPTIONS.get(option) or did_you_mean(option, options) or f"the options are {', '.join(options)}"
        raise RegistrationError(f"@{decorator} got an unknown option {option}=: {hint}")


def _short(value: Any) -> str:
    """A decorator argument as it was written in the source: short strings quoted, else the type."""
    if isinstance(value, str) and len(value) <= 60:
        return repr(value)
    return f"<{type(value).__name__}>"
