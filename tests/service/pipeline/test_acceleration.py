"""Acceleration options (service/pipeline/acceleration.py): each runs, is reported, and keeps
the same seed's image. The warm-up plan and the shape tracker are
tests/service/pipeline/test_warmup.py.

Every option is checked on the tiny pipeline built with true batching
(``batch_invariant=False``, as a real SDXL pipeline runs): the default per-image tiny
pipeline decodes one image at a time, so VAE slicing would have nothing to do.

Tolerances, same seeds, option on vs. off, uint8 pixels:

- channels_last, fuse_qkv, torch.compile (float32 on the CPU: other kernels, other summation
  order): at most 2 levels of 255 anywhere, mean difference under 0.02 levels (measured: at
  most 1 level, on ~0.01 % of the pixels).
- vae_slicing: identical (the same kernels, one image at a time).
- vae_tiling: identical below the VAE's sample size (64 px for the tiny model: no tiling);
  above it the tiles are decoded separately and blended, so pixels differ: PSNR at least
  24 dB (measured ~27 dB at 128 px on the random-weight tiny VAE; a trained VAE with SDXL's
  128-latent tiles differs far less).

Compilation takes tens of seconds on a CPU: one end-to-end compile test is in the default
suite, the others are marked ``slow``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from genaug.client import Client
from genaug.service.batching.items import GroupKey, Item
from genaug.service.pipeline.acceleration import Acceleration, AccelerationError, apply_acceleration
from genaug.service.pipeline.acceleration_options import AccelerationOptions
from genaug.service.pipeline.load import LoadedModel, ModelState
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.pipeline.warmup import ShapeTracker
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings, WarmupShape, parse_warmup_shapes
from genaug.service.testing import load_tiny, start_service

MAX_LEVELS = 2  # largest uint8 difference allowed for the numerically equivalent options
MAX_MEAN_LEVELS = 0.02
MIN_TILING_PSNR_DB = 24.0
PROMPT = "a red circle on a blue square"


def batched_tiny() -> LoadedModel:
    """A fresh tiny model (options change it in place) that runs batches as batches."""
    model = load_tiny()
    pipeline = build_tiny_pipeline(batch_invariant=False)
    return dataclasses.replace(model, pipeline=pipeline)


def items(n: int, size: int = 64, seed: int = 7) -> list[Item]:
    return [
        Item(PROMPT, seed=seed + i, guidance=5.0, output_height=size, output_width=size)
        for i in range(n)
    ]


def generate(options: AccelerationOptions, n: int = 3, size: int = 64,
             steps: int = 3) -> np.ndarray:
    model = batched_tiny()
    assert apply_acceleration(model, options) == options
    outcome = PipelineWorker(model).run(GroupKey(size, size, steps), items(n, size))
    assert outcome.errors == {}
    return np.stack(outcome.images).astype(np.int16)


@pytest.fixture(scope="module")
def baseline() -> np.ndarray:
    return generate(AccelerationOptions())


def assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= MAX_LEVELS, f"max difference {diff.max()} levels"
    assert diff.mean() <= MAX_MEAN_LEVELS, f"mean difference {diff.mean():.4f} levels"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


# -- settings -------------------------------------------------------------------------------


def test_speed_settings_default_to_off() -> None:
    s = Settings()
    assert (s.compile, s.channels_last, s.fuse_qkv, s.vae_slicing, s.vae_tiling) == (
        "off", False, False, False, False
    )
    assert (s.compile_mode, s.quantize, s.attention) == ("default", "none", "auto")
    assert s.warmup_shapes == ()
    # The settings choose the attention kernel (auto); the options' own default is torch's.
    assert AccelerationOptions.from_settings(s) == AccelerationOptions(attention="auto")
    assert AccelerationOptions().label == "baseline"
    assert AccelerationOptions(attention="auto").label == "attention=auto"


def test_warmup_shapes_parse_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAUG_WARMUP_SHAPES", " 1024x1024:8, 768X1024:4,1024x1024:8")
    monkeypatch.setenv("GENAUG_COMPILE", "regional")
    s = Settings()
    assert s.warmup_shapes == (WarmupShape(1024, 1024, 8), WarmupShape(768, 1024, 4))
    assert [str(x) for x in s.warmup_shapes] == ["1024x1024:8", "768x1024:4"]
    assert s.compile == "regional"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1024x1024", "is not HxW:batch; write e.g. 1024x1024:8"),
        ("1020x1024:8", "height 1020 is not a positive multiple of 8"),
        ("64x64:0", "batch 0 must be >= 1"),
        ("64x64:9", "batch 9 exceeds max_batch_images 8"),
        ("4096x64:1", "4096x64:1 exceeds max_side 2048; raise GENAUG_MAX_SIDE"),
    ],
)
def test_bad_warmup_shapes_name_the_entry_and_the_fix(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Settings(warmup_shapes=value)


def test_unknown_compile_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="compile"):
        Settings(compile="everything")  # type: ignore[arg-type]
    with pytest.raises(AccelerationError, match="GENAUG_COMPILE"):
        AccelerationOptions(compile="everything")  # type: ignore[arg-type]


def test_options_parse_and_label() -> None:
    options = AccelerationOptions.parse("compile=regional, channels_last,fuse_qkv")
    assert options == AccelerationOptions(compile="regional", channels_last=True, fuse_qkv=True)
    assert options.label == "compile=regional+channels_last+fuse_qkv"
    assert AccelerationOptions.parse("baseline") == AccelerationOptions()
    assert (AccelerationOptions.parse("vae_tiling=false,vae_slicing")
            == AccelerationOptions(vae_slicing=True))
    with pytest.raises(AccelerationError, match="unknown acceleration option 'turbo'"):
        AccelerationOptions.parse("turbo")


def test_parse_warmup_shapes_accepts_lists() -> None:
    assert parse_warmup_shapes(["64x64:2", (128, 96, 1)]) == (
        WarmupShape(64, 64, 2), WarmupShape(128, 96, 1)
    )
    assert parse_warmup_shapes("") == ()


# -- applying options -----------------------------------------------------------------------


def test_all_off_changes_nothing() -> None:
    model = batched_tiny()
    before = {k: v.clone() for k, v in model.pipeline.unet.state_dict().items()}
    acceleration = Acceleration.setup(model, Settings())
    assert acceleration.info() == {
        "compile": "off",
        "compile_mode": "default",
        "quantize": "none",
        "quantized_layers": 0,
        "attention": "auto",
        "attention_backend": "default",  # the CPU: torch's own choice
        "batch_sizes": [],
        "channels_last": False,
        "fuse_qkv": False,
        "vae_slicing": False,
        "vae_tiling": False,
        "compiled_shapes": [],
        "warmup": None,
        "compile_cache": None, "unet_package": "not used",
        "recompiles": 0,
    }
    after = model.pipeline.unet.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.state.acceleration is None
    worker = PipelineWorker(model)
    assert acceleration.wrap(worker) is worker  # nothing to track without compilation


def test_channels_last_runs_is_reported_and_keeps_the_image(baseline: np.ndarray) -> None:
    model = batched_tiny()
    acceleration = Acceleration.setup(model, Settings(channels_last=True))
    assert acceleration.info()["channels_last"] is True
    conv = model.pipeline.unet.conv_in.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    outcome = PipelineWorker(model).run(GroupKey(64, 64, 3), items(3))
    assert_close(np.stack(outcome.images), baseline)


def test_fuse_qkv_runs_is_reported_and_keeps_the_image(baseline: np.ndarray) -> None:
    model = batched_tiny()
    acceleration = Acceleration.setup(model, Settings(fuse_qkv=True))
    assert acceleration.info()["fuse_qkv"] is True
    processors = {type(p).__name__ for p in model.pipeline.unet.attn_processors.values()}
    assert processors == {"FusedAttnProcessor2_0"}
    assert any(hasattr(m, "to_qkv") for m in model.pipeline.unet.modules())  # self-attention
    assert any(hasattr(m, "to_kv") for m in model.pipeline.unet.modules())  # cross-attention
    outcome = PipelineWorker(model).run(GroupKey(64, 64, 3), items(3))
    assert_close(np.stack(outcome.images), baseline)


def test_vae_slicing_decodes_one_image_at_a_time_and_keeps_the_image(
    baseline: np.ndarray,
) -> None:
    model = batched_tiny()
    acceleration = Acceleration.setup(model, Settings(vae_slicing=True))
    assert acceleration.info()["vae_slicing"] is True
    calls: list[int] = []
    decoder = model.pipeline.vae.decoder
    decoder.register_forward_pre_hook(lambda _m, args: calls.append(int(args[0].shape[0])))
    outcome = PipelineWorker(model).run(GroupKey(64, 64, 3), items(3))
    assert calls == [1, 1, 1]
    got = np.stack(outcome.images)
    assert np.array_equal(got, baseline)


def test_vae_tiling_tiles_only_above_the_vae_size_within_the_stated_psnr(
    baseline: np.ndarray,
) -> None:
    tiled = generate(AccelerationOptions(vae_tiling=True))
    assert np.array_equal(tiled, baseline)  # 64 px: the tiny VAE's own size, no tiles
    big_ref = generate(AccelerationOptions(), n=2, size=128)
    model = batched_tiny()
    acceleration = Acceleration.setup(model, Settings(vae_tiling=True))
    assert acceleration.info()["vae_tiling"] is True
    shapes: list[tuple[int, ...]] = []
    model.pipeline.vae.decoder.register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape[2:]))
    )
    outcome = PipelineWorker(model).run(GroupKey(128, 128, 3), items(2, size=128))
    # Tiles of at most 8x8 latents (the edges smaller), never the whole 16x16, several each.
    assert len(shapes) > 2 and all(max(s) <= 8 for s in shapes), shapes
    big = np.stack(outcome.images)
    assert not np.array_equal(big, big_ref)
    assert psnr(big, big_ref) >= MIN_TILING_PSNR_DB


def test_same_options_twice_is_a_noop_and_other_options_are_refused() -> None:
    model = batched_tiny()
    options = AccelerationOptions(fuse_qkv=True)
    apply_acceleration(model, options)
    fused = [m.to_qkv for m in model.pipeline.unet.modules() if hasattr(m, "to_qkv")]
    assert apply_acceleration(model, options) == options
    again = [m.to_qkv for m in model.pipeline.unet.modules() if hasattr(m, "to_qkv")]
    assert all(a is b for a, b in zip(fused, again, strict=True))
    with pytest.raises(AccelerationError, match="already has the acceleration options fuse_qkv"):
        apply_acceleration(model, AccelerationOptions(channels_last=True))


def test_fused_projections_are_refused_with_lora_adapters(tmp_path: Any) -> None:
    lora = tmp_path / "a.safetensors"
    lora.write_bytes(b"")
    settings = Settings(fuse_qkv=True, loras=f"a={lora}")
    with pytest.raises(AccelerationError,
                       match="GENAUG_FUSE_QKV cannot be combined with GENAUG_LORAS"):
        Acceleration.setup(batched_tiny(), settings)


def test_an_option_the_model_cannot_take_names_the_setting() -> None:
    def refuse() -> None:
        raise ValueError("`fuse_qkv_projections()` is not supported for added KV projections")

    pipeline = SimpleNamespace(
        unet=SimpleNamespace(fuse_qkv_projections=refuse), vae=SimpleNamespace()
    )
    model = SimpleNamespace(pipeline=pipeline, state=ModelState())
    with pytest.raises(AccelerationError, match="GENAUG_FUSE_QKV.*set GENAUG_FUSE_QKV=false"):
        apply_acceleration(model, AccelerationOptions(fuse_qkv=True))  # type: ignore[arg-type]
    assert model.state.acceleration is None


# -- the lifespan's handle ------------------------------------------------------------------


def test_acceleration_keeps_the_info_dict_current_and_leaves_other_keys() -> None:
    info: dict[str, Any] = {"scheduler": "euler"}
    options = AccelerationOptions(compile="regional", fuse_qkv=True)
    acceleration = Acceleration(options, ShapeTracker(active=True), publish=info.update)
    assert info == {
        "scheduler": "euler", "compile": "regional", "compile_mode": "default",
        "quantize": "none", "quantized_layers": 0, "attention": "default",
        "attention_backend": "default", "batch_sizes": [], "channels_last": False,
        "fuse_qkv": True, "vae_slicing": False, "vae_tiling": False, "compiled_shapes": [],
        "warmup": None, "compile_cache": None, "unet_package": "not used", "recompiles": 0,
    }
    acceleration.tracker.mark_compiled(GroupKey(64, 64, 2), 2)
    acceleration.tracker.observe(GroupKey(64, 64, 4), 1)
    assert info["compiled_shapes"] == ["64x64:2", "64x64:1"]
    assert info["scheduler"] == "euler"


# -- through the service --------------------------------------------------------------------


def acceleration_info(live: Any) -> dict[str, Any]:
    """``GET /v1/info``'s acceleration group."""
    info: dict[str, Any] = httpx.get(live.url + "/v1/info", timeout=10).json()["acceleration"]
    return info


