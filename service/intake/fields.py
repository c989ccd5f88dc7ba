"""The declaration of a request field, and what is derived from it: the machinery under
:mod:`~genaug.service.intake.schemas`' request classes.

A request field declares, in its ``Annotated[...]``, its type, default and description, one
:class:`Bound` (numbers, names of settings, or functions of the app's :class:`Limits`) and one
:class:`Fix` (the hint a 422 gives). From these :func:`bounded_model` derives the per-app model
(bounds resolved, choice lists as enums, floats finite) and :func:`declaration` reads the fix
back for the 422 hints; :class:`Body` is every request body's base (strict, unknown fields
refused, JSON numbers read as JSON Schema reads them); :data:`SeedValue` is a seed field that
also takes its decimal string. The fixed limits a :class:`Fix` may name (``{MAX_GUIDANCE:g}``)
live here too, so a template and its numbers are one piece.

Example::

    class Steps(Body):
        steps: Annotated[int | None, Field(description="Denoising steps."),
                         Bound(ge=1, le="max_steps"),
                         Fix("use 1 to max_steps {max_steps}, or set GENAUG_MAX_STEPS")] = None

    model = bounded_model(Steps, Limits(Settings(max_steps=50)))
    declaration(Steps, "steps")[1].render(Settings(max_steps=50))  # 'use 1 to max_steps 50, ...'
"""

from __future__ import annotations

import functools
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..batching.items import SCHEDULERS
from ..settings import Settings

M = TypeVar("M", bound=BaseModel)

# The fixed limits (the ones no setting moves): the request classes bound their fields with
# them and a Fix template may name them.
SEED_MAX = 2**63 - 1
#: The shortest ``timeout_s`` a request may set: a shorter deadline could never be met.
MIN_TIMEOUT_S = 0.5
MAX_GUIDANCE = 50.0
MAX_ADAPTER_SCALE = 4.0
#: The largest need one label may be given (only proportions count; this bounds the numbers).
MAX_NEED = 1e6
#: The most seeds one verdict may name (a page of the pool page is at most this many images).
MAX_VERDICT_SEEDS = 500
def _numeric_kind(annotation: Any) -> str | None:
    """``"int"`` or ``"float"`` for a (possibly optional) numeric field annotation."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _numeric_kind(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        kinds = {_numeric_kind(a) for a in typing.get_args(annotation)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    return None


def _int_list(annotation: Any) -> bool:
    """Whether a (possibly optional) field annotation is a list of integers."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _int_list(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_int_list(a) for a in typing.get_args(annotation))
    return origin is list and _numeric_kind(typing.get_args(annotation)[0]) == "int"


@functools.cache
def _numeric_fields(
    cls: type[BaseModel],
) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    ints, floats, int_lists = set(), set(), set()
    for name, info in cls.model_fields.items():
        kind = _numeric_kind(info.annotation)
        if kind == "int":
            ints.add(name)
        elif kind == "float":
            floats.add(name)
        elif _int_list(info.annotation):
            int_lists.add(name)
    return frozenset(ints), frozenset(floats), frozenset(int_lists)


