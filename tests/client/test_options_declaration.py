"""The clients' generation options are declared once (``GenerationOptions`` and its two
route-specific extensions) and agree with the service's request fields: a field added on one
side only fails here."""

from __future__ import annotations

import inspect

import pytest

from genaug.client import AsyncClient, Client
from genaug.client._base import (
    OPTIONS,
    GenerateOptions,
    GenerationOptions,
    VariantOptions,
    request_body,
)
from genaug.service.intake.schemas import GenerateRequest, GenerationFields, VariantParams

# The prompt is the methods' positional argument, not an option.
POSITIONAL = {"prompt"}


@pytest.mark.parametrize(("options", "model"), [
    (GenerationOptions, GenerationFields),
    (GenerateOptions, GenerateRequest),
    (VariantOptions, VariantParams),
])
def test_client_options_are_the_service_fields(options: type, model: type) -> None:
    assert set(options.__annotations__) == set(model.model_fields) - POSITIONAL


@pytest.mark.parametrize(("method", "model"), [("generate", GenerateRequest),
                                               ("variants", VariantParams)])
def test_client_defaults_are_the_service_defaults(method: str, model: type) -> None:
    names, defaults = OPTIONS[method]
    for name, value in defaults.items():
        assert model.model_fields[name].default == value, name
    body = request_body(method, "x", {})
    assert model(**body).model_dump() == model(prompt="x").model_dump()


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_the_methods_take_the_declared_options(cls: type) -> None:
    """No method repeats an option in its own signature: ``prompt`` (and the images) then
    ``**options`` typed by the one declaration."""
    for method, first in (("generate", ["prompt"]), ("generate_png", ["prompt"]),
                          ("variants", ["images", "prompt"])):
        params = list(inspect.signature(getattr(cls, method)).parameters.values())
        assert [p.name for p in params] == ["self", *first, "options"], method
        assert params[-1].kind is inspect.Parameter.VAR_KEYWORD
        expected = "VariantOptions" if method == "variants" else "GenerateOptions"
        assert params[-1].annotation == f"Unpack[{expected}]", method


def test_an_unknown_option_is_a_type_error_before_anything_is_sent() -> None:
    with pytest.raises(TypeError, match=r"variants\(\) got an unexpected keyword argument "
                                        r"'height'"):
        request_body("variants", "x", {"height": 64})
    body = request_body("generate", "x", {"n": 2, "seed": None, "steps": 3})
    assert body == {"prompt": "x", "n": 2, "priority": "interactive", "steps": 3}