def test_service_applies_options_and_serves_the_same_images(baseline: np.ndarray) -> None:
    model = batched_tiny()
    settings = dict(channels_last=True, fuse_qkv=True, vae_slicing=True, max_batch_images=3)
    with start_service(model, **settings) as live:
        info = acceleration_info(live)
        assert {k: info[k] for k in settings if k in info} == {
            "channels_last": True, "fuse_qkv": True, "vae_slicing": True
        }
        assert info["compile"] == "off" and info["compiled_shapes"] == []
        with Client(live.url) as client:
            got = client.generate(PROMPT, n=3, seed=7, height=64, width=64, steps=3,
                                  guidance=5.0).images
        assert live.metric("genaug_recompiles_total") == 0
    assert_close(got, baseline)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Compiled code is cached per code object process-wide: start and end clean."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def check_compiled_service(compile_mode: str, extra: dict[str, Any], baseline: np.ndarray) -> None:
    """Warm-up compiles 64x64 at max_batch_images=3 before /readyz (genaug_compiles_total);
    the same seeds give the baseline's images; batches of other sizes (one guided image, a UNet
    batch of 2; one unguided, a UNet batch of 1 run as 2) compile nothing new: the batch
    dimension is dynamic."""
    model = batched_tiny()
    before = compiled_graphs()  # dynamo's counters are the process's
    with start_service(
        model, compile=compile_mode, max_batch_images=3, ready_timeout=600, **extra
    ) as live:
        info = acceleration_info(live)
        assert info["compile"] == compile_mode
        assert "64x64:3" in info["compiled_shapes"]
        assert info["warmup"]["finished"] and info["compile_cache"]["state"].startswith("saved")
        graphs = compiled_graphs()
        assert graphs > before and live.metric("genaug_compiles_total") == graphs - before
        with Client(live.url, timeout=600) as client:
            got = client.generate(PROMPT, n=3, seed=7, height=64, width=64, steps=3,
                                  guidance=5.0, timeout_s=600).images
            one = client.generate(PROMPT, n=1, seed=7, height=64, width=64, steps=3,
                                  guidance=5.0, timeout_s=600).images
            alone = client.generate(PROMPT, n=1, seed=7, height=64, width=64, steps=3,
                                    guidance=1.0, timeout_s=600).images
        assert live.metric("genaug_recompiles_total") == 0
        assert compiled_graphs() == graphs  # neither compiled again
        assert acceleration_info(live)["compiled_shapes"][-1] == "64x64:1"
    assert_close(got, baseline)
    assert_close(one, baseline[:1])
    want = PipelineWorker(batched_tiny()).run(GroupKey(64, 64, 3), [
        Item(PROMPT, seed=7, guidance=1.0, output_height=64, output_width=64)]).images
    assert_close(alone, np.stack(want))


