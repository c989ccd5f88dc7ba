"""The served ``/openapi.json``, built from the running configuration.

FastAPI documents the routes; this module adds what only the running app knows, from the very
models the handlers validate with (:class:`~genaug.service.intake.schemas.ApiModels`):

- each JSON request body, with the operator's limits as maxima and enums for schedulers and
  adapters;
- one concrete path per recipe (``/v1/recipes/shapes/sample``) instead of the template
  ``/v1/recipes/{name}/sample``, each with that recipe's labels as an enum, so a label of
  another recipe is not something the schema admits;
- the multipart body of ``/v1/variants`` (:func:`variants_body`): its binary image parts and
  its JSON ``params`` part, with the limits the upload reader enforces;
- the API-key security schemes, when keys are configured.

The answers that are bytes (images) are declared by their routes, each from the one
declaration that also negotiates them (:class:`~genaug.service.api.negotiation.Offers`): every
media type the route answers, ``application/octet-stream`` last (the one binary type client
generators read as bytes by default), and the 406 of a request that accepts none.

Example::

    app.openapi = lambda: build_openapi(app, state)
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from genaug.wire import CLIENT_ID_PATTERN, PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE

from .guard import is_open
from .responses import BINARY_SCHEMA
from .state import AppState

CLIENT_ID_HEADER: dict[str, Any] = {
    "name": "X-Client-Id",
    "in": "header",
    "required": False,
    "description": "Who is asking, for round-robin fairness between trainers and notebooks "
    "(with API keys: per key and client id).",
    "schema": {"type": "string", "pattern": CLIENT_ID_PATTERN},
}
_RECIPE_TEMPLATES = ("/v1/recipes/{name}", "/v1/recipes/{name}/sample", "/v1/recipes/{name}/fill",
                     "/v1/recipes/{name}/feedback", "/v1/recipes/{name}/verdicts",
                     "/v1/recipes/{name}/images", "/v1/recipes/{name}/images/{label}/{seed}.png")


def build_openapi(app: FastAPI, state: AppState) -> dict[str, Any]:
    """The OpenAPI document of ``app`` (built once, then cached on the app)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})

    def json_body(model: type[BaseModel]) -> dict[str, Any]:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        return {"required": True, "content": {"application/json": {"schema": ref}}}

    paths: dict[str, Any] = doc["paths"]
    generate = paths["/v1/generate"]["post"]
    generate["requestBody"] = json_body(state.api.generate)
    generate.setdefault("parameters", []).append(CLIENT_ID_HEADER)
    variants = paths["/v1/variants"]["post"]
    params = json_body(state.api.variants)["content"]["application/json"]["schema"]
    variants["requestBody"] = variants_body(
        params, max_sources=state.settings.max_variant_sources,
        max_side=state.settings.max_side, max_bytes=state.settings.max_upload_bytes)
    variants.setdefault("parameters", []).append(CLIENT_ID_HEADER)
    templates = {path: paths.pop(path) for path in _RECIPE_TEMPLATES if path in paths}
    for name in state.recipes:
        bodies = {"sample": state.api.sample[name], "fill": state.api.fill[name],
                  "feedback": state.api.feedback[name], "verdicts": state.api.verdicts[name]}
        labels = list(state.recipes[name].label_names)
        for template, item in templates.items():
            concrete = copy.deepcopy(item)
            for method, operation in concrete.items():
                operation["parameters"] = [
                    p for p in operation.get("parameters", []) if p.get("name") != "name"
                ]
                for parameter in operation["parameters"]:
                    if parameter.get("name") == "label":  # this recipe's labels, an enum
                        parameter["schema"] = {**parameter["schema"], "enum": labels}
                if not operation["parameters"]:
                    del operation["parameters"]
                operation["operationId"] = f"{operation.get('operationId', method)}_{name}"
                verb = template.rsplit("/", 1)[-1]
                if verb in bodies:
                    operation["requestBody"] = json_body(bodies[verb])
                if verb in ("feedback", "sample"):  # the need, the sample count: its own
                    operation.setdefault("parameters", []).append(CLIENT_ID_HEADER)
            paths[template.replace("{name}", name)] = concrete
    if state.settings.api_keys:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
        for path, item in paths.items():
            if is_open(path):
                continue
            for operation in item.values():
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
    app.openapi_schema = doc
    return doc


def variants_body(
    params: dict[str, Any], *, max_sources: int, max_side: int, max_bytes: int
) -> dict[str, Any]:
    """The ``multipart/form-data`` request body of ``POST /v1/variants``, as
    :func:`~genaug.service.intake.uploads.read_upload` reads it: ``image`` parts (one PNG
    each) or one ``images`` part (a safetensors batch), and one ``params`` part (JSON, the
    schema ``params`` refers to); no other part.

    "One of ``image`` and ``images``" is said in words, not with ``oneOf``: client generators
    (openapi-python-client) give up on a multipart body with ``oneOf`` and send no body at all.
    Binary parts cannot carry their pixel limits in JSON Schema either; the descriptions say
    them, and docs/reliability.md lists the 422s they cause."""
    sizes = (f"Sources share one size, a multiple of 8 on each side, at most max_side "
             f"{max_side}; the whole body at most {max_bytes} bytes (GENAUG_MAX_UPLOAD_BYTES).")
    properties = {
        "image": {
            "type": "array", "maxItems": max_sources,
            "items": {**BINARY_SCHEMA, "contentMediaType": PNG_MEDIA_TYPE},
            "description": f"One PNG per source, up to max_variant_sources {max_sources} "
                           "(send these or the images part, not both). " + sizes,
        },
        "images": {
            **BINARY_SCHEMA, "contentMediaType": SAFETENSORS_MEDIA_TYPE,
            "description": "Or (instead of image parts) all sources in one safetensors file "
                           "holding an 'images' tensor, "
                           f"uint8 [N, H, W, 3] with N up to {max_sources} (other tensors are "
                           "ignored; genaug.wire.encode_image_upload writes it). " + sizes,
        },
        "params": params,
    }
    return {
        "required": True,
        "content": {"multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": properties,
                "required": ["params"],
                "additionalProperties": False,
            },
            "encoding": {"params": {"contentType": "application/json"},
                         "image": {"contentType": PNG_MEDIA_TYPE},
                         "images": {"contentType": SAFETENSORS_MEDIA_TYPE}},
        }},
    }
