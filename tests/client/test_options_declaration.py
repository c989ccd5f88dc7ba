"""The clients' generation options are declared once (``GenerationOptions`` and its two
route-specific extensions) and agree with the service's request fields: a field added on one
side only fails here."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from genaug.client import AsyncClient, Client
from genaug.client._base import BaseClient
from genaug.client._options import (
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


def _served_sample_schema() -> dict[str, Any]:
    """The sample route's request schema as ``/openapi.json`` serves it (the shipped digits
    recipes; building the app loads no model)."""
    from genaug.service.app import create_app
    from genaug.service.settings import Settings

    recipes = Path(__file__).resolve().parents[2] / "recipes" / "digits.yaml"
    doc = create_app(Settings(recipes=str(recipes), model="tiny-random")).openapi()
    post = doc["paths"]["/v1/recipes/digits/sample"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema: dict[str, Any] = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_sample_defaults_are_the_served_defaults(cls: type) -> None:
    """``sample``'s fields and defaults are the served schema's: a default changed on one
    side, or a field added on one side only, fails here."""
    served = _served_sample_schema()["properties"]
    params = inspect.signature(cls.sample).parameters
    assert set(params) - {"self", "recipe"} == set(served)
    for name, prop in served.items():
        assert params[name].default == prop["default"], name
    # what the client sends when nothing is given is what the service assumes then
    body = BaseClient("http://127.0.0.1:9", api_key=None, client_id=None, timeout=5.0,
                      retry_deadline=1.0).calls.sample("digits").body
    assert body == {name: prop["default"] for name, prop in served.items()
                    if prop["default"] is not None}
