"""``describe_validation``: pydantic's errors as one line naming field, value, bound and fix."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

from genaug.service.intake.parse import describe_validation


class _Body(BaseModel):
    prompt: Annotated[str, Field(pattern=r"[^ \t]")]
    tag: Annotated[str, Field(pattern=r"^[a-z]+$")] = "a"


def _message(body: dict[str, object]) -> str:
    with pytest.raises(ValidationError) as caught:
        _Body.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors()]
    return str(describe_validation(errors, ["prompt", "tag"], {"tag": "send lower-case letters"}))


def test_a_blank_value_is_called_blank() -> None:
    assert "prompt = '   ': has only space characters" in _message({"prompt": "   "})


def test_any_other_pattern_is_named_not_called_blank() -> None:
    message = _message({"prompt": "x", "tag": "Ab1"})
    assert "tag = 'Ab1': does not match the pattern '^[a-z]+$'; send lower-case letters" in message
    assert "space" not in message
