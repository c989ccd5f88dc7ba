"""tools/train_tiny_generator.py: a short run writes what the service loads.

A dozen steps on 8 digits per class: the point is the outputs (a diffusers folder that
``genaug serve --model`` serves, a UNet file for ``--unet-weights``, the single-file package
format and the trained_on record), not the quality, which docs/benchmarks.md measures.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from genaug.digits import write_split_folders
from genaug.local_service import free_port, running_service
from genaug.service.pipeline.load import load_model
from genaug.service.pipeline.tiny import build_tiny_digits_pipeline
from genaug.service.testing import wait_ready

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "train_tiny_generator.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("tiny-train")
    data = write_split_folders(work / "digits", ["generator"], per_class=8)["generator"]
    out = work / "out"
    cmd = [sys.executable, str(SCRIPT), "--data", str(data),
           "--recipes", str(ROOT / "recipes" / "digits.yaml"), "--out", str(out),
           "--vae-steps", "4", "--vae-batch", "8", "--unet-steps", "8", "--unet-batch", "16",
           "--eval-per-label", "1", "--threads", "1", "--seed", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_outputs_and_record(trained: Path) -> None:
    for name in ("pipeline/model_index.json", "pipeline/trained_on.json", "unet.safetensors",
                 "tiny_digits.safetensors", "trained_on.json", "samples.png"):
        assert (trained / name).is_file(), name
    assert list((trained / "pipeline").rglob("*.safetensors"))
    assert not list((trained / "pipeline").rglob("*.bin"))
    record = json.loads((trained / "trained_on.json").read_text())
    assert record["dataset"] == "sklearn load_digits" and record["split"] == "generator"
    assert (record["vae_steps"], record["unet_steps"], record["seed"]) == (4, 8, 5)
    assert record["images"] == 80 and record["script_version"]
    assert record["labels"]["3"] == ["a handwritten three"]
    assert 0.0 <= record["fidelity"]["share"] <= 1.0 and record["fidelity"]["images"] == 10


def test_the_folder_loads_and_generates(trained: Path) -> None:
    model = load_model(source=trained / "pipeline", unet_weights=None, device="cpu",
                       dtype="auto")
    assert model.kind == "diffusers"
    assert model.trained_on is not None and model.trained_on["unet_steps"] == 8
    with torch.inference_mode():
        image = model.pipeline("a handwritten three", num_inference_steps=4,
                               generator=torch.Generator().manual_seed(1), output_type="np",
                               height=64, width=64).images
    assert image.shape == (1, 64, 64, 3) and np.isfinite(image).all()

    # The UNet alone loads over the same-architecture base, and equals the folder's UNet.
    tuned = load_model(source="tiny-random", unet_weights=trained / "unet.safetensors",
                       device="cpu", dtype="auto")
    pipe: Any = model.pipeline
    assert torch.equal(tuned.pipeline.unet.conv_in.weight, pipe.unet.conv_in.weight)

    # The single file is the embedded default's format.
    packed, record = build_tiny_digits_pipeline(weights=trained / "tiny_digits.safetensors")
    assert record == model.trained_on
    assert packed.vae.config.scaling_factor == pytest.approx(pipe.vae.config.scaling_factor)
    assert torch.equal(packed.text_encoder_2.text_projection.weight,
                       pipe.text_encoder_2.text_projection.weight)


def test_genaug_serve_loads_the_folder(trained: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with running_service(port, extra_args=["--model", str(trained / "pipeline"),
                                     "--default-size", "64", "--default-steps", "4"],
                         entry=("-m", "genaug.cli", "serve"), log_path=log) as proc:
        wait_ready(url, timeout=120, alive=lambda: proc.poll() is None)
        info = httpx.get(url + "/v1/info").json()
        assert info["model"]["kind"] == "diffusers"
        assert info["model"]["source"] == str(trained / "pipeline")
        response = httpx.post(url + "/v1/generate", timeout=60, json={
            "prompt": "a handwritten seven", "seed": 2})
        assert response.status_code == 200, response.text


def test_labels_option_picks_the_recipe_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--labels 0-4`` (how tiny-digits-base was made) and its spellings; no training."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_tiny_generator", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_tiny_generator", script)  # for its dataclass
    spec.loader.exec_module(script)
    digits = [str(d) for d in range(10)]
    assert script.parse_labels(None, digits) == digits
    assert script.parse_labels("0-4", digits) == ["0", "1", "2", "3", "4"]
    assert script.parse_labels("4,3, 2,1,0", digits) == ["0", "1", "2", "3", "4"]
    assert script.parse_labels("0-1,7", digits) == ["0", "1", "7"]
    for bad in ("0-12", "x", "", "4-2"):
        with pytest.raises(SystemExit):
            script.parse_labels(bad, digits)
    cfg = script.parse(["--data", "d", "--recipes", "r", "--out", "o", "--labels", "0-4",
                        "--name", "tiny_digits_base"])
    assert (cfg.labels, cfg.name) == ("0-4", "tiny_digits_base")
