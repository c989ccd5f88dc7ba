"""LoRA adapters over HTTP: listed in /v1/info and in the schema, chosen per request, unknown
names refused with the known ones, and `genaug serve --lora` through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.local_service import free_port
from genaug.service.pipeline.load import load_model
from genaug.service.testing import LiveService, make_lora, start_service, wait_ready
from genaug.wire import decode_batch


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("loras")
    return {"ink": make_lora(folder, "ink", seed=1), "chalk": make_lora(folder, "chalk", seed=2)}


@pytest.fixture(scope="module")
def live(loras: dict[str, Path]) -> Iterator[LiveService]:
    # A model of its own: LoRA layers go into the UNet.
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    spec = ",".join(f"{name}={path}" for name, path in loras.items())
    with start_service(model, loras=spec, max_batch_images=4) as service:
        yield service


def generate(live: LiveService, **body: Any) -> httpx.Response:
    return httpx.post(live.url + "/v1/generate", json={"prompt": "x", "seed": 3, **body},
                      timeout=60)


def test_info_and_schema_list_the_adapters(live: LiveService, loras: dict[str, Path]) -> None:
    info = httpx.get(live.url + "/v1/info").json()
    assert [a["name"] for a in info["adapters"]] == ["ink", "chalk"]
    assert all(len(a["hash"]) == 16 and a["source"] for a in info["adapters"])
    schema = httpx.get(live.url + "/openapi.json").json()["components"]["schemas"]
    adapter = schema["GenerateRequest"]["properties"]["adapter"]
    assert {"ink", "chalk"} <= {v for alt in adapter["anyOf"] for v in alt.get("enum", [])}


def test_an_adapter_changes_the_image_and_the_scale_matters(live: LiveService) -> None:
    plain = decode_batch(generate(live).content).images[0]
    ink = decode_batch(generate(live, adapter="ink").content).images[0]
    faint = decode_batch(generate(live, adapter="ink", adapter_scale=0.0).content).images[0]
    assert np.abs(plain.astype(int) - ink.astype(int)).mean() > 1
    np.testing.assert_array_equal(faint, plain)  # scale 0 is the base model


def test_an_unknown_adapter_is_a_422_naming_the_known_ones(live: LiveService) -> None:
    r = generate(live, adapter="crayon")
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["field"] == "adapter"
    assert "'ink'" in error["message"] and "'chalk'" in error["message"]


# A service process of its own (9 s in a full run on 2 cores), for what two fast tests
# already hold between them: tests/genaug/test_cli.py (--lora twice becomes the one loras setting)
# and tests/service/adapt/test_adapt.py (a LoRA served by a started genaug serve).
@pytest.mark.slow
def test_serve_lora_flag_loads_the_adapter(loras: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env["OMP_NUM_THREADS"] = "1"
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "genaug.service", "--port", str(port), "--warmup", "false",
         "--lora", f"ink={loras['ink']}", "--lora", f"chalk={loras['chalk']}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, timeout=120, alive=lambda: proc.poll() is None)
        names = [a["name"] for a in httpx.get(url + "/v1/info").json()["adapters"]]
        assert names == ["ink", "chalk"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
