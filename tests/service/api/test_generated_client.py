"""A client generated from the served ``/openapi.json`` works: openapi-python-client (pinned
in the dev extra) generates a package from a real service's schema, offline, and every route
a user calls goes through it: info, generate (safetensors and PNG), a recipe's sample,
variants (PNG parts and a safetensors part) and ``/v1/recent.png``. The bytes it hands back
are the bytes the service sent, decoded with ``genaug.wire``; errors parse into the typed
``ErrorBody``. The client is generated as docs/clients.md says, with the generator's defaults
(no config file: it reads bytes only from ``application/octet-stream``). The schema side is
checked too: the binary answers declare only their media types and
``application/octet-stream``, the service answers that type when asked for it (content
negotiation), and the variants upload declares its parts."""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from genaug import __version__
from genaug.service.intake.uploads import PARTS
from genaug.service.pipeline.load import LoadedModel
from genaug.service.testing import LiveService, start_service
from genaug.wire import (
    PNG_MEDIA_TYPE,
    SAFETENSORS_MEDIA_TYPE,
    decode_batch,
    encode_batch,
    encode_image_upload,
)

PACKAGE = "genaug_client"  # the generator's default name, from the schema's title
OCTET_STREAM = "application/octet-stream"
CLIENTS_DOC = Path(__file__).resolve().parents[3] / "docs" / "clients.md"


