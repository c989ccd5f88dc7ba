"""The SDXL model the GPU scripts run, and what they measure of it beside time.

Stable Diffusion XL base 1.0 is built from its published configs (``bench/gpu/sdxl/*.json``,
transcribed: nothing is downloaded) with seeded random weights (:func:`build_sdxl`); the tiny
pipeline stands in for it on the CPU (:func:`build_tiny`). Beside it: its parameter counts,
the UNet's FLOPs counted from the model (:func:`count_unet_flops`), the matmul peak an MFU is
taken against (:func:`matmul_peak`), the versions a figure is recorded with (:func:`versions`),
dynamo's graph and graph-break counters (:func:`dynamo_counts`), and the image drift between
two runs of the same seeds (:func:`psnr_db`, :func:`visibly_changed`, :func:`drift`).

:mod:`bench.gpu.gpu_sdxl`, :mod:`bench.gpu.acceptance` and :mod:`bench.gpu.fp8_diagnose`
import it; it is no benchmark (its name starts with ``_``, so the harness's catalogue skips
it) and runs nothing on import.

Example::

    import torch
    from bench.gpu._sdxl_model import build_sdxl, count_unet_flops, drift, load_config

    model = build_sdxl(torch.device("cuda"), torch.bfloat16)  # a LoadedModel, random weights
    count_unet_flops(load_config("unet"), 1024, 1024)       # 6_761_236_398_080 per pass
    drift(reference_images, images)["visibly_changed"]      # 0: no image visibly changed
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import median

CONFIG_DIR = Path(__file__).resolve().parent / "sdxl"
#: Image drift: a pixel differs visibly when a channel differs by more than VISIBLE_LEVELS of
#: 255, an image is visibly changed when more than VISIBLE_SHARE of its pixels do.
VISIBLE_LEVELS = 8
VISIBLE_SHARE = 0.01


# -- the model ------------------------------------------------------------------------------


def load_config(name: str) -> dict[str, Any]:
    """``bench/gpu/sdxl/<name>.json``: ``unet``, ``vae``, ``scheduler``, ``model_index``, ..."""
    config: dict[str, Any] = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    return config


def clip_config(name: str) -> Any:
    """A text encoder's ``CLIPTextConfig`` (the file's bookkeeping keys left out: the model is
    built in float32 and cast, whatever dtype the published weights were saved in)."""
    from transformers import CLIPTextConfig

    skip = ("architectures", "torch_dtype", "transformers_version")
    return CLIPTextConfig(**{k: v for k, v in load_config(name).items() if k not in skip})


def build_sdxl(device: Any, dtype: Any, seed: int = 0) -> Any:
    """SDXL base 1.0 from ``bench/gpu/sdxl/*.json`` with random weights, on ``device``.

    Modules are constructed directly on the device (``with torch.device(...)``: PyTorch's
    default initialisation runs there, seconds on a GPU), in float32, then cast.
    """
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    from genaug.service.pipeline.load import LoadedModel
    from genaug.service.pipeline.tiny import assemble_sdxl

    index = load_config("model_index")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            unet = UNet2DConditionModel.from_config(load_config("unet"))
            vae = AutoencoderKL.from_config(load_config("vae"))
            text_encoder = CLIPTextModel(clip_config("text_encoder"))
            text_encoder_2 = CLIPTextModelWithProjection(clip_config("text_encoder_2"))
    scheduler = EulerDiscreteScheduler.from_config(load_config("scheduler"))
    pipeline = assemble_sdxl(
        unet, vae, text_encoder, text_encoder_2, scheduler,
        force_zeros_for_empty_prompt=index["force_zeros_for_empty_prompt"],
    )
    pipeline.to(device=device, dtype=dtype)
    return LoadedModel(
        pipeline=pipeline,
        kind="sdxl-random",
        source=str(CONFIG_DIR),
        weights_hash=f"random-seed-{seed}",
        device=device,
        dtype=dtype,
    )


def build_tiny(device: Any, dtype: Any) -> Any:
    """The tiny pipeline with true batching (as SDXL runs), as the service loads it."""
    import dataclasses

    from genaug.service.pipeline.tiny import build_tiny_pipeline
    from genaug.service.testing import load_tiny

    model = load_tiny(threads=None)
    pipeline = build_tiny_pipeline(batch_invariant=False)
    pipeline.to(device=device, dtype=dtype)
    return dataclasses.replace(model, pipeline=pipeline, device=device, dtype=dtype)


def parameter_counts(pipeline: Any) -> dict[str, int]:
    """Parameters of a built pipeline's UNet, text encoders and VAE."""
    return {
        name: sum(p.numel() for p in getattr(pipeline, name).parameters())
        for name in ("unet", "text_encoder", "text_encoder_2", "vae")
    }


def parameter_counts_sdxl() -> dict[str, int]:
    """Parameter counts of the SDXL components, built on the meta device (no memory)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    with torch.device("meta"):
        modules = {
            "unet": UNet2DConditionModel.from_config(load_config("unet")),
            "text_encoder": CLIPTextModel(clip_config("text_encoder")),
            "text_encoder_2": CLIPTextModelWithProjection(clip_config("text_encoder_2")),
            "vae": AutoencoderKL.from_config(load_config("vae")),
        }
    return {k: sum(p.numel() for p in m.parameters()) for k, m in modules.items()}


def count_unet_flops(config: dict[str, Any], height: int, width: int) -> int:
    """FLOPs of one UNet forward at batch 1 and ``height`` x ``width`` pixels, counted by
    ``FlopCounterMode`` on the meta device (a multiply-add is 2 FLOPs)."""
    import torch
    from diffusers import UNet2DConditionModel
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(config)
        c = unet.config
        pooled = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
        sample = torch.randn(1, c.in_channels, height // 8, width // 8)
        context = torch.randn(1, 77, c.cross_attention_dim)
        added = {"text_embeds": torch.randn(1, pooled), "time_ids": torch.randn(1, 6)}
        timestep = torch.tensor([500])
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        unet(sample, timestep, encoder_hidden_states=context, added_cond_kwargs=added)
    return int(counter.get_total_flops())


def matmul_peak(device: Any, dtype: Any, *, quick: bool = False) -> float:
    """Dense matmul FLOP/s on ``device``: median of timed products of random matrices."""
    import torch

    n = 8192 if device.type == "cuda" else (256 if quick else 1024)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    times: list[float] = []
    reps = 5 if quick else 20
    for i in range(3 + reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            torch.mm(a, b)
            seconds = time.perf_counter() - t0
        if i >= 3:
            times.append(seconds)
    return 2 * n**3 / median(times)


def versions(device: Any) -> dict[str, Any]:
    """Python, torch, CUDA, cuDNN, diffusers, torchao (if installed); on CUDA the driver and
    the compute capability: docs/benchmarks.md records them with the figures."""
    import importlib.metadata as metadata

    import diffusers
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "diffusers": diffusers.__version__,
    }
    try:
        out["torchao"] = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        out["torchao"] = None
    if device.type == "cuda":
        out["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        try:
            out["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            out["driver"] = None
    return out


def dynamo_counts() -> tuple[int, int]:
    """Graphs dynamo compiled and graph breaks it met in this process so far."""
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    breaks = int(sum(counters["graph_break"].values()))
    return graphs, breaks


# -- image drift ----------------------------------------------------------------------------


def psnr_db(a: Any, b: Any) -> float:
    """PSNR in dB of two uint8 images (255 the peak); ``inf`` when they are identical."""
    import numpy as np

    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(diff * diff))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def visible_share(a: Any, b: Any, levels: int = VISIBLE_LEVELS) -> float:
    """The share of pixels where some channel differs by more than ``levels`` of 255."""
    import numpy as np

    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(np.mean(diff.max(axis=-1) > levels))


def visibly_changed(a: Any, b: Any) -> bool:
    """More than :data:`VISIBLE_SHARE` of the pixels differ by more than
    :data:`VISIBLE_LEVELS` of 255."""
    return visible_share(a, b) > VISIBLE_SHARE


def drift(reference: Sequence[Any], images: Sequence[Any]) -> dict[str, Any]:
    """``images`` against ``reference`` seed by seed: PSNR (mean over the images of each
    one's dB, and the lowest), the images visibly changed (:func:`visibly_changed`) and their
    share, the largest difference in levels of 255."""
    import numpy as np

    if len(reference) != len(images) or not images:
        raise ValueError(f"{len(images)} images against {len(reference)} references")
    psnrs = [psnr_db(r, i) for r, i in zip(reference, images, strict=True)]
    changed = sum(visibly_changed(r, i) for r, i in zip(reference, images, strict=True))
    largest = max(int(np.abs(r.astype(np.int16) - i.astype(np.int16)).max())
                  for r, i in zip(reference, images, strict=True))
    return {
        "images": len(images),
        "psnr_db_mean": float(np.mean(psnrs)),
        "psnr_db_min": min(psnrs),
        "visibly_changed": changed,
        "visibly_changed_share": changed / len(images),
        "max_levels": largest,
    }
