"""Training, the one piece: a LoRA on the served model with peft, saved for diffusers.

``genaug adapt`` (:mod:`genaug.service.commands.adapt`) reads ``DATA/<label>/*.png`` with
each label's recipe prompts (:mod:`genaug.service.adapt.data`) and calls :func:`adapt`, which
trains low-rank adapters on the UNet's attention projections (``to_q``, ``to_k``, ``to_v``,
``to_out.0``; optionally both text encoders' ``q/k/v/out_proj``) of the model genaug serves,
the rest frozen:

* the loss of the model's own noise schedule (its scheduler's ``prediction_type``:
  ``epsilon`` or ``v_prediction``), latents from the frozen VAE (posterior sampled per step),
  conditioned exactly as ``StableDiffusionXLPipeline`` conditions at inference (both text
  encoders' penultimate states, the pooled projection, the six ``text_time`` numbers), as
  ``tools/train_tiny_generator.py`` trains the tiny UNet;
* a fixed seed: every draw (batch, timestep, noise, LoRA init) comes from one generator, so
  the same data, model and settings give the same file on the same device;
* on CUDA: trainable weights in float32 over a bfloat16 base, gradient checkpointing, fused
  AdamW (8-bit AdamW when ``bitsandbytes`` is installed); gradient accumulation anywhere;
* a tqdm progress bar; Ctrl-C stops after the current step and still writes a usable file
  (its record says ``"interrupted": true`` and the steps actually taken).

The file is what ``StableDiffusionXLPipeline.save_lora_weights`` writes (keys ``unet.*``,
``text_encoder.*``, ``text_encoder_2.*``, diffusers naming), so ``GENAUG_LORAS=name=OUT``
loads it; its safetensors header also holds the record
(:mod:`genaug.service.pipeline.lora_record`: :data:`BASE_HASH_KEY` is the served model's
``weights_hash``, which :class:`~genaug.service.pipeline.adapters.Adapters` checks against the
model it serves). The header's keys and reader live in the pipeline because serving sits
below adaptation and reads them too.

Example::

    model = load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")
    data = AdaptData(images=uint8_nhwc, prompts=[["a handwritten three"], ...],
                     data_hash="9c1e...")
    record = adapt(model, data, Path("threes.safetensors"),
                   AdaptConfig(steps=default_steps(1), rank=32))
    record["losses"][-1], record["steps"]
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..pipeline.lora_record import BASE_HASH_KEY, DEFAULT_RANK, RECORD_KEY

if TYPE_CHECKING:
    from ..pipeline.load import LoadedModel

__all__ = ["MAX_STEPS", "MIN_STEPS", "STEPS_PER_LABEL", "AdaptConfig", "AdaptData", "adapt",
           "default_steps"]

log = logging.getLogger(__name__)

_UNET_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
_TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
_MAX_LOSSES = 200  # losses recorded: one per step, or means of equal chunks beyond this

#: ``genaug adapt``'s defaults, chosen by the data's size: optimizer steps per label (each
#: label is a shape the adapter must learn; more shots of one label add no new shape), within
#: ``[MIN_STEPS, MAX_STEPS]``, at rank 32. Measured on the embedded ``tiny-digits-base`` and 5
#: shots per class of digits 5-9 (5 labels: 6,000 steps; docs/benchmarks.md).
STEPS_PER_LABEL = 1200
MIN_STEPS = 1000
MAX_STEPS = 12_000


def default_steps(labels: int) -> int:
    """``genaug adapt``'s default steps for ``labels`` labels: 1,200 per label, at least
    1,000 and at most 12,000 (5 labels: 6,000; 10 labels: 12,000)."""
    return int(min(MAX_STEPS, max(MIN_STEPS, STEPS_PER_LABEL * labels)))


@dataclass(frozen=True)
class AdaptConfig:
    """One adaptation run (every field is a ``genaug adapt`` flag).

    Example::

        AdaptConfig(steps=1000, rank=16, lr=1e-4, batch_size=4, accumulation=4)

    ``genaug adapt`` fills ``steps`` with :func:`default_steps` of the recipe's labels.
    """

    steps: int = 6000
    rank: int = DEFAULT_RANK
    seed: int = 0
    lr: float = 1e-3
    lr_schedule: str = "constant"  # or "cosine": 5 % linear warm-up, then cosine to 0
    batch_size: int = 4
    accumulation: int = 1
    text_encoder: bool = False
    gradient_checkpointing: bool | None = None  # None: on CUDA only
    progress: bool = True


@dataclass(frozen=True)
class AdaptData:
    """Training examples: ``images`` uint8 ``[N, H, W, 3]`` at the generation size, the
    prompts each may be paired with (one is drawn per step), and a hash naming the data."""

    images: np.ndarray
    prompts: Sequence[Sequence[str]]
    data_hash: str


def adapt(model: LoadedModel, data: AdaptData, out: Path, config: AdaptConfig) -> dict[str, Any]:
    """Train a LoRA on ``model`` (modified in place: it carries the adapter afterwards) and
    write it to ``out``; return the record stored in its header.

    Raises ``ValueError`` for empty data or non-positive steps, rank or batch size.
    """
    if len(data.images) == 0 or len(data.images) != len(data.prompts):
        raise ValueError(f"need one prompt list per image; got {len(data.images)} images "
                         f"and {len(data.prompts)} prompt lists")
    if min(config.steps, config.rank, config.batch_size, config.accumulation) < 1:
        raise ValueError(f"steps, rank, batch size and accumulation must be >= 1: {config}")
    from diffusers import DDPMScheduler
    from peft import LoraConfig, inject_adapter_in_model

    pipe: Any = model.pipeline
    device = model.device
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(config.seed)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        module.requires_grad_(False)

    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.manual_seed(config.seed)  # peft's LoRA initialisation draws from the global RNG
        pipe.unet.add_adapter(LoraConfig(r=config.rank, lora_alpha=config.rank,
                                         init_lora_weights="gaussian",
                                         target_modules=_UNET_TARGETS))
        text_modules = [pipe.text_encoder, pipe.text_encoder_2] if config.text_encoder else []
        for encoder in text_modules:
            # peft directly: transformers' own add_adapter may ask for a newer peft.
            inject_adapter_in_model(LoraConfig(r=config.rank, lora_alpha=config.rank,
                                               init_lora_weights="gaussian",
                                               target_modules=_TEXT_TARGETS), encoder)
    trained = [p for m in (pipe.unet, *text_modules) for p in m.parameters() if p.requires_grad]
    for param in trained:  # float32 adapters over a bfloat16/float16 base
        param.data = param.data.float()
    if config.gradient_checkpointing if config.gradient_checkpointing is not None else cuda:
        pipe.unet.enable_gradient_checkpointing()

    noise_schedule: Any = DDPMScheduler.from_config(  # type: ignore[no-untyped-call]
        pipe.scheduler.config
    )
    prediction = str(noise_schedule.config.get("prediction_type", "epsilon"))
    if prediction not in {"epsilon", "v_prediction"}:
        raise ValueError(f"the model's scheduler predicts {prediction!r}; genaug adapt "
                         "trains epsilon or v_prediction models")
    mean, std = _encode(pipe, data.images, device, model.dtype)
    scale = float(pipe.vae.config.scaling_factor)
    height, width = data.images.shape[1:3]
    time_ids = torch.tensor([[height, width, 0, 0, height, width]], dtype=model.dtype,
                            device=device)
    flat = [p for group in data.prompts for p in group]
    starts = np.cumsum([0] + [len(g) for g in data.prompts])
    unique = list(dict.fromkeys(flat))  # labels share prompts: encode each once
    index = {prompt: i for i, prompt in enumerate(unique)}
    row_of = np.asarray([index[prompt] for prompt in flat], dtype=np.int64)
    cached = None
    if not config.text_encoder:
        parts = [_encode_prompts(pipe, unique[i:i + 64], device)
                 for i in range(0, len(unique), 64)]
        cached = (torch.cat([e for e, _ in parts]), torch.cat([p for _, p in parts]))

    optimizer = _optimizer(trained, config.lr, cuda)
    scheduler = _scheduler(optimizer, config)
    losses: list[float] = []
    interrupted = False
    started = time.monotonic()
    pipe.unet.train()
    for encoder in text_modules:
        encoder.train()
    bar = _progress(config)
    try:
        for _step in range(config.steps):
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for _ in range(config.accumulation):
                idx = torch.randint(0, len(data.images), (config.batch_size,), generator=gen)
                z0 = mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)
                z0 = (z0 * scale).to(device)
                noise = torch.randn(z0.shape, generator=gen).to(device)
                t = torch.randint(0, noise_schedule.config.num_train_timesteps,
                                  (config.batch_size,), generator=gen).to(device)
                noisy = noise_schedule.add_noise(z0, noise, t)
                target = (noise if prediction == "epsilon"
                          else noise_schedule.get_velocity(z0, noise, t))
                pick = starts[idx.numpy()] + (
                    torch.rand(config.batch_size, generator=gen).numpy()
                    * np.diff(starts)[idx.numpy()]).astype(np.int64)
                if cached is not None:
                    rows = torch.as_tensor(row_of[pick], device=device)
                    embeds, pooled = cached[0][rows], cached[1][rows]
                else:
                    embeds, pooled = _encode_prompts(pipe, [flat[i] for i in pick], device)
                with torch.autocast(device.type, dtype=model.dtype,
                                    enabled=cuda and model.dtype != torch.float32):
                    pred = pipe.unet(
                        noisy.to(model.dtype), t, encoder_hidden_states=embeds,
                        added_cond_kwargs={"text_embeds": pooled,
                                           "time_ids": time_ids.expand(len(t), -1)},
                    ).sample
                loss = torch.nn.functional.mse_loss(pred.float(), target.float())
                (loss / config.accumulation).backward()  # type: ignore[no-untyped-call]
                step_loss += loss.item() / config.accumulation
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(step_loss)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
    except KeyboardInterrupt:
        interrupted = True
        log.warning("interrupted after %d of %d steps; saving what was learned", len(losses),
                    config.steps)
    finally:
        if bar is not None:
            bar.close()
        pipe.unet.eval()
        for encoder in text_modules:
            encoder.eval()
        if config.gradient_checkpointing if config.gradient_checkpointing is not None else cuda:
            pipe.unet.disable_gradient_checkpointing()

    record: dict[str, Any] = {
        "base_model": model.source,
        "base_hash": model.weights_hash,
        "data_hash": data.data_hash,
        "images": len(data.images),
        "size": [int(height), int(width)],
        "steps": len(losses),
        "steps_asked": config.steps,
        "interrupted": interrupted,
        "rank": config.rank,
        "seed": config.seed,
        "lr": config.lr,
        "lr_schedule": config.lr_schedule,
        "batch_size": config.batch_size,
        "accumulation": config.accumulation,
        "text_encoder": config.text_encoder,
        "prediction_type": prediction,
        "device": str(device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "train_s": round(time.monotonic() - started, 2),
        "losses": _thin(losses),
        "final_loss": round(float(np.mean(losses[-20:])), 5) if losses else None,
    }
    _save(pipe, text_modules, out, record)
    log.info("wrote %s: %d steps, rank %d, final loss %s, %.1f s", out, record["steps"],
             config.rank, record["final_loss"], record["train_s"])
    return record


def _encode(pipe: Any, images: np.ndarray, device: torch.device,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of every image (unscaled latents, float32, on the CPU)."""
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    means, stds = [], []
    with torch.no_grad():
        for chunk in torch.split(pixels, 16):
            dist = pipe.vae.encode(chunk.to(device=device, dtype=pipe.vae.dtype)).latent_dist
            means.append(dist.mean.float().cpu())
            stds.append(dist.std.float().cpu())
    return torch.cat(means), torch.cat(stds)


