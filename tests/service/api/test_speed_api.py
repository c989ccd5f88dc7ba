"""``speed`` through HTTP on the tiny model: turbo is the model's few-step setting (what
``/v1/info`` names), the fields a request gives still win, a quality request is what it always
was, and a service that serves no turbo says so in its schema and in a 422 that names the fix."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from genaug.client import Client
from genaug.local_service import free_port
from genaug.service.intake.schemas import build_api_models
from genaug.service.pipeline.turbo_unet import served_turbo
from genaug.service.settings import Settings
from genaug.service.testing import start_service

PROMPT = ("a detailed depth image of a granulating diabetic foot ulcer on the plantar surface, "
          "moist red granulation tissue, clean wound edges, clinical photography")
SEED = 6_917_529_027_641_081_856  # a 63-bit seed, as the planner draws them


def test_info_names_what_turbo_draws_with(service: Any) -> None:
    info = httpx.get(service.url + "/v1/info", timeout=30).json()
    assert info["turbo"] == {"speed": "turbo", "scheduler": "tcd", "steps": 2, "guidance": 0.0,
                             "name": "turbo: tcd 2 steps, guidance 0", "id": "turbo:tcd:2:0",
                             "kind": None, "lora_file": None}


def test_turbo_is_the_few_step_setting_and_given_fields_win(service: Any) -> None:
    with Client(service.url) as client:
        turbo = client.generate(PROMPT, n=3, seed=SEED, speed="turbo")
        same = client.generate(PROMPT, n=3, seed=SEED, steps=2, scheduler="tcd", guidance=0.0)
        quality = client.generate(PROMPT, n=3, seed=SEED)
        more = client.generate(PROMPT, n=1, seed=SEED, speed="turbo", steps=3)
    resolved = turbo.metadata["resolved"]
    assert resolved["speed"] == "turbo"
    assert (resolved["steps"], resolved["scheduler"], resolved["guidance"]) == (2, "tcd", 0.0)
    # Without a turbo LoRA turbo runs the one UNet: the same pixels as asking for the
    # setting by hand (the key differs, so the two never share a batch).
    assert np.array_equal(turbo.images, same.images)
    assert (quality.metadata["resolved"]["speed"], quality.metadata["resolved"]["steps"]) == (
        "quality", 4)
    assert not np.array_equal(turbo.images, quality.images)
    given = more.metadata["resolved"]
    assert (given["steps"], given["scheduler"]) == (3, "tcd")


def test_an_unknown_speed_is_a_422_naming_the_field_and_the_fix(service: Any) -> None:
    r = httpx.post(service.url + "/v1/generate",
                   json={"prompt": PROMPT, "speed": "fast"}, timeout=30)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "speed" and "'fast'" in error["message"]
    assert "use quality or turbo" in error["message"]


def test_a_model_folder_without_a_turbo_lora_serves_no_turbo(tiny_model: Any,
                                                             tmp_path: Any) -> None:
    (tmp_path / "sdxl").mkdir()  # served below with the tiny weights under a folder's settings
    settings = Settings(model=str(tmp_path / "sdxl"), warmup=False)
    api = build_api_models(settings, recipes={}, adapters=(),
                           defaults=settings.request_defaults(), turbo=served_turbo(settings))
    assert api.turbo is None
    schema = api.generate.model_json_schema()["properties"]["speed"]
    assert schema["anyOf"][0] == {"const": "quality", "type": "string"}
    # Served: the 422 says what turbo needs.
    live = start_service(tiny_model, settings=settings.model_copy(
        update={"port": free_port()}))
    try:
        assert httpx.get(live.url + "/v1/info", timeout=30).json()["turbo"] is None
        r = httpx.post(live.url + "/v1/generate", json={"prompt": PROMPT, "speed": "turbo"},
                       timeout=30)
    finally:
        live.stop()
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "speed" and "GENAUG_TURBO_LORA" in error["message"]