class Body(BaseModel):
    """Base of every request body: strict types, unknown fields refused, JSON numbers as
    JSON Schema reads them (an integral ``4.0`` is an integer, ``4`` is a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ints, floats, int_lists = _numeric_fields(cls)
        out = dict(data)
        for name in ints & out.keys():
            value = out[name]
            if isinstance(value, float) and value.is_integer():
                out[name] = int(value)
        for name in int_lists & out.keys():
            value = out[name]
            if isinstance(value, list):
                out[name] = [int(v) if isinstance(v, float) and v.is_integer() else v
                             for v in value]
        for name in floats & out.keys():
            value = out[name]
            if isinstance(value, int) and not isinstance(value, bool):
                out[name] = float(value)
        return out


@dataclass(frozen=True)
class Limits:
    """What a bound may depend on: the app's settings, the most images one request of the
    route makes, and the app's choice lists (``schedulers``, ``adapters``, a recipe's
    ``labels``)."""

    settings: Settings
    images: int = 1
    choices: Mapping[str, Sequence[str]] = dataclass_field(default_factory=dict)

    def resolve(self, value: Limit) -> Any:
        if isinstance(value, str):
            return getattr(self.settings, value)
        if callable(value):
            return value(self)
        return value


#: A bound's value: a number, the name of a setting (``"max_steps"``), or a function of the
#: app's :class:`Limits`.
Limit = int | float | str | Callable[[Limits], float]


@dataclass(frozen=True)
class Bound:
    """What a request field admits, as a pydantic ``Field`` constraint each (resolved per app
    by :class:`Limits`), plus:

    - ``one_of``: the field's ``str`` becomes an enum of that choice list of the app;
    - ``absent``: when the choice list ``needs`` (default ``one_of``) is empty, the field
      admits only null, with this description;
    - ``null=False``: the field is left out to not give it, null is refused;
    - ``check``: a function of the app's :class:`Limits` giving the field's own validator
      (value in, value out; :class:`Refused` with the whole message out). The field's other
      constraints are then the served schema's only, never checked apart, so a value gets
      the check's one answer (``notify_url``: the reason and the allowed hosts, not a
      regular expression).

    ``Bound()`` with nothing is for a field whose type is closed (a ``Literal``).
    """

    ge: Limit | None = None
    gt: Limit | None = None
    le: Limit | None = None
    multiple_of: Limit | None = None
    min_length: Limit | None = None
    max_length: Limit | None = None
    pattern: str | Callable[[Limits], str] | None = None
    check: Callable[[Limits], Callable[[Any], Any]] | None = None
    one_of: str | None = None
    needs: str | None = None
    absent: str | None = None
    null: bool = True

    def constraints(self, limits: Limits) -> dict[str, Any]:
        """The pydantic ``Field`` constraints with this app's numbers."""
        names = ("ge", "gt", "le", "multiple_of", "min_length", "max_length")
        out = {name: limits.resolve(getattr(self, name)) for name in names
               if getattr(self, name) is not None}
        if self.pattern is not None:
            out["pattern"] = self.pattern(limits) if callable(self.pattern) else self.pattern
        return out


@dataclass(frozen=True)
class Fix:
    """The fix a 422 names for a field: a ``str.format`` template over the settings' names
    (``{max_steps}``) and this module's limits (``{MAX_GUIDANCE:g}``); ``{{name}}`` is the
    recipe's name in the URL. A function of the settings where the fix depends on more than
    numbers (webhooks on or off)."""

    text: str | Callable[[Settings], str]

    def render(self, settings: Settings) -> str:
        if callable(self.text):
            return self.text(settings)
        return self.text.format_map(_Names(settings))


class Refused(ValueError):
    """Raised by a field's ``check`` (:class:`Bound`): the message is the whole answer (the
    value, the rule it broke, the fix), given as it is."""


#: pydantic's error type of a :class:`Refused` value; the intake prints its message alone.
REFUSED = "refused"


def _checked(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def validate(value: Any) -> Any:
        try:
            return check(value)
        except Refused as exc:
            raise PydanticCustomError(REFUSED, str(exc)) from None
    return validate


class _Names(dict[str, Any]):
    def __init__(self, settings: Settings) -> None:
        super().__init__(MIN_TIMEOUT_S=MIN_TIMEOUT_S, MAX_GUIDANCE=MAX_GUIDANCE,
                         MAX_ADAPTER_SCALE=MAX_ADAPTER_SCALE, MAX_NEED=MAX_NEED,
                         MAX_VERDICT_SEEDS=MAX_VERDICT_SEEDS,
                         schedulers=", ".join(SCHEDULERS))
        self.settings = settings

    def __missing__(self, key: str) -> Any:
        return getattr(self.settings, key)


def _decimal_up_to(limit: int) -> str:
    """A regular expression of the decimal numbers 0 to ``limit``, without sign or leading
    zeros (one way to write each number, as ``str(int)`` writes it)."""
    text = str(limit)
    shorter = ["0"] if len(text) == 1 else ["0", f"[1-9][0-9]{{0,{len(text) - 2}}}"]
    longest = []  # as long as ``limit``: its first i digits, a smaller one, then any
    for i, digit in enumerate(text):
        low, rest = (1 if i == 0 else 0), len(text) - i - 1
        if int(digit) > low:
            longest.append(text[:i] + f"[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}"
                                                                    if rest else ""))
    return "^(?:" + "|".join([*shorter, *longest, text]) + ")$"


#: A seed written as text: JSON numbers above 2**53 lose digits in JavaScript, so a page
#: sends the seed as the decimal string the listing gives (``seed_str``).
SEED_TEXT_PATTERN = _decimal_up_to(SEED_MAX)
_SEED_TEXT = re.compile(SEED_TEXT_PATTERN)


