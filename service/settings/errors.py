"""Invalid settings, said in one line each: the variable (or the flag) a value came from, the
value, and what is allowed.

A ``ValidationError`` of :class:`~genaug.service.settings.Settings` names pydantic's field
(``turbo_steps``) over five lines with a link; a person set ``GENAUG_TURBO_STEPS`` or passed
``--turbo-steps``. :func:`settings_refusal` renders it as the commands print it, one line per
error, and every command that builds Settings prints through it. What is allowed is read from
the field's declaration (its choices, its bounds), so it cannot drift from what is checked; a
rule between settings (a model validator) already says its own line, naming the variables,
and is rewritten to name the flags that were given. A secret's value is never printed.

Example::

    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for line in settings_refusal(exc, flags={"port": "--port"}):
            print(f"genaug serve: {line}", file=sys.stderr)
    # genaug serve: --port 99999 is not allowed: use a whole number from 0 to 65535
    # genaug serve: GENAUG_COMPILE=yes is not allowed: use one of off, unet or regional
"""

from __future__ import annotations

import re
import shlex
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

__all__ = ["settings_refusal", "variable"]


def variable(field: str) -> str:
    """The environment variable of a Settings field: ``turbo_steps`` -> ``GENAUG_TURBO_STEPS``."""
    return f"GENAUG_{field.upper()}"


def settings_refusal(exc: ValidationError, *,
                     flags: Mapping[str, str] | None = None) -> list[str]:
    """One line per error of ``exc`` (raised by ``Settings(...)``), in pydantic's order,
    without repeats. ``flags`` maps the fields given as command-line flags to the flag
    (``{"port": "--port"}``); the others are named by their ``GENAUG_*`` variable."""
    from . import Settings

    given = dict(flags or {})
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        line = _line(error, Settings.model_fields, given)
        if line not in lines:
            lines.append(line)
    return lines


def _line(error: Mapping[str, Any], fields: Mapping[str, FieldInfo],
          flags: Mapping[str, str]) -> str:
    loc = error.get("loc") or ()
    field = str(loc[0]) if loc else ""
    own = _own_message(error)
    if field not in fields:  # a rule between settings: its message names the variables
        return _with_flags(own or str(error.get("msg", "")), flags)
    info = fields[field]
    name = flags.get(field, variable(field))
    shown = "(its value is not shown)" if _secret(info.annotation) else _quoted(
        error.get("input"))
    where = f"{name} {shown}" if field in flags else f"{name}={shown}"
    if own is not None:  # a parser's or validator's line: it says the form expected
        said = _with_flags(own, flags)
        return said if name in said else f"{where}: {said}"
    allowed = _allowed(info)
    if allowed is None:
        return f"{where} is not allowed: {_lower_first(str(error.get('msg', '')))}"
    return f"{where} is not allowed: use {allowed}"


def _own_message(error: Mapping[str, Any]) -> str | None:
    """The text of a ``ValueError`` genaug's own validators raised (None for pydantic's own
    checks: types, choices, bounds)."""
    if error.get("type") != "value_error":
        return None
    cause = (error.get("ctx") or {}).get("error")
    return str(cause) if cause is not None else str(error.get("msg", "")).removeprefix(
        "Value error, ")


def _with_flags(message: str, flags: Mapping[str, str]) -> str:
    """``message`` naming the flags given instead of their variables (``GENAUG_PORT=9`` ->
    ``--port 9``)."""
    for field, flag in flags.items():
        pattern = re.escape(variable(field)) + r"(?![A-Z0-9_])"
        message = re.sub(pattern + "=", f"{flag} ", message)  # a flag has no backslash
        message = re.sub(pattern, flag, message)
    return message


def _quoted(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    return shlex.quote(text) if len(text) <= 200 else shlex.quote(text[:200] + "...")


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _members(annotation: Any) -> list[Any]:
    """The types of ``annotation`` without ``None`` (``int | None`` -> ``[int]``)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_secret(arg) for arg in get_args(annotation))


def _allowed(info: FieldInfo) -> str | None:
    """What the field accepts, from its declaration: its choices, or its kind of number and
    bounds; None where the declaration says no more than pydantic's message."""
    members = _members(info.annotation)
    if len(members) != 1:
        return None
    kind = members[0]
    if get_origin(kind) is Literal:
        return "one of " + _or([str(choice) for choice in get_args(kind)])
    if kind is bool:
        return "true or false (also 1/0, yes/no, on/off)"
    if kind not in (int, float):
        return None
    noun = "a whole number" if kind is int else "a number"
    bounds: dict[str, Any] = {}
    for item in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(item, key, None) is not None:
                bounds[key] = getattr(item, key)
    if "ge" in bounds and "le" in bounds:
        return f"{noun} from {_number(bounds['ge'])} to {_number(bounds['le'])}"
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [f"{signs[key]} {_number(value)}" for key, value in bounds.items()]
    return noun + (" " + " and ".join(parts) if parts else "")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _or(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
