"""Typed request schemas for the dialects, and their validation errors in the project's words.

A dialect declares its request body as a strict pydantic model (:class:`StrictRequest`; nested
shapes as models or ``TypedDict``\\ s, which validate in pydantic-core and come out as the plain
dicts the chat template renders). :func:`validate_request` validates the decoded body and turns
the first :class:`~pydantic.ValidationError` into the same :class:`~dressage.errors.RequestError`
(message, ``param``, ``code``) the hand-written checks raised before: a dialect lists
:class:`Rule`\\ s for its nested fields; a top-level scalar gets the shared wording
(``'temperature' must be between 0.0 and 2.0, got 3``), its bounds read from the field's
``Field(ge=..., le=...)``. Cross-field checks (``top_logprobs`` needs ``logprobs``) stay in the
dialect, after validation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from dressage.errors import RequestError

M = TypeVar("M", bound=BaseModel)
INDEX = int
"""A :class:`Rule` pattern step matching any array index (filled into the message as ``{0}``, ``{1}``...)."""
PatternStep = str | type[int]


class UnionTag(str):
    """A :class:`Rule` pattern step naming a union's tag (``Tag("blocks")``, a role): in the error's
    location but not in the body, so never walked into."""


class StrictRequest(BaseModel):
    """A request body: strict JSON types (no ``"1"`` for 1, no ``true`` for 1), immutable.

    Unknown top-level fields are kept (``model_extra``): each dialect decides whether they are
    refused or recorded as ignored, as it did before the schemas.
    """

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")


@dataclass(frozen=True)
class Rule:
    """The error for every validation failure under ``pattern`` (field names and :data:`INDEX`).

    ``message`` and ``param`` are format strings: ``{0}``, ``{1}``... are the indices the pattern
    matched, ``{got!r}`` is the body's value at the pattern (None when absent). ``param`` defaults to
    the pattern's path (``messages[{0}].role``).
    """

    pattern: tuple[PatternStep, ...]
    message: str | Callable[[Sequence[int], object], RequestError]
    """A format string, or a function of the matched indices and the value that builds the error."""
    code: str = "invalid_value"
    param: str = ""
    types: frozenset[str] = frozenset()
    """Only these pydantic error types (all when empty)."""


_SCALAR_WORDING = {
    "float_type": ("'{name}' must be a number, got {got!r}", "invalid_type"),
    "finite_number": ("'{name}' must be a number, got {got!r}", "invalid_type"),
    "int_type": ("'{name}' must be an integer, got {got!r}", "invalid_type"),
    "bool_type": ("'{name}' must be a boolean", "invalid_type"),
    "string_type": ("'{name}' must be a string", "invalid_type"),
    "dict_type": ("'{name}' must be an object", "invalid_type"),
    "model_type": ("'{name}' must be an object", "invalid_type"),
}
_RANGE_ERRORS = frozenset({"greater_than_equal", "less_than_equal", "greater_than", "less_than"})


def _path(pattern: tuple[PatternStep, ...]) -> str:
    """A pattern as a ``param`` format string: ``("messages", INDEX, "role")`` -> ``messages[{0}].role``."""
    out, k = "", 0
    for step in pattern:
        if step is INDEX:
            out, k = out + f"[{{{k}}}]", k + 1
        elif not isinstance(step, UnionTag):
            out += f".{step}" if out else str(step)
    return out


def _match(rule: Rule, loc: tuple[int | str, ...]) -> list[int] | None:
    """The indices ``rule`` matched at the start of ``loc``, or None when it does not match."""
    if len(loc) < len(rule.pattern):
        return None
    indices = []
    for want, step in zip(rule.pattern, loc, strict=False):
        if want is INDEX and isinstance(step, int):
            indices.append(step)
        elif want != step:
            return None
    return indices


def _steps(loc: tuple[int | str, ...], pattern: tuple[PatternStep, ...]) -> list[int | str]:
    """The body's path of a ``loc`` that ``pattern`` matched: its steps less the union tags."""
    return [step for step, want in zip(loc, pattern, strict=False) if not isinstance(want, UnionTag)]


def _at(body: object, path: Sequence[int | str]) -> object:
    """The body's value at ``path`` (None when any step is absent)."""
    for step in path:
        if isinstance(body, dict) and isinstance(step, str):
            body = body.get(step)
        elif isinstance(body, list) and isinstance(step, int) and step < len(body):
            body = body[step]
        else:
            return None
    return body


def _bounds(model: type[BaseModel], name: str) -> tuple[object, object]:
    """The ``ge`` / ``le`` bounds declared on a top-level field."""
    lo = hi = None
    for meta in model.model_fields[name].metadata:
        if isinstance(meta, Ge):
            lo = meta.ge
        elif isinstance(meta, Le):
            hi = meta.le
    return lo, hi


def _top_level(model: type[BaseModel], error: ErrorDetails, got: object) -> RequestError:
    """The shared wording for a top-level field (its name quoted), or pydantic's own message."""
    name = str(error["loc"][0])
    if name in model.model_fields and error["type"] in _RANGE_ERRORS:
        lo, hi = _bounds(model, name)
        return RequestError(
            f"'{name}' must be between {lo} and {hi}, got {got}", param=name, code="invalid_value"
        )
    if error["type"] in _SCALAR_WORDING:
        message, code = _SCALAR_WORDING[error["type"]]
        return RequestError(message.format(name=name, got=got), param=name, code=code)
    return RequestError(f"'{name}': {error['msg']}", param=name, code="invalid_value")


def translate(
    model: type[BaseModel], error: ErrorDetails, body: object, rules: Sequence[Rule]
) -> RequestError:
    """One validation error as the :class:`RequestError` the dialect's clients know."""
    loc = tuple(error["loc"])
    for rule in rules:
        indices = _match(rule, loc)
        if indices is not None and (not rule.types or error["type"] in rule.types):
            got = _at(body, _steps(loc, rule.pattern))
            if not isinstance(rule.message, str):
                return rule.message(indices, got)
            param = (rule.param or _path(rule.pattern)).format(*indices, got=got)
            return RequestError(rule.message.format(*indices, got=got), param=param, code=rule.code)
    return _top_level(model, error, _at(body, loc[:1]))


def validate_request(model: type[M], body: dict[str, object], rules: Sequence[Rule] = ()) -> M:
    """``body`` as ``model``; its first problem as a :class:`RequestError` (see :func:`translate`)."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise translate(model, e.errors(include_url=False)[0], body, rules) from None