@pytest.mark.slow  # torch.compile: 15-20 s of compiling for the regional one, more for the UNet
@pytest.mark.parametrize(("mode", "options"), [
    pytest.param("regional", {}, id="regional", marks=pytest.mark.timeout(900)),
    pytest.param("unet", {}, id="whole-unet", marks=pytest.mark.timeout(1800)),
    pytest.param("regional", {"channels_last": True, "fuse_qkv": True, "vae_slicing": True},
                 id="best-combination", marks=pytest.mark.timeout(1800)),
])
def test_compiled_service_warms_up_reports_counts_recompiles_and_keeps_the_image(
    mode: str, options: dict[str, Any], baseline: np.ndarray, fresh_dynamo: None
) -> None:
    check_compiled_service(mode, options, baseline)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_listed_warmup_shapes_are_compiled_before_ready(fresh_dynamo: None) -> None:
    model = batched_tiny()
    with start_service(
        model, compile="regional", max_batch_images=2, warmup_shapes="64x64:1, 80x80:2",
        ready_timeout=600,
    ) as live:
        assert acceleration_info(live)["compiled_shapes"] == ["64x64:1", "80x80:2", "64x64:2"]
        with Client(live.url, timeout=600) as client:
            for n, size in ((1, 64), (2, 80), (2, 64)):
                client.generate(PROMPT, n=n, seed=1, height=size, width=size, steps=2,
                                timeout_s=600)
        assert live.metric("genaug_recompiles_total") == 0