def doc_block(language: str, starts: str) -> str:
    """The code block of docs/clients.md in ``language`` that starts with ``starts``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", CLIENTS_DOC.read_text(), flags=re.S)
    found = [block for block in blocks if block.startswith(starts)]
    assert len(found) == 1, (language, starts, blocks)
    return found[0]


BINARY_ROUTES = {
    ("/v1/generate", "post"): {SAFETENSORS_MEDIA_TYPE, PNG_MEDIA_TYPE},
    ("/v1/variants", "post"): {SAFETENSORS_MEDIA_TYPE, PNG_MEDIA_TYPE},
    ("/v1/recipes/shapes/sample", "post"): {SAFETENSORS_MEDIA_TYPE, PNG_MEDIA_TYPE},
    ("/v1/recent.png", "get"): {PNG_MEDIA_TYPE},
}


@pytest.fixture(scope="module")
def live(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory,
         shapes_recipe: str) -> Iterator[LiveService]:
    """A service with the shapes recipe (sample generates what it waits for: no idle
    pre-generation, so nothing else runs beside a test's requests) and small variant limits."""
    root = tmp_path_factory.mktemp("generated-client")
    (root / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=root / "recipes.yaml", pool_path=root / "pool.db",
                       max_batch_images=8, max_wait_ms=20, max_variant_sources=4,
                       pregenerate=False) as service:
        yield service


@pytest.fixture(scope="module")
def schema(live: LiveService) -> dict[str, Any]:
    r = httpx.get(live.url + "/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def generated(schema: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[ModuleType]:
    """The package openapi-python-client generates from the served schema, imported: the
    command docs/clients.md gives, run as written (no config file: every default, including
    its ruff post-hooks, found next to this Python)."""
    root = tmp_path_factory.mktemp("openapi-python-client")
    lines = doc_block("sh", "curl -s").replace("\\\n", " ").splitlines()
    (command,) = [shlex.split(line) for line in lines
                  if line.startswith("openapi-python-client generate")]
    assert not {"--config", "--meta"} & set(command), command  # the defaults, nothing else
    (root / command[command.index("--path") + 1]).write_text(json.dumps(schema))
    out = root / command[command.index("--output-path") + 1]
    bin_dir = str(Path(sys.executable).parent)
    done = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", *command[1:]],
        cwd=root, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # A warning means an operation or a response was left out of the generated code (a
    # binary answer it cannot read: "Unsupported content_type image/png").
    assert "WARNING" not in output and "Unsupported" not in output, output
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m.partition(".")[0] == PACKAGE]:
            del sys.modules[name]


def module(package: ModuleType, name: str) -> Any:
    return importlib.import_module(f"{package.__name__}.{name}")


@pytest.fixture(scope="module")
def client(generated: ModuleType, live: LiveService) -> Any:
    return generated.Client(base_url=live.url, timeout=60, raise_on_unexpected_status=True)


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


# -- the schema ------------------------------------------------------------------------------


def test_binary_answers_declare_only_their_media_types_as_binary(schema: dict[str, Any]) -> None:
    routes = {**BINARY_ROUTES,
              ("/v1/recipes/shapes/images/{label}/{seed}.png", "get"): {PNG_MEDIA_TYPE}}
    for (path, method), media_types in routes.items():
        responses = schema["paths"][path][method]["responses"]
        content = responses["200"]["content"]
        # its own types first, then plain octets: what a generator knows as bytes by default
        assert list(content)[-1] == OCTET_STREAM, (path, list(content))
        assert set(content) == media_types | {OCTET_STREAM}, (path, sorted(content))
        for media in content:
            assert content[media]["schema"] == {"type": "string", "format": "binary"}, path
        for status, answer in responses.items():
            if status.startswith("4") or status.startswith("5"):
                ref = answer["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (path, status)
    for path in ("/v1/generate", "/v1/variants", "/v1/recipes/shapes/sample"):
        description = schema["paths"][path]["post"]["responses"]["200"]["description"]
        for word in ("little-endian", "images uint8", "seeds int64", "__metadata__"):
            assert word in description, (path, word)
    assert "labels int32" in schema["paths"]["/v1/recipes/shapes/sample"]["post"][
        "responses"]["200"]["description"]
    assert "sources int32" in schema["paths"]["/v1/variants"]["post"]["responses"]["200"][
        "description"]


# Accept header -> the answer's Content-Type, for a batch route (RFC 9110 negotiation: the
# highest q, the most specific range deciding; at a tie the service's own order).
BATCH_ACCEPTS = {
    "*/*": SAFETENSORS_MEDIA_TYPE,
    OCTET_STREAM: OCTET_STREAM,
    f"{OCTET_STREAM}, */*;q=0.1": OCTET_STREAM,
    f"{OCTET_STREAM};q=0, */*": SAFETENSORS_MEDIA_TYPE,
    PNG_MEDIA_TYPE: PNG_MEDIA_TYPE,
    "image/*": PNG_MEDIA_TYPE,
    f"{PNG_MEDIA_TYPE}, */*": PNG_MEDIA_TYPE,
    f"{PNG_MEDIA_TYPE};q=0.2, {SAFETENSORS_MEDIA_TYPE};q=0.9": SAFETENSORS_MEDIA_TYPE,
    f"{PNG_MEDIA_TYPE}, {SAFETENSORS_MEDIA_TYPE}": SAFETENSORS_MEDIA_TYPE,
    # JSON alone is none of them: 406 (tests/service/api/test_negotiation.py)
    "application/json;q=0.5, */*;q=0.1": SAFETENSORS_MEDIA_TYPE,
}


def test_the_binary_answers_follow_the_accept_header(live: LiveService) -> None:
    """What the schema offers, the service answers: ``Accept: application/octet-stream``
    gets the same bytes under that type, on every binary route; the others keep their own."""
    body = {"prompt": "a circle", "n": 2, "height": 32, "width": 32, "steps": 2, "seed": 11}
    answers: dict[str, httpx.Response] = {}
    for accept, media in BATCH_ACCEPTS.items():
        r = httpx.post(live.url + "/v1/generate", json=body, headers={"Accept": accept},
                       timeout=60)
        assert r.status_code == 200, (accept, r.text)
        assert (r.headers["content-type"], r.headers["vary"]) == (media, "Accept"), accept
        answers[accept] = r
    safetensors, octets = answers["*/*"].content, answers[OCTET_STREAM].content
    assert octets == safetensors  # the same batch, seeded, under the other type
    assert decode_batch(octets).seeds.tolist() == [11, 12]
    assert answers["image/*"].content.startswith(b"\x89PNG")

    sources = np.random.default_rng(3).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    files = [("images", ("s.safetensors", encode_image_upload(sources),
                         SAFETENSORS_MEDIA_TYPE)),
             ("params", (None, json.dumps({"prompt": "a variant", "steps": 2, "seed": 4,
                                           "n_per_image": 1}).encode(), "application/json"))]
    variants = httpx.post(live.url + "/v1/variants", files=files,
                          headers={"Accept": OCTET_STREAM}, timeout=60)
    assert variants.status_code == 200, variants.text
    assert variants.headers["content-type"] == OCTET_STREAM
    assert decode_batch(variants.content).sources is not None

    sample = httpx.post(live.url + "/v1/recipes/shapes/sample", json={"n": 2, "wait_s": 30},
                        headers={"Accept": OCTET_STREAM}, timeout=60)
    assert sample.status_code == 200 and sample.headers["content-type"] == OCTET_STREAM
    sampled = decode_batch(sample.content)
    assert sampled.metadata["recipe"] == "shapes" and sampled.labels is not None
    label = sampled.metadata["label_names"][int(sampled.labels[0])]

    # the PNG routes: their PNG, as plain octets when asked; a browser's <img> gets image/png
    listed = httpx.get(live.url + "/v1/recipes/shapes/images", params={"label": label},
                       timeout=30).json()
    one = listed["images"][0]["png"]
    browser = "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8"
    for path in ("/v1/recent.png", one):
        own = httpx.get(live.url + path, headers={"Accept": browser}, timeout=30)
        plain = httpx.get(live.url + path, headers={"Accept": OCTET_STREAM}, timeout=30)
        assert own.headers["content-type"] == PNG_MEDIA_TYPE, path
        assert plain.headers["content-type"] == OCTET_STREAM, path
        assert plain.content.startswith(b"\x89PNG") and own.headers["vary"] == "Accept"
    assert httpx.get(live.url + one, timeout=30).content == plain.content


def test_the_variants_upload_declares_its_parts(schema: dict[str, Any], live: LiveService
                                                ) -> None:
    body = schema["paths"]["/v1/variants"]["post"]["requestBody"]
    form = body["content"]["multipart/form-data"]
    parts = form["schema"]
    assert set(parts["properties"]) == set(PARTS)  # what the upload reader admits
    assert parts["additionalProperties"] is False and parts["required"] == ["params"]
    image = parts["properties"]["image"]
    assert image["items"]["format"] == "binary" and image["items"]["type"] == "string"
    assert image["maxItems"] == live.settings.max_variant_sources
    assert parts["properties"]["images"]["format"] == "binary"
    assert parts["properties"]["params"] == {"$ref": "#/components/schemas/VariantParams"}
    assert form["encoding"]["params"]["contentType"] == "application/json"
    params = schema["components"]["schemas"]["VariantParams"]
    assert params["properties"]["strength"] is not None
    assert params["additionalProperties"] is False


# -- the generated client --------------------------------------------------------------------


def test_info_parses_into_the_generated_model(generated: ModuleType, client: Any,
                                              live: LiveService) -> None:
    info = module(generated, "api.service.info_v1_info_get").sync(client=client)
    assert type(info).__name__ == "InfoResponse"
    assert info.version == __version__ and info.ready is True
    assert info.limits.max_variant_sources == live.settings.max_variant_sources


def test_generate_answers_the_bytes_the_service_sent(generated: ModuleType, client: Any,
                                                     live: LiveService) -> None:
    generate = module(generated, "api.generation.generate_v1_generate_post")
    body = {"prompt": "a circle", "n": 2, "height": 32, "width": 32, "steps": 2, "seed": 5}
    answer = generate.sync_detailed(client=client, body=generated.models.GenerateRequest
                                    .from_dict(body))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == SAFETENSORS_MEDIA_TYPE
    payload = answer.parsed.payload.read()
    assert payload == answer.content
    batch = decode_batch(payload)
    assert batch.images.shape == (2, 32, 32, 3) and batch.images.dtype == np.uint8
    assert batch.seeds.tolist() == [5, 6] and answer.headers["x-genaug-seeds"] == "5,6"
    assert batch.metadata["request"]["prompt"] == "a circle"
    # The same request sent by hand gets the same images (seeded; batch-invariant).
    direct = decode_batch(httpx.post(live.url + "/v1/generate", json=body, timeout=60).content)
    np.testing.assert_array_equal(direct.images, batch.images)

    # A client of its own: with_headers would also change the shared client's httpx client.
    png_client = generated.Client(base_url=live.url, timeout=60,
                                  headers={"Accept": PNG_MEDIA_TYPE})
    as_png = generate.sync(client=png_client,
                           body=generated.models.GenerateRequest.from_dict(body))
    grid = Image.open(io.BytesIO(as_png.payload.read()))
    assert grid.format == "PNG" and grid.size == (64, 32)  # two 32x32 images side by side
    np.testing.assert_array_equal(np.asarray(grid.convert("RGB"))[:, :32], batch.images[0])


def test_errors_parse_into_the_typed_error_body(generated: ModuleType, client: Any,
                                                live: LiveService) -> None:
    generate = module(generated, "api.generation.generate_v1_generate_post")
    too_many = live.settings.max_n + 1
    error = generate.sync(client=client, body=generated.models.GenerateRequest.from_dict(
        {"prompt": "a circle", "n": too_many}))
    assert type(error).__name__ == "ErrorBody"
    assert error.error.field == "n" and str(too_many) in error.error.message


def test_sample_answers_a_batch_of_the_recipe(generated: ModuleType, client: Any) -> None:
    sample = module(generated, "api.recipes.sample_v1_recipes_name_sample_post_shapes")
    body = generated.models.SampleRequestShapes.from_dict({"n": 3, "wait_s": 30})
    answer = sample.sync_detailed(client=client, body=body)
    assert answer.status_code == 200
    batch = decode_batch(answer.parsed.payload.read())
    assert len(batch) == int(answer.headers["x-genaug-count"]) == 3
    assert batch.images.shape[1:] == (32, 32, 3) and batch.labels is not None
    assert batch.metadata["recipe"] == "shapes"
    assert batch.metadata["label_names"] == ["circle", "square", "triangle"]
    assert set(batch.labels.tolist()) <= {0, 1, 2}


def test_variants_upload_pngs_and_a_safetensors_part(generated: ModuleType, client: Any,
                                                     live: LiveService) -> None:
    variants = module(generated, "api.generation.variants_v1_variants_post")
    models, types = generated.models, module(generated, "types")
    sources = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    params = {"prompt": "a variant", "strength": 0.6, "n_per_image": 2, "steps": 2, "seed": 1}

    as_pngs = models.VariantsV1VariantsPostBody(
        params=models.VariantParams.from_dict(params),
        image=[types.File(payload=io.BytesIO(png(s)), file_name=f"s{i}.png",
                          mime_type=PNG_MEDIA_TYPE) for i, s in enumerate(sources)])
    answer = variants.sync_detailed(client=client, body=as_pngs)
    assert answer.status_code == 200, answer.content[:300]
    batch = decode_batch(answer.parsed.payload.read())
    assert batch.images.shape == (4, 32, 32, 3) and batch.images.dtype == np.uint8
    assert batch.seeds.tolist() == [1, 2, 3, 4] and batch.sources is not None
    assert batch.sources.tolist() == [0, 0, 1, 1]
    assert len(batch.metadata["source_hashes"]) == 2

    as_batch = models.VariantsV1VariantsPostBody(
        params=models.VariantParams.from_dict(params),
        images=types.File(payload=io.BytesIO(encode_image_upload(sources)),
                          file_name="sources.safetensors", mime_type=SAFETENSORS_MEDIA_TYPE))
    again = decode_batch(variants.sync(client=client, body=as_batch).payload.read())
    np.testing.assert_array_equal(again.images, batch.images)  # same sources, same seeds

    # The same upload sent by hand gets the same variants.
    files = [("image", (f"s{i}.png", png(s), PNG_MEDIA_TYPE)) for i, s in enumerate(sources)]
    files.append(("params", (None, json.dumps(params).encode(), "application/json")))
    direct = httpx.post(live.url + "/v1/variants", files=files, timeout=60)
    np.testing.assert_array_equal(decode_batch(direct.content).images, batch.images)


def test_recent_png_is_a_png_grid(generated: ModuleType, client: Any,
                                  live: LiveService) -> None:
    httpx.post(live.url + "/v1/generate", json={"prompt": "a square", "height": 32,
                                                "width": 32, "steps": 2}, timeout=60)
    recent = module(generated, "api.service.recent_png_v1_recent_png_get")
    answer = recent.sync_detailed(client=client)
    assert answer.status_code == 200 and answer.headers["content-type"] == PNG_MEDIA_TYPE
    image = Image.open(answer.parsed.payload)
    assert image.format == "PNG" and image.size[0] % 32 == 0 and image.size[1] % 32 == 0


def test_the_docs_reader_reads_a_batch_without_genaug(generated: ModuleType, client: Any
                                                      ) -> None:
    """docs/clients.md's numpy-only reader gives what genaug.wire decodes, for a sample from
    the service and for an empty batch."""
    namespace: dict[str, Any] = {}
    exec(doc_block("python", "import json, struct"), namespace)
    sample = module(generated, "api.recipes.sample_v1_recipes_name_sample_post_shapes")
    served = sample.sync(client=client, body=generated.models.SampleRequestShapes.from_dict(
        {"n": 2, "wait_s": 30})).payload.read()
    empty = encode_batch(np.zeros((0, 8, 8, 1), np.uint8), np.zeros(0, np.int64),
                         labels=np.zeros(0, np.int32), metadata={"label_names": ["a"]})
    for payload in (served, empty):
        tensors, metadata = namespace["read_batch"](payload)
        batch = decode_batch(payload)
        assert metadata == batch.metadata
        assert sorted(tensors) == ["images", "labels", "seeds"]
        for name in tensors:
            expected = getattr(batch, name)
            assert tensors[name].dtype == expected.dtype, name
            np.testing.assert_array_equal(tensors[name], expected)


def test_the_docs_example_runs(generated: ModuleType, live: LiveService, tmp_path: Path
                               ) -> None:
    """docs/clients.md's example, against this service and with a PNG of the test's own."""
    source = tmp_path / "three.png"
    source.write_bytes(png(np.full((32, 32, 3), 200, np.uint8)))
    code = (doc_block("python", "from genaug_client import Client")
            .replace("genaug_client", PACKAGE).replace("http://127.0.0.1:8000", live.url)
            .replace('open("three.png", "rb")', f"open({str(source)!r}, 'rb')"))
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert len(decode_batch(namespace["body"])) == 4
    variants = decode_batch(namespace["variants"])
    assert variants.images.shape == (4, 32, 32, 3) and variants.sources is not None
    assert variants.sources.tolist() == [0, 0, 0, 0]