def _seed_from_text(value: Any) -> Any:
    """A decimal seed string as its integer; anything else as it came (the integer check
    follows). The pattern rules out what ``int()`` would also take (signs, spaces, ``_``)."""
    if not isinstance(value, str):
        return value
    if _SEED_TEXT.fullmatch(value) is None:  # not match: "$" passes a final newline
        raise PydanticCustomError(
            "seed_text", f"not a seed: a seed is an integer from 0 to {SEED_MAX} (2**63 - 1), "
            "or that integer as a decimal string without sign, spaces or leading zeros")
    return int(value)


#: One seed of a verdict: an integer, or the same as a decimal string (what a browser can
#: carry without loss); the schema says both.
SeedValue = Annotated[
    int, BeforeValidator(_seed_from_text), Field(ge=0, le=SEED_MAX),
    WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
        {"type": "string", "pattern": SEED_TEXT_PATTERN,
         "description": "The seed as a decimal string (JavaScript loses digits of numbers "
                        "above 2**53)."}]}),
]


def _choice(names: Sequence[str]) -> Any:
    return Literal[tuple(names)]  # a Literal of runtime values: an enum in the schema


def _swap_str(annotation: Any, choice: Any) -> Any:
    """``annotation`` with every ``str`` in it (inside unions, lists, dict keys, Annotated)
    replaced by ``choice``."""
    if annotation is str:
        return choice
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[(_swap_str(args[0], choice), *annotation.__metadata__)]
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, (_swap_str(a, choice) for a in args))
    if origin in (list, dict):
        return origin[tuple(_swap_str(a, choice) for a in args)]
    return annotation


def _non_null(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return functools.reduce(operator.or_, args)
    return annotation


def declaration(model: type[BaseModel], name: str) -> tuple[Bound, Fix]:
    """The :class:`Bound` and :class:`Fix` declared on ``model``'s field ``name``.

    Raises:
        TypeError: the field lacks one (every request field declares both).
    """
    metadata = model.model_fields[name].metadata
    bounds = [m for m in metadata if isinstance(m, Bound)]
    fixes = [m for m in metadata if isinstance(m, Fix)]
    if len(bounds) != 1 or len(fixes) != 1:
        raise TypeError(
            f"{model.__name__}.{name} must declare one Bound and one Fix (found "
            f"{len(bounds)} and {len(fixes)}): write them in its Annotated[...] so that the "
            "served schema bounds it and a 422 says how to fix it")
    return bounds[0], fixes[0]


def _bounded_field(model: type[BaseModel], name: str, limits: Limits) -> tuple[Any, Any]:
    """``(annotation, Field(...))`` of field ``name`` with this app's bounds."""
    info = model.model_fields[name]
    bound, _ = declaration(model, name)
    annotation = info.annotation
    absent = (bound.absent is not None
              and not limits.choices.get(bound.needs or bound.one_of or ""))
    if absent and bound.check is None:
        return None, Field(default=None, description=bound.absent)
    if absent:  # the schema admits only null; a value still gets the check's own answer
        check = _checked(bound.check(limits))  # type: ignore[misc]
        return (Annotated[annotation, AfterValidator(lambda v: v if v is None else check(v)),
                          WithJsonSchema({"type": "null"})],
                Field(default=None, description=bound.absent))
    if bound.one_of is not None:
        annotation = _swap_str(annotation, _choice(limits.choices[bound.one_of]))
    if not bound.null:
        annotation = _non_null(annotation)
    constraints = bound.constraints(limits)
    if _numeric_kind(annotation) == "float":
        constraints["allow_inf_nan"] = False
    if bound.check is not None:  # the check decides; the constraints are the schema's words
        schema = {_JSON_NAMES.get(key, key): value for key, value in constraints.items()}
        return (Annotated[annotation, AfterValidator(_checked(bound.check(limits)))],
                Field(default=info.default, description=info.description,
                      json_schema_extra=schema))
    return annotation, Field(default=info.default, description=info.description, **constraints)


#: pydantic's constraint names as JSON Schema writes them.
_JSON_NAMES = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum",
               "multiple_of": "multipleOf", "min_length": "minLength",
               "max_length": "maxLength"}


def bounded_model(model: type[M], limits: Limits, *, name: str | None = None,
                  doc: str | None = None) -> type[M]:
    """``model`` with every field bounded for this app: a subclass of ``model``."""
    fields = {field: _bounded_field(model, field, limits) for field in model.model_fields}
    derived: type[M] = create_model(  # type: ignore[call-overload]
        name or model.__name__, __base__=model, __doc__=doc or model.__doc__, **fields)
    return derived