# -- CUDA graphs: the whole UNet, each call a marked step -----------------------------------


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_regional_compile_with_cuda_graphs_is_refused_in_one_line(mode: str) -> None:
    """One compiled block replays many times inside one UNet call: each replay would
    overwrite what the last one returned (the H100 crash), so it is refused at start."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        Settings(compile="regional", compile_mode=mode)
    message = str(info.value.errors()[0]["msg"])
    with pytest.raises(AccelerationError) as refused:
        AccelerationOptions(compile="regional", compile_mode=mode)
    for text in (message, str(refused.value)):
        assert "\n" not in text
        assert f"GENAUG_COMPILE=regional cannot replay CUDA graphs (GENAUG_COMPILE_MODE={mode})"\
            in text
        assert "set GENAUG_COMPILE=unet for CUDA graphs, or GENAUG_COMPILE_MODE=default" in text
    # What stays allowed: regional without graphs, the whole UNet with them.
    assert not AccelerationOptions(compile="regional",
                            compile_mode="max-autotune-no-cudagraphs").cuda_graphs
    assert Settings(compile="unet", compile_mode=mode).compile_mode == mode


class Replay:
    """A stand-in for a CUDA-graph replay on the CPU: the eager UNet's output copied into one
    static buffer, returned as is, and overwritten with NaN when the next call begins (what
    a replay does to what the one before returned)."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward
        self.buffer: torch.Tensor | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor]:
        if self.buffer is not None:
            self.buffer.fill_(float("nan"))
        out = self.forward(*args, **kwargs)[0]
        if self.buffer is None or self.buffer.shape != out.shape:
            self.buffer = torch.empty_like(out)
        self.buffer.copy_(out)
        return (self.buffer,)


