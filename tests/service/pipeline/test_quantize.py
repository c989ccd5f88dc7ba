"""FP8 (service/pipeline/quantize.py, GENAUG_QUANTIZE=fp8): refused in one line where the device
has none, a one-line hint when torchao is missing, and the layers it would quantize.

The quantization itself needs FP8 tensor cores (compute capability 8.9 or more): torchao
refuses the CPU, so here its call is checked with a stand-in for torchao (which layers, which
configuration), and the real call waits for a GPU (``gpu`` marker).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from genaug.service.app import check_startup
from genaug.service.pipeline import quantize
from genaug.service.pipeline.device import ModelLoadError
from genaug.service.pipeline.quantize import (
    FP8_MIN_FEATURES,
    check_fp8,
    fp8_layer_filter,
    fp8_refusal,
    load_torchao,
    quantize_fp8,
)
from genaug.service.pipeline.speed import Speed, SpeedError
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.settings import Settings

SDXL_UNET_CONFIG = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "sdxl" / "unet.json"


def one_line(text: str) -> str:
    assert "\n" not in text, text
    return text


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_devices_with_fp8_are_not_refused(capability: tuple[int, int]) -> None:
    assert fp8_refusal("cuda:0", capability, "NVIDIA H100 80GB HBM3") is None


def test_an_older_gpu_is_refused_naming_it_and_its_capability() -> None:
    message = one_line(fp8_refusal("cuda:1", (8, 0), "NVIDIA A100-SXM4-80GB") or "")
    assert "cuda:1 (NVIDIA A100-SXM4-80GB) has compute capability 8.0" in message
    assert "compute capability 8.9 or more" in message
    assert "Set GENAUG_QUANTIZE=none" in message


def test_the_cpu_is_refused_in_one_line_naming_the_device_and_its_capability() -> None:
    with pytest.raises(SpeedError) as caught:
        check_fp8(torch.device("cpu"))
    message = one_line(str(caught.value))
    assert message.startswith("GENAUG_QUANTIZE=fp8 needs a CUDA GPU with compute capability 8.9")
    assert "cpu has no compute capability (not a CUDA GPU)" in message
    assert "GENAUG_QUANTIZE=none" in message


def test_start_up_refuses_fp8_on_the_cpu_before_anything_loads() -> None:
    with pytest.raises(ModelLoadError) as caught:
        check_startup(Settings(device="cpu", quantize="fp8"))
    assert "cpu has no compute capability" in one_line(str(caught.value))


def test_applying_fp8_to_a_cpu_model_is_refused_too() -> None:
    pipeline = build_tiny_pipeline()
    with pytest.raises(SpeedError, match="GENAUG_QUANTIZE=fp8 needs a CUDA GPU"):
        Speed.setup(pipeline, Settings(quantize="fp8"))
    assert not hasattr(pipeline, "_genaug_speed")  # nothing was changed


def test_missing_torchao_names_the_extra_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import torchao...` raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(SpeedError) as caught:
        load_torchao()
    message = one_line(str(caught.value))
    assert message.startswith("GENAUG_QUANTIZE=fp8 needs torchao, which is not installed")
    assert "pip install 'genaug[fp8]'" in message and "GENAUG_QUANTIZE=none" in message


def test_missing_torchao_is_reported_on_a_device_that_has_fp8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    with pytest.raises(SpeedError, match=r"pip install 'genaug\[fp8\]'"):
        check_fp8(torch.device("cuda", 0))


def test_the_service_runs_without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    assert check_startup(Settings(device="cpu"))["type"] == "cpu"
    speed = Speed.setup(build_tiny_pipeline(), Settings())
    assert speed.info()["quantize"] == "none" and speed.info()["quantized_layers"] == 0


def test_settings_take_none_or_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().quantize == "none"
    monkeypatch.setenv("GENAUG_QUANTIZE", "fp8")
    assert Settings().quantize == "fp8"
    with pytest.raises(ValueError, match="quantize"):
        Settings(quantize="int4")  # type: ignore[arg-type]


def test_fp8_with_lora_adapters_is_refused(tmp_path: Path) -> None:
    lora = tmp_path / "a.safetensors"
    lora.write_bytes(b"")
    with pytest.raises(SpeedError, match="GENAUG_QUANTIZE=fp8 cannot be combined with"):
        Speed.setup(build_tiny_pipeline(), Settings(quantize="fp8", loras=f"a={lora}"))


# -- which layers ---------------------------------------------------------------------------


def chosen(unet: torch.nn.Module, **kwargs: Any) -> list[str]:
    return [n for n, m in unet.named_modules() if fp8_layer_filter(m, n, **kwargs)]


def test_the_tiny_unet_is_too_small_for_fp8_at_the_documented_threshold() -> None:
    unet = build_tiny_pipeline().unet
    widest = max(min(m.in_features, m.out_features) for m in unet.modules()
                 if isinstance(m, torch.nn.Linear))
    assert widest < FP8_MIN_FEATURES
    assert chosen(unet) == []


def test_the_filter_takes_large_token_wise_linear_layers_only() -> None:
    unet = build_tiny_pipeline().unet
    layers = dict(unet.named_modules())
    picked = chosen(unet, min_features=32)
    assert picked, "at 32 features the tiny UNet has layers to quantize"
    for name in picked:
        module = layers[name]
        assert isinstance(module, torch.nn.Linear)
        assert min(module.in_features, module.out_features) >= 32
    # Self-attention projections and feed-forwards are in; per-image or per-text-token inputs
    # (time and added embeddings, cross-attention keys and values) are out whatever their size.
    assert any(n.endswith("attn1.to_q") for n in picked)
    assert any(n.endswith("attn2.to_q") for n in picked)
    assert any(".ff.net." in n for n in picked)
    for skipped in ("attn2.to_k", "attn2.to_v", "time_emb", "add_embedding"):
        assert not any(skipped in n for n in picked), skipped
    big_cross = [n for n, m in layers.items() if n.endswith("attn2.to_k")
                 and isinstance(m, torch.nn.Linear) and min(m.in_features, m.out_features) >= 32]
    assert big_cross, "the name rule, not the size, keeps cross-attention keys out"
    # Convolutions and norms are never chosen.
    assert not fp8_layer_filter(unet.conv_in, "conv_in", min_features=1)


def test_on_sdxl_the_filter_takes_the_1280_wide_level_and_leaves_the_640_wide_one() -> None:
    import json

    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(json.loads(SDXL_UNET_CONFIG.read_text()))
    picked = chosen(unet)
    assert "down_blocks.2.attentions.0.transformer_blocks.0.attn1.to_q" in picked
    assert "down_blocks.2.attentions.0.transformer_blocks.0.ff.net.0.proj" in picked
    assert "down_blocks.2.attentions.0.transformer_blocks.0.ff.net.2" in picked
    assert "mid_block.attentions.0.proj_in" in picked
    assert not any(n.startswith("down_blocks.1.") for n in picked)  # 640 wide
    assert not any("attn2.to_k" in n or "attn2.to_v" in n for n in picked)
    # 1280-wide transformer blocks: down 2 x 10, mid 10, up 3 x 10 = 60, each with
    # to_q, to_k, to_v, to_out of attn1, to_q and to_out of attn2, two feed-forward layers.
    blocks = [n for n in picked if n.endswith("attn1.to_q")]
    assert len(blocks) == 60
    proj = [n for n in picked if n.endswith(("proj_in", "proj_out"))]
    assert len(picked) == 60 * 8 + len(proj)
    assert len(proj) == 2 * (2 + 1 + 3)  # the 1280-wide Transformer2DModels' own projections


def test_quantize_calls_torchao_with_per_row_scales_on_the_chosen_layers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in for torchao (it refuses the CPU): which layers and which configuration."""
    calls: list[tuple[Any, Any, list[str]]] = []

    class PerRow:
        pass

    class Config:
        def __init__(self, *, granularity: Any) -> None:
            self.granularity = granularity

    def quantize_(model: torch.nn.Module, config: Any, filter_fn: Any) -> None:
        calls.append((model, config, [n for n, m in model.named_modules() if filter_fn(m, n)]))

    monkeypatch.setattr(quantize, "load_torchao", lambda: (quantize_, Config, PerRow))
    unet = build_tiny_pipeline().unet
    names = quantize_fp8(unet, min_features=32)
    assert names == chosen(unet, min_features=32)
    ((model, config, filtered),) = calls
    assert model is unet and isinstance(config.granularity, PerRow) and filtered == names
    assert quantize_fp8(unet) == [] and len(calls) == 1  # nothing to quantize: no call


@pytest.mark.gpu
def test_fp8_quantizes_on_a_gpu_that_has_it() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU with compute capability 8.9 or more")
    pytest.importorskip("torchao")
    unet = build_tiny_pipeline().unet.to("cuda", torch.bfloat16)
    names = quantize_fp8(unet, min_features=32)
    assert names
    weight = dict(unet.named_modules())[names[0]].weight
    assert "Float8" in type(weight).__name__


def test_genaug_serve_with_fp8_on_the_cpu_exits_2_with_one_line() -> None:
    import os
    import re
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GENAUG_QUANTIZE": "fp8",
           "GENAUG_DEVICE": "cpu"}
    run = subprocess.run([sys.executable, "-m", "genaug.service", "--port", "1"],
                         capture_output=True, text=True, timeout=180, env=env)
    # one line says what is wrong (log records, timestamped, may precede it)
    lines = [line for line in run.stderr.splitlines()
             if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("genaug serve: GENAUG_QUANTIZE=fp8 needs a CUDA GPU")
    assert "cpu has no compute capability" in lines[0]
