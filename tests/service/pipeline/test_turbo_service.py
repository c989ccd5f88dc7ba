"""A turbo LoRA served beside the full sampler, through HTTP on the tiny model: quality images
are the images a service without it draws, bit for bit; turbo batches run the fused copy with
the kind's sampler; a label's adapter applies in both modes; /v1/info names the LoRA; the pool
keeps which LoRA drew an image."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from bench.gpu.turbo_lora_file import write_turbo_lora
from genaug.client import Client
from genaug.local_service import free_port
from genaug.service.pipeline.load import load_model
from genaug.service.testing import LiveService, make_lora, start_service

PROMPT = ("depth image of an inflamed diabetic foot ulcer with a necrotic centre, macerated "
          "periwound skin and yellow slough, plantar view, clinical lighting")
SEED = 5_764_607_523_034_234_880


@pytest.fixture(scope="module")
def turbo_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """A fresh tiny model (the turbo copy hangs on its pipeline) served with a synthetic LCM
    turbo LoRA in the published layout and one label adapter."""
    folder = tmp_path_factory.mktemp("turbo")
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    lora = write_turbo_lora(folder / "lcm.safetensors", "lcm", dict(model.pipeline.unet.config),
                            rank=4, std=0.05)
    ink = make_lora(folder, "ink", seed=1)
    live = start_service(model, port=free_port(), turbo_lora=str(lora), turbo_kind="lcm",
                         loras={"ink": ink}, max_batch_images=8)
    yield live
    live.stop()


def _images(url: str, **options: Any) -> np.ndarray:
    with Client(url) as client:
        return client.generate(PROMPT, n=2, seed=SEED, **options).images


def test_info_names_the_turbo_lora(turbo_live: LiveService) -> None:
    turbo = httpx.get(turbo_live.url + "/v1/info", timeout=30).json()["turbo"]
    assert (turbo["kind"], turbo["scheduler"], turbo["steps"], turbo["guidance"]) == (
        "lcm", "lcm", 4, 1.0)
    assert turbo["lora_file"].endswith("lcm.safetensors")
    assert turbo["name"].startswith("turbo: lcm 4 steps, guidance 1 with the lcm ")


def test_quality_is_untouched_and_turbo_runs_the_fused_copy(
        turbo_live: LiveService, service: Any) -> None:
    # The session's service serves the same tiny weights without a turbo LoRA.
    assert np.array_equal(_images(turbo_live.url), _images(service.url))
    by_hand = dict(steps=4, scheduler="lcm", guidance=1.0)
    assert np.array_equal(_images(turbo_live.url, **by_hand), _images(service.url, **by_hand))
    turbo = _images(turbo_live.url, speed="turbo")
    assert not np.array_equal(turbo, _images(turbo_live.url, **by_hand))
    # The same again: a mode switch changes nothing of either.
    assert np.array_equal(turbo, _images(turbo_live.url, speed="turbo"))
    assert np.array_equal(_images(turbo_live.url), _images(service.url))
    unet = turbo_live.state.model.state.turbo_unet
    assert unet is not None and unet is not turbo_live.state.model.pipeline.unet


def test_a_label_adapter_applies_in_turbo_mode(turbo_live: LiveService) -> None:
    plain = _images(turbo_live.url, speed="turbo")
    inked = _images(turbo_live.url, speed="turbo", adapter="ink")
    assert not np.array_equal(plain, inked)
    assert np.array_equal(inked, _images(turbo_live.url, speed="turbo", adapter="ink"))
    # and quality with the adapter is still quality's
    assert not np.array_equal(_images(turbo_live.url, adapter="ink"), inked)


def test_serve_refuses_a_file_that_is_no_turbo_lora_in_one_line(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    pickled = tmp_path / "lcm-lora.bin"
    pickled.write_bytes(b"\x80\x04not a safetensors file")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    out = subprocess.run(
        [sys.executable, "-m", "genaug.service", "--port", "0", "--pool-path",
         str(tmp_path / "pool.db"), "--turbo-lora", str(pickled), "--turbo-kind", "lcm"],
        capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode != 0
    said = [line for line in out.stderr.splitlines() if line.startswith("genaug serve:")]
    assert len(said) == 1 and "is not a safetensors file" in said[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow  # two UNets compiled on the CPU: about a minute
def test_compiled_turbo_and_quality_switch_without_a_recompile(tmp_path: Any) -> None:
    """With GENAUG_COMPILE the warm-up compiles both UNets; afterwards quality and turbo
    batches, with and without a label adapter (hotswapped into each UNet's slot), alternate
    and nothing compiles again."""
    import torch

    torch._dynamo.reset()
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    lora = write_turbo_lora(tmp_path / "lcm.safetensors", "lcm", dict(model.pipeline.unet.config),
                            rank=4, std=0.05)
    ink = make_lora(tmp_path, "ink", seed=1)
    with start_service(model, port=free_port(), turbo_lora=str(lora), turbo_kind="lcm",
                       loras={"ink": ink}, compile="unet", max_batch_images=2,
                       ready_timeout=600) as live:
        info = httpx.get(live.url + "/v1/info", timeout=30).json()["acceleration"]
        assert info["warmup"]["finished"] and info["warmup"]["total"] == 2  # 64x64:2, twice
        for options in ({}, {"speed": "turbo"}, {"adapter": "ink"},
                        {"speed": "turbo", "adapter": "ink"}, {}, {"speed": "turbo"}):
            with Client(live.url, timeout=600) as client:
                client.generate(PROMPT, n=2, seed=SEED, timeout_s=600, **options)
        assert live.metric("genaug_recompiles_total") == 0
    torch._dynamo.reset()