def _encode_prompts(pipe: Any, prompts: list[str],
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prompt_embeds, pooled)`` as the pipeline computes them at inference."""
    grad = any(p.requires_grad for p in pipe.text_encoder.parameters())
    with torch.set_grad_enabled(grad):
        embeds, _, pooled, _ = pipe.encode_prompt(
            prompts, device=device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
    return embeds, pooled


def _optimizer(params: list[torch.nn.Parameter], lr: float, cuda: bool) -> torch.optim.Optimizer:
    if cuda:
        try:
            import bitsandbytes as bnb

            optimizer: torch.optim.Optimizer = bnb.optim.AdamW8bit(params, lr=lr)
            log.info("optimizer: bitsandbytes AdamW8bit")
            return optimizer
        except ImportError:
            return torch.optim.AdamW(params, lr=lr, weight_decay=1e-4, fused=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)


def _scheduler(optimizer: torch.optim.Optimizer,
               config: AdaptConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """``constant``: ``lr`` throughout; ``cosine``: linear warm-up over the first 5 % of the
    steps, then cosine decay to 0 at the last step."""
    if config.lr_schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if config.lr_schedule != "cosine":
        raise ValueError(f"lr_schedule {config.lr_schedule!r} is not one of "
                         "'constant', 'cosine'")
    warmup = max(1, config.steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, config.steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _progress(config: AdaptConfig) -> Any:
    if not config.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, desc="genaug adapt", unit="step", dynamic_ncols=True)


def _thin(losses: list[float]) -> list[float]:
    if len(losses) <= _MAX_LOSSES:
        return [round(v, 5) for v in losses]
    chunks = np.array_split(np.asarray(losses), _MAX_LOSSES)
    return [round(float(c.mean()), 5) for c in chunks]


def _save(pipe: Any, text_modules: list[Any], out: Path, record: dict[str, Any]) -> None:
    """Write the LoRA as ``save_lora_weights`` would, plus the record, atomically (a second
    Ctrl-C during the write leaves the old file or none, never half of one)."""
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils import convert_state_dict_to_diffusers  # type: ignore[attr-defined]
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    parts = [("unet", pipe.unet)]
    parts += list(zip(("text_encoder", "text_encoder_2"), text_modules, strict=False))
    for prefix, module in parts:
        layers = convert_state_dict_to_diffusers(  # type: ignore[no-untyped-call]
            get_peft_model_state_dict(module)
        )
        state.update(StableDiffusionXLPipeline.pack_weights(layers, prefix))
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
    meta = {"format": "pt", BASE_HASH_KEY: str(record["base_hash"]),
            RECORD_KEY: json.dumps(record, sort_keys=True)}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    save_file(tensors, str(partial), metadata=meta)
    os.replace(partial, out)
