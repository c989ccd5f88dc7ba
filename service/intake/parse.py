"""Reading a JSON request body: bytes -> the app's request model, or a 422 that says why.

Every JSON body (and the ``params`` part of an upload, :mod:`~genaug.service.intake.uploads`)
is parsed here with the app's own request models
(:class:`~genaug.service.intake.schemas.ApiModels`). A body that is not JSON gets a message
saying what is wrong with the bytes (:func:`unparseable`); one that is JSON but breaks a
bound gets the field, the value, the bound and the fix (:func:`describe_validation`).

Example::

    body = await read_body(request, api.sample["digits"], api.hints["sample"])
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequestError
from .fields import REFUSED

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, model: type[M], hints: Mapping[str, str]) -> M:
    """Parse the JSON body with ``model`` (:func:`parse_json`): 422 saying why it is not
    JSON, or naming the field, value, bound and fix."""
    return parse_json(model, await request.body(), hints)


def parse_json(
    model: type[M], raw: bytes, hints: Mapping[str, str], *, part: str | None = None
) -> M:
    """``raw`` validated by ``model``, else :class:`InvalidRequestError`: why the bytes are not
    JSON (:func:`unparseable`), or the field, value, bound and fix (:func:`describe_validation`).
    ``part`` names the multipart part the JSON came in; messages then start with it.

    Example::

        body = parse_json(api.sample["digits"], await request.body(), api.hints["sample"])
    """
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        prefix = f"{part} part: " if part else ""
        if errors and errors[0]["type"] == "json_invalid":
            detail = str(errors[0].get("ctx", {}).get("error", errors[0]["msg"]))
            raise InvalidRequestError(prefix + unparseable(detail, raw), field=part) from None
        error = describe_validation(errors, sorted(model.model_fields), hints)
        if prefix:
            error.message = prefix + error.message
            error.args = (error.message,)
        raise error from None


def unparseable(detail: str, raw: bytes) -> str:
    """Why a body is not JSON, and what to send instead."""
    detail = detail[:160]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not valid UTF-8 ({exc}); send a UTF-8 encoded JSON object"
    if not raw.strip():
        return "the body is empty; send a JSON object (see GET /openapi.json)"
    if "recursion" in detail:
        return f"the body's JSON is nested too deeply ({detail}); send a flat JSON object"
    where = _field_at(detail, raw)
    if "number" in detail and ("large" in detail or "digits" in detail or "range" in detail):
        return (f"a number{where} has too many digits to parse ({detail}); send numbers "
                "within the bounds in GET /openapi.json")
    if "escape" in detail or "surrogate" in detail:
        return (f"a \\u escape{where} is not a whole character, such as a lone UTF-16 "
                f"surrogate ({detail}); send valid Unicode text")
    return f"the body is not valid JSON ({detail}{where and ';' + where}); send a UTF-8 JSON object"


_POSITION = re.compile(r"line (\d+) column (\d+)")
_KEY = re.compile(r'"((?:[^"\\]|\\.){1,64})"\s*:')


def _field_at(detail: str, raw: bytes) -> str:
    """`` in the value of `name``` for the object key nearest before the parse error's
    position, or "" when there is none (the position is only a hint; this never raises)."""
    found = _POSITION.search(detail)
    if not found:
        return ""
    line, column = int(found.group(1)), int(found.group(2))
    lines = raw.decode("utf-8", "replace").split("\n")
    if not 1 <= line <= len(lines):
        return ""
    before = "\n".join(lines[: line - 1] + [lines[line - 1][:column]])
    before = before.rstrip("0123456789.eE+- ")[-4096:]  # a long number's own digits
    keys = _KEY.findall(before)
    return f" in the value of `{keys[-1]}`" if keys else ""


# -- validation messages ----------------------------------------------------------------------


def _short(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_union_tag(part: Any) -> bool:
    """pydantic's name of a union member in an error's location (``literal['I','P']``,
    ``list[literal['I','P']]``): internals, never a field of the body."""
    return isinstance(part, str) and "[" in part and part != "[key]"


def one_per_union(errors: list[Any]) -> list[Any]:
    """A value that fits no member of a union (a label: one name or a list of names) gets one
    error per member from pydantic, each located under the member's internal name; keep the
    one that says most (an element's error over the whole value's, a wrong value over a
    wrong shape), with the member names taken out of its location."""
    out: list[Any] = []
    union: dict[tuple[str, ...], list[Any]] = {}
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if not any(_is_union_tag(part) for part in loc):
            out.append(error)
            continue
        clean = tuple(part for part in loc if not _is_union_tag(part))
        head = tuple(str(p) for p in clean if p != "body")[:1]  # one group per field
        group = union.setdefault(head, [])
        if not group:
            out.append(head)  # placeholder, keeps the order
        group.append({**error, "loc": clean})
    for i, item in enumerate(out):
        if isinstance(item, tuple):
            group = union[item]
            shaped = [e for e in group if not str(e.get("type", "")).endswith("_type")]
            out[i] = max(shaped or group, key=_says_most)
    return out


def _says_most(error: Any) -> tuple[int, bool]:
    """Deeper first (an element's error); then not a choice among strings made of a value
    that is no string (an empty list's "too short" over "should be 'I' or 'P'")."""
    wrong_choice = error.get("type") == "literal_error" and not isinstance(error.get("input"),
                                                                           str)
    return len(error["loc"]), not wrong_choice


def describe_validation(
    errors: list[Any], allowed: list[str], hints: Mapping[str, str]
) -> InvalidRequestError:
    """Turn pydantic's errors into one message naming field, value, bound and fix.

    ``allowed`` lists the body's fields (for unknown-field messages); ``hints`` gives the fix
    per field (built from the running settings, so it names the setting that raises a bound).
    """
    messages: list[str] = []
    first_field: str | None = None
    errors = one_per_union(errors)
    for error in errors[:5]:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        name = loc[0] if loc else ""
        path = ".".join(loc)
        kind = error.get("type", "")
        first_field = first_field or name or None
        if kind == REFUSED:  # a field's own check: its message is the whole answer
            messages.append(str(error.get("msg")))
        elif kind == "extra_forbidden":
            messages.append(f"unknown field {path!r}; remove it (allowed: {', '.join(allowed)})")
        elif kind == "missing":
            messages.append(f"{path} is required; {hints.get(name, 'add it')}")
        elif not name and isinstance(error.get("ctx", {}).get("field"), str):
            # a rule over several fields (a validator's error names the field at fault)
            first_field = first_field or error["ctx"]["field"]
            messages.append(str(error.get("msg")))
        elif not name:
            messages.append(f"the body must be a JSON object: {error.get('msg')}")
        elif loc[-1] == "[key]":  # a mapping's key (a feedback label) is not allowed
            hint = hints.get(name, "see GET /v1/info and /docs for valid values")
            where = ".".join(loc[:-2])
            messages.append(f"{where} has key {_short(error.get('input'))}: {error.get('msg')}; "
                            f"{hint}")
        elif kind == "string_pattern_mismatch":
            # The prompt's pattern is "not only spaces" (a character class too long to show):
            # say that in words; any other pattern is named. The hint says what to send.
            hint = hints.get(name, "see /openapi.json for the pattern")
            value = error.get("input")
            pattern = str(error.get("ctx", {}).get("pattern", ""))
            # "[^...]": some character outside the class (the prompt's spaces, BOM included)
            what = ("has only space characters" if pattern.startswith("[^")
                    else f"does not match the pattern {pattern!r}")
            messages.append(f"{path} = {_short(value)}: {what}; {hint}")
        else:
            hint = hints.get(name, "see GET /v1/info and /docs for valid values")
            messages.append(f"{path} = {_short(error.get('input'))}: {error.get('msg')}; {hint}")
    if len(errors) > 5:
        messages.append(f"and {len(errors) - 5} more problems")
    return InvalidRequestError("; ".join(messages) or "invalid request", field=first_field)
