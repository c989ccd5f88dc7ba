"""FP8 (service/pipeline/quantize.py, GENAUG_QUANTIZE=fp8): refused in one line where the device
has none, a one-line hint when torchao is missing, the layers it would quantize, and the real
thing on the CPU.

The quantization itself needs FP8 tensor cores (compute capability 8.9 or more) and torchao
refuses the CPU; but torch 2.13's ``torch._scaled_mm`` runs on the CPU, so with the hardware
check set aside (:func:`fp8_on_the_cpu`) the product's own path runs end to end on tiny-digits:
it found the NaN the GPU showed (rows of zeros, the unconditional half's cross-attention output,
quantized with a scale of 0). Without torchao these tests skip, except in CI, where they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from genaug.service.app import check_startup
from genaug.service.batching.items import GroupKey, Item
from genaug.service.pipeline import quantize
from genaug.service.pipeline.acceleration import Acceleration, AccelerationError
from genaug.service.pipeline.device import ModelLoadError
from genaug.service.pipeline.load import LoadedModel, load_model
from genaug.service.pipeline.quantize import (
    FP8_MIN_FEATURES,
    check_fp8,
    fp8_layer_filter,
    fp8_layers,
    fp8_refusal,
    load_torchao,
    nonfinite_advice,
    quantize_fp8,
)
from genaug.service.pipeline.quiet import held_back, quiet_third_party
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings
from genaug.service.testing import load_tiny, start_service
from genaug.wire import decode_batch

SDXL_UNET_CONFIG = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "sdxl" / "unet.json"
# tiny-digits' linear layers are 16 to 256 wide: at 32 features its UNet has 40 to quantize.
TINY_MIN_FEATURES = 32
TINY_FP8_LAYERS = 40
TINY_FP8_CONVS = 23  # tiny-digits' convolutions but conv_in and conv_out (4 channels)


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
    with pytest.raises(AccelerationError) as caught:
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
    model = load_tiny()
    with pytest.raises(AccelerationError, match="GENAUG_QUANTIZE=fp8 needs a CUDA GPU"):
        Acceleration.setup(model, Settings(quantize="fp8"))
    assert model.state.acceleration is None  # nothing was changed


def test_missing_torchao_names_the_extra_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import torchao...` raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(AccelerationError) as caught:
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
    with pytest.raises(AccelerationError, match=r"pip install 'genaug\[fp8\]'"):
        check_fp8(torch.device("cuda", 0))


def test_the_service_runs_without_torchao(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    assert check_startup(Settings(device="cpu"))["type"] == "cpu"
    acceleration = Acceleration.setup(load_tiny(), Settings())
    info = acceleration.info()
    assert info["quantize"] == "none" and info["quantized_layers"] == 0


def test_settings_take_none_or_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().quantize == "none"
    monkeypatch.setenv("GENAUG_QUANTIZE", "fp8")
    assert Settings().quantize == "fp8"
    with pytest.raises(ValueError, match="quantize"):
        Settings(quantize="int4")  # type: ignore[arg-type]


def test_fp8_with_lora_adapters_is_refused(tmp_path: Path) -> None:
    lora = tmp_path / "a.safetensors"
    lora.write_bytes(b"")
    with pytest.raises(AccelerationError, match="GENAUG_QUANTIZE=fp8 cannot be combined with"):
        Acceleration.setup(load_tiny(), Settings(quantize="fp8", loras=f"a={lora}"))


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
        def __init__(self, *, granularity: Any, activation_value_lb: float | None) -> None:
            self.granularity = granularity
            self.activation_value_lb = activation_value_lb

    def quantize_(model: torch.nn.Module, config: Any, filter_fn: Any) -> None:
        calls.append((model, config, [n for n, m in model.named_modules() if filter_fn(m, n)]))

    monkeypatch.setattr(quantize, "load_torchao", lambda: (quantize_, Config, PerRow))
    unet = build_tiny_pipeline().unet.to(torch.bfloat16)
    names = quantize_fp8(unet, min_features=32)
    assert names == chosen(unet, min_features=32)
    ((model, config, filtered),) = calls
    assert model is unet and isinstance(config.granularity, PerRow) and filtered == names
    assert config.activation_value_lb == quantize.FP8_ACTIVATION_LB  # no scale of 0
    assert fp8_layers(unet) == names  # recorded on the model, for the output guard
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


# -- the real thing on the CPU (torchao's hardware check set aside) --------------------------


def need_torchao() -> None:
    """Skip without torchao, except in CI (.ci/run sets CI; the Makefile installs the fp8
    extra), where its absence is a failure: these are the only tests that run FP8 for real."""
    if importlib.util.find_spec("torchao") is None:
        if os.environ.get("CI"):
            pytest.fail("torchao is not installed; CI installs '.[dev,trainer,fp8]' (Makefile)")
        pytest.skip("torchao is not installed (pip install 'genaug[fp8]')")


@contextlib.contextmanager
def fp8_on_the_cpu(min_features: int = TINY_MIN_FEATURES) -> Iterator[None]:
    """The product's FP8 path on the CPU: genaug's refusal and torchao's hardware assertion
    set aside (torch's ``_scaled_mm`` runs on the CPU), and a ``min_features`` the tiny UNet's
    layers reach. Everything else is what a GPU runs."""
    need_torchao()
    from torchao.quantization import quant_api

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quant_api, "_check_hardware_support", lambda granularities: None)
        patch.setattr(quantize, "fp8_refusal", lambda *args, **kwargs: None)
        patch.setattr(quantize, "FP8_MIN_FEATURES", min_features)
        yield


def digits(dtype: str = "bfloat16") -> LoadedModel:
    return load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype=dtype)


@pytest.fixture(scope="module")
def fp8_digits() -> LoadedModel:
    """tiny-digits in bf16 with the settings' FP8 applied, as a GPU machine would serve it."""
    model = digits()
    with fp8_on_the_cpu():
        acceleration = Acceleration.setup(model, Settings(quantize="fp8"))
    assert acceleration.info()["quantized_layers"] == TINY_FP8_LAYERS
    return model


def digit_items(per_label: int, seed: int = 40) -> tuple[list[Item], list[int]]:
    """``per_label`` images of each digit, with the recipe's prompts and 63-bit seeds drawn as
    the planner draws them."""
    from genaug.digits import PROMPTS

    labels = [d for d in range(10) for _ in range(per_label)]
    seeds = np.random.default_rng(seed).integers(0, 2**63 - 1, size=len(labels))
    items = [Item(PROMPTS[str(d)], seed=int(s), guidance=3.0, output_height=64, output_width=64)
             for d, s in zip(labels, seeds, strict=True)]
    return items, labels


def test_a_bf16_unet_is_required_in_one_line() -> None:
    with fp8_on_the_cpu(), pytest.raises(AccelerationError) as caught:
        quantize_fp8(build_tiny_pipeline().unet)  # float32, as the CPU's "auto" loads it
    message = one_line(str(caught.value))
    assert "quantizes bfloat16 layers" in message and "the UNet's are float32" in message
    assert "GENAUG_DTYPE=bfloat16" in message and "GENAUG_QUANTIZE=none" in message


def test_skip_keeps_layers_in_bf16_by_name() -> None:
    unet = build_tiny_pipeline().unet
    every = chosen(unet, min_features=TINY_MIN_FEATURES)
    kept = chosen(unet, min_features=TINY_MIN_FEATURES, skip=("attn2.to_out", "up_blocks.1."))
    assert kept and set(kept) < set(every)
    assert not any("attn2.to_out" in n or n.startswith("up_blocks.1.") for n in kept)
    assert set(every) - set(kept) == {
        n for n in every if "attn2.to_out" in n or n.startswith("up_blocks.1.")}


def test_fp8_rows_of_zeros_stay_zeros_not_nan() -> None:
    """The unconditional half's cross-attention output is all zeros (zero text states, values
    without bias): a per-row scale of 0 made 0/0 = NaN of every image with guidance."""
    with fp8_on_the_cpu(min_features=16):
        layer = torch.nn.Linear(64, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            layer.bias.fill_(0.25)
        holder = torch.nn.Sequential()
        holder.add_module("to_out", layer)
        assert quantize_fp8(holder) == ["to_out"]
    x = torch.zeros(2, 5, 64, dtype=torch.bfloat16)
    x[0] = torch.randn(5, 64)
    y = layer(x)
    assert torch.isfinite(y).all()
    assert torch.equal(y[1], torch.full((5, 64), 0.25, dtype=torch.bfloat16))  # the bias only


def test_the_output_guard_names_fp8_when_it_is_on(fp8_digits: LoadedModel) -> None:
    worker = PipelineWorker(fp8_digits)
    unet = fp8_digits.pipeline.unet

    def overflow(module: Any, args: Any, output: Any) -> Any:
        sample = output[0] if isinstance(output, tuple) else output.sample
        sample[0] = float("nan")  # one row of the UNet's output, as the GPU's FP8 made
        return output

    handle = unet.register_forward_hook(overflow)
    try:
        items, _ = digit_items(1)
        outcome = worker.run(GroupKey(height=64, width=64, steps=2), items[:2])
    finally:
        handle.remove()
    assert 0 in outcome.errors
    message = one_line(outcome.errors[0])
    assert "with GENAUG_QUANTIZE=fp8 (40 UNet layers in float8)" in message
    assert "set GENAUG_QUANTIZE=none" in message
    assert "GENAUG_DTYPE" not in message  # the old advice, wrong with FP8 on


@pytest.mark.parametrize(("dtype", "fix"), [
    (torch.float16, "use GENAUG_DTYPE=bfloat16 or float32"),
    (torch.bfloat16, "use GENAUG_DTYPE=float32"),
    (torch.float32, "check the model's weights"),
])
def test_without_fp8_the_guard_advises_by_the_unets_dtype(dtype: torch.dtype, fix: str) -> None:
    unet = torch.nn.Linear(4, 4).to(dtype)
    unet.dtype = dtype  # type: ignore[assignment]  # diffusers' ModelMixin has one
    advice = nonfinite_advice(unet)
    assert fix in advice and "GENAUG_QUANTIZE" not in advice


def test_a_model_with_fp8_is_served_whatever_genaug_device_says(
    fp8_digits: LoadedModel,
) -> None:
    """The GPU bench hands the service a model it built on CUDA, with Settings whose device is
    the default cpu: the FP8 check must read the model, not GENAUG_DEVICE. Here the model had
    FP8 applied where it was allowed and is served with the hardware check back in force."""
    settings = dict(quantize="fp8", device="cpu", max_batch_images=2, warmup=False)
    with start_service(fp8_digits, record=False, **settings) as live:
        info = httpx.get(live.url + "/v1/info").json()
        got = info["acceleration"]
        assert got["quantize"] == "fp8" and got["quantized_layers"] == 40
        r = httpx.post(live.url + "/v1/generate",
                       json={"prompt": "a handwritten seven", "n": 2, "steps": 4,
                             "seed": 2**62 + 12345}, timeout=120)
        assert r.status_code == 200, r.text
        images = decode_batch(r.content).images
        assert images.shape == (2, 64, 64, 3) and images.std() > 10


@pytest.mark.slow  # 30 images in bf16, 30 in each FP8 (emulated on the CPU): ~90 s
@pytest.mark.timeout(900)
def test_fp8_draws_the_digits_bf16_draws() -> None:
    """The product's FP8 paths end to end on tiny-digits: ``fp8`` (40 linear layers in
    float8) and ``fp8-conv`` (and 23 convolutions: all but conv_in and conv_out): finite
    images that the outside classifier reads within 3 points of the same seeds in bf16 (one
    image of the 30, 3.3 points, is the least difference 30 images can show)."""
    from genaug.digits import fidelity

    torch.set_num_threads(1)
    items, labels = digit_items(per_label=3)
    key = GroupKey(height=64, width=64, steps=8)
    read = {}
    layers = {"fp8": TINY_FP8_LAYERS, "fp8-conv": TINY_FP8_LAYERS + TINY_FP8_CONVS}
    for name in ("bf16", "fp8", "fp8-conv"):
        model = digits()
        if name != "bf16":
            with fp8_on_the_cpu():
                assert Acceleration.setup(model, Settings(quantize=name)).info()[
                    "quantized_layers"] == layers[name]
        worker = PipelineWorker(model)
        images = []
        for start in range(0, len(items), 10):
            outcome = worker.run(key, items[start:start + 10])
            assert outcome.errors == {}, outcome.errors  # the guard saw no NaN/Inf
            images += outcome.images
        read[name] = fidelity(np.stack(images), labels)
    assert read["bf16"] >= 0.9, read
    for name in ("fp8", "fp8-conv"):
        assert abs(read[name] - read["bf16"]) <= max(0.03, 1 / len(items)), read


@pytest.mark.gpu
def test_fp8_draws_finite_digits_on_a_gpu() -> None:
    """On a GPU with FP8, no setting aside: tiny-digits' 40 layers in float8, with guidance
    (rows of zeros in every unconditional half), draws finite images."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs a CUDA GPU with compute capability 8.9 or more")
    pytest.importorskip("torchao")
    model = load_model(source="tiny-digits", unet_weights=None, device="cuda", dtype="bfloat16")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantize, "FP8_MIN_FEATURES", TINY_MIN_FEATURES)
        acceleration = Acceleration.setup(model, Settings(device="cuda", quantize="fp8"))
    assert acceleration.info()["quantized_layers"] == TINY_FP8_LAYERS
    items, _ = digit_items(1)
    outcome = PipelineWorker(model).run(GroupKey(height=64, width=64, steps=8), items)
    assert outcome.errors == {}, outcome.errors
    assert np.stack(outcome.images).std() > 10


# -- torchao's noise at start ----------------------------------------------------------------


def test_torchao_lines_are_held_back_and_logged_when_fp8_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_third_party()
    caplog.set_level(logging.INFO)
    line = "Failed to load /site/torchao/_C_test_h7.so: Could not load this library"
    logging.getLogger("torchao").warning(line)
    logging.getLogger("torch.utils._pytree").warning(
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque "
        "value type.", "<enum 'KernelPreference'>")
    assert "_C_test_h7" not in caplog.text and "Enum subclass" not in caplog.text
    assert line in held_back("torchao")
    logging.getLogger("torchao").warning("something torchao means")  # other lines pass
    assert "something torchao means" in caplog.text

    monkeypatch.setattr(quantize, "load_torchao", lambda: (lambda *a, **k: None, None, None))
    quantize_fp8(torch.nn.Sequential())
    assert f"torchao at import: {line}" in caplog.text  # with FP8 on, it may matter
    assert line not in held_back("torchao")  # said once


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None and not os.environ.get("CI"),
                    reason="torchao is not installed: nothing to be quiet about")
def test_genaug_serve_with_fp8_off_logs_nothing_of_torchao(tmp_path: Path) -> None:
    """transformers and diffusers import torchao whenever it is installed; `genaug serve`
    with FP8 off says nothing of it (its libraries, Triton, pytree, diffusers' torchao)."""
    import signal
    import subprocess
    import time

    from genaug.local_service import free_port

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GENAUG_WARMUP": "false",
           "GENAUG_POOL_PATH": str(tmp_path / "pool.sqlite")}
    env.pop("GENAUG_QUANTIZE", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "genaug.service", "--port", str(port)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and process.poll() is None and not ready:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.5)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert ready, stderr[-3000:]
    assert "ready: tiny-digits" in stderr  # the service's own lines are there
    for noise in ("torchao", "Enum subclass", "Detected no triton", "Failed to load"):
        assert noise not in stderr, stderr[-3000:]


# -- FP8 convolutions ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel", "stride", "padding"), [(3, 1, 1), (1, 1, 0), (3, 2, 1)])
def test_an_fp8_convolution_computes_the_convolution(kernel: int, stride: int,
                                                      padding: int) -> None:
    """What Fp8Conv2d computes is the bf16 convolution within float8's error (a few percent),
    with the bias, for 3x3, 1x1 and strided (the downsamplers') convolutions; a row of zeros
    stays zeros (its scale is bounded away from 0), never NaN."""
    from genaug.service.pipeline.fp8_conv import Fp8Conv2d, fp8_conv_filter

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 64, kernel, stride=stride, padding=padding).to(torch.bfloat16)
    x = torch.randn(2, 32, 16, 16, dtype=torch.bfloat16)
    x[1] = 0  # the unconditional half of a guided batch can be all zeros
    layer = Fp8Conv2d(conv).to(torch.bfloat16)  # as the UNet's .to(dtype): float8 stays
    assert layer.weight_fp8.dtype == torch.float8_e4m3fn
    assert layer.weight_scale.dtype == torch.float32
    got, want = layer(x).float(), conv(x).float()
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 0.06
    assert torch.allclose(got[1], want[1], atol=0.02)  # the bias alone, where x is zeros
    assert fp8_conv_filter(conv, "down_blocks.0.resnets.0.conv1")
    assert not fp8_conv_filter(conv, "conv_in", ("conv_in",))
    assert not fp8_conv_filter(torch.nn.Conv2d(4, 32, 3), "conv_in")  # 4 latent channels
    assert not fp8_conv_filter(torch.nn.Conv2d(32, 32, 3, groups=2), "x")
