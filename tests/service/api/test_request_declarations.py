"""Each request field is declared once (type, default, bound, fix) and every model the app
serves is derived from those declarations: a field without a bound or a fix is caught here,
not by a client that sends a billion steps."""

from __future__ import annotations

import re
from typing import Annotated, Any

import pytest
from pydantic import Field

from genaug.service.intake.fields import SEED_MAX, Bound, Fix, Limits, bounded_model, declaration
from genaug.service.intake.schemas import (
    ROUTE_MODELS,
    ApiModels,
    GenerateRequest,
    build_api_models,
    hints,
)
from genaug.service.recipes.load import load_recipes
from genaug.service.sampling.modes import turbo_mode
from genaug.service.settings import Settings

# A schema property that says what it admits: a largest number or length, or a closed set.
SETTINGS = Settings(max_n=5, max_steps=9, max_side=100)
BOUND_KEYS = {"maximum", "exclusiveMaximum", "maxLength", "enum", "const"}


def unbounded(schema: Any) -> bool:
    """True when nothing in ``schema`` bounds the values it admits (only ``null`` is closed)."""
    if not isinstance(schema, dict):
        return True
    if BOUND_KEYS & schema.keys() or schema.get("type") == "null":
        return False
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return any(unbounded(part) for part in schema[key])
    if schema.get("type") == "array":
        return unbounded(schema.get("items"))
    if schema.get("type") == "object":
        return (unbounded(schema.get("additionalProperties"))
                or unbounded(schema.get("propertyNames")))
    return True


def served_models(api: ApiModels) -> dict[str, list[Any]]:
    return {
        "generate": [api.generate],
        "variants": [api.variants],
        "sample": list(api.sample.values()),
        "fill": list(api.fill.values()),
        "feedback": list(api.feedback.values()),
    }


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, shapes_recipe: str) -> ApiModels:
    path = tmp_path_factory.mktemp("recipes") / "recipes.yaml"
    path.write_text(shapes_recipe)
    return build_api_models(SETTINGS, recipes=load_recipes(path), adapters=("ink",),
                            defaults=(64, 4, 5.0), turbo=turbo_mode(SETTINGS))


@pytest.mark.parametrize("route", sorted(ROUTE_MODELS))
def test_every_declared_field_has_one_bound_and_one_fix(route: str) -> None:
    model = ROUTE_MODELS[route]
    for name in model.model_fields:
        bound, fix = declaration(model, name)
        assert fix.render(SETTINGS).strip(), f"{route}.{name}: an empty fix"


def test_every_served_field_is_bounded_and_has_a_hint(api: ApiModels) -> None:
    models = served_models(api)
    assert all(models.values()), "the fixture serves a model per route"
    for route, served in models.items():
        for model in served:
            schema = model.model_json_schema()
            assert set(schema["properties"]) == set(ROUTE_MODELS[route].model_fields)
            for name, prop in schema["properties"].items():
                assert not unbounded(prop), f"{model.__name__}.{name} admits any value: {prop}"
                assert name in api.hints[route], f"{route}.{name} has no fix hint"
                left = set(re.findall(r"\{(\w+)[}:]", api.hints[route][name])) - {"name"}
                assert not left, f"{route}.{name}: {left} left unformatted in its hint"


def test_the_bound_check_catches_an_unbounded_field() -> None:
    """The walk above fails on what it guards against (a test that cannot fail proves
    nothing)."""
    assert unbounded({"type": "integer", "minimum": 1})
    assert unbounded({"anyOf": [{"type": "string"}, {"type": "null"}]})
    assert unbounded({"type": "object", "additionalProperties": {"type": "number"},
                      "propertyNames": {"enum": ["a"]}})
    assert not unbounded({"anyOf": [{"type": "integer", "maximum": 9}, {"type": "null"}]})


def test_a_field_without_a_bound_or_fix_is_refused() -> None:
    class Unbounded(GenerateRequest):
        eta: float | None = None

    class NoFix(GenerateRequest):
        eta: Annotated[float | None, Field(description="x"), Bound(ge=0, le=1)] = None

    for model in (Unbounded, NoFix):
        with pytest.raises(TypeError, match=r"eta must declare one Bound and one Fix"):
            bounded_model(model, _limits())


def test_a_declared_field_is_served_bounded_with_its_fix(api: ApiModels) -> None:
    """Bounds and fixes come from the app's settings and context, once for both routes."""
    class WithEta(GenerateRequest):
        eta: Annotated[float | None, Field(description="DDIM eta."), Bound(ge=0, le="max_n"),
                       Fix("use 0 to max_n {max_n}")] = None

    model = bounded_model(WithEta, _limits())
    prop = model.model_json_schema()["properties"]["eta"]
    assert prop["anyOf"][0] == {"maximum": 5.0, "minimum": 0.0, "type": "number"}
    assert prop["description"] == "DDIM eta."
    assert declaration(WithEta, "eta")[1].render(Settings(max_n=5)) == "use 0 to max_n 5"


def test_bounds_resolve_per_app(api: ApiModels) -> None:
    gen = api.generate.model_json_schema()["properties"]
    var = api.variants.model_json_schema()["properties"]
    assert gen["steps"]["anyOf"][0]["maximum"] == 9
    assert gen["height"]["anyOf"][0]["maximum"] == 96  # max_side 100, down to a multiple of 8
    assert gen["seed"]["anyOf"][0]["maximum"] == SEED_MAX - 4
    sources = Settings().max_variant_sources
    assert var["seed"]["anyOf"][0]["maximum"] == SEED_MAX - (5 * sources - 1)
    assert gen["adapter"]["anyOf"][0] == {"const": "ink", "type": "string"}
    assert api.hints["generate"]["steps"] == "use 1 to max_steps 9, or set GENAUG_MAX_STEPS"
    fill = api.fill["shapes"].model_json_schema()["properties"]
    capacity = Settings().pool_capacity_per_label
    assert fill["images"]["maximum"] == capacity * 3  # three labels
    plain = build_api_models(Settings(), recipes={}, adapters=(), defaults=(64, 4, 5.0),
                             turbo=None)
    assert plain.generate.model_json_schema()["properties"]["adapter"]["type"] == "null"
    assert hints(SETTINGS) == {route: dict(h) for route, h in api.hints.items()}


def _limits() -> Limits:
    return Limits(Settings(max_n=5), 5, {"schedulers": ("ddim",), "adapters": (),
                                         "speeds": ("quality", "turbo")})