@pytest.mark.parametrize("scheduler", ["euler", "dpmpp_2m", "unipc"])
def test_whole_unet_cuda_graphs_mark_each_call_and_read_nothing_of_an_old_replay(
    scheduler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GENAUG_COMPILE=unet with CUDA graphs: every UNet call (each denoising step) begins with
    cudagraph_mark_step_begin, and the images are the eager UNet's although each replay
    overwrites the last one's output (multistep schedulers keep history across steps)."""
    from genaug.service.pipeline.compiling import UNetCall

    model = batched_tiny()
    unet = model.pipeline.unet
    eager = unet.forward
    apply_acceleration(model,
                       AccelerationOptions(compile="unet", compile_mode="reduce-overhead"))
    assert isinstance(unet.forward, UNetCall) and unet.forward.mark_steps
    unet.forward.compiled = Replay(eager)  # no compile on the CPU: the replay's semantics
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    key = GroupKey(64, 64, 3, scheduler=scheduler)
    batch = [*items(2), Item(PROMPT, seed=99, guidance=1.0, output_height=64, output_width=64)]
    got = PipelineWorker(model).run(key, batch)
    assert got.errors == {}
    assert len(marks) == unet.forward.calls == 3  # one per step: the batch is one UNet call
    want = PipelineWorker(batched_tiny()).run(key, batch)
    np.testing.assert_array_equal(np.stack(got.images), np.stack(want.images))
