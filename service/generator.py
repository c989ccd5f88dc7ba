"""The diffusers side: turns one batch of items into uint8 images. Nothing else touches torch.

:class:`PipelineWorker` is the batcher's :class:`~genaug.service.work.Worker`. It is called from
one thread only, and it is where the per-image guarantees are kept:

- **Seeds.** Each image gets its own ``torch.Generator``, so image ``i`` depends on its seed
  and prompt, not on its batch mates.
- **NaN/Inf guard.** The UNet runs with ``output_type="latent"`` and the VAE decode happens
  here, so each image is checked. A non-finite decode (the SDXL fp16 VAE overflow that gives
  black images) upcasts the VAE to float32 for good and decodes those latents again;
  non-finite latents fail only their own items. No such image is ever served.
- **Out of memory.** The batch is halved and retried; only an image that cannot run alone
  fails.
- **Per-image arguments.** Guidance and the presence of a negative prompt may differ within
  a batch: images that share them share one pipeline call (a batch is split into at most
  that many calls). Output size and channels (RGB or luminance) are applied per image.
- **Output size.** Antialiased resize on the device, then uint8 HWC on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .metrics import Metrics
from .model import LoadedModel
from .work import GroupKey, Item, Outcome

log = logging.getLogger(__name__)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class PipelineWorker:
    """Runs batches on one loaded SDXL pipeline.

    Example::

        worker = PipelineWorker(load_model(source=None, unet_weights=None, device="cpu",
                                           dtype="auto"))
        key = GroupKey(height=64, width=64, steps=4)
        item = Item("a red circle", seed=1, guidance=5.0, output_height=64, output_width=64)
        out = worker.run(key, [item])
        out.images[0].shape  # (64, 64, 3)
    """

    def __init__(self, model: LoadedModel, metrics: Metrics | None = None) -> None:
        self.model = model
        # diffusers' pipeline classes are dynamically typed: components are attributes.
        self.pipe: Any = model.pipeline
        self.metrics = metrics
        self.vae_upcast = False

    @property
    def device(self) -> torch.device:
        return self.model.device

    # -- Worker protocol ---------------------------------------------------------------------

    def run(self, key: GroupKey, items: Sequence[Item]) -> Outcome:
        """Generate ``items`` as one pipeline call (or halves of it on out-of-memory)."""
        try:
            with torch.inference_mode():
                return self._run(key, items)
        finally:
            if self.device.type == "cuda":
                # Freed activations go back to the allocator, not the OS: keep the peak stable.
                torch.cuda.empty_cache()

    # -- internals ---------------------------------------------------------------------------

    def _run(self, key: GroupKey, items: Sequence[Item]) -> Outcome:
        _check_supported(key)
        try:
            latents = self._denoise(key, items)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            if len(items) == 1:
                log.error("out of memory generating one %dx%d image", key.height, key.width)
                return Outcome(
                    images=[np.zeros(items[0].output_shape, np.uint8)],
                    errors={
                        0: f"out of memory for one {key.height}x{key.width} image on "
                        f"{self.device}; request a smaller size or free device memory"
                    },
                )
            half = len(items) // 2
            log.warning(
                "out of memory on a batch of %d; retrying as %d + %d",
                len(items),
                half,
                len(items) - half,
            )
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return _concat(self._run(key, items[:half]), self._run(key, items[half:]), half)
        return self._decode(items, latents)

    def _denoise(self, key: GroupKey, items: Sequence[Item]) -> torch.Tensor:
        """Latents of every item, in order: one pipeline call per (guidance, negative prompt
        given or not) among them, since the pipeline takes one guidance scale per call."""
        latents: list[torch.Tensor | None] = [None] * len(items)
        groups: dict[tuple[float, bool], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.guidance, item.negative_prompt is not None), []).append(i)
        for (guidance, negative), indices in groups.items():
            part = [items[i] for i in indices]
            out = self._pipeline_call(key, part, guidance=guidance, negative=negative)
            for i, row in zip(indices, out, strict=True):
                latents[i] = row
        return torch.stack([row for row in latents if row is not None])

    def _pipeline_call(
        self, key: GroupKey, items: Sequence[Item], *, guidance: float, negative: bool
    ) -> torch.Tensor:
        generators = [torch.Generator(device=self.device).manual_seed(item.seed) for item in items]
        output = self.pipe(
            prompt=[item.prompt for item in items],
            negative_prompt=[item.negative_prompt or "" for item in items] if negative else None,
            height=key.height,
            width=key.width,
            num_inference_steps=key.steps,
            guidance_scale=guidance,
            generator=generators,
            output_type="latent",
            return_dict=True,
        )
        latents: torch.Tensor = output.images
        return latents

    def _vae_decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        config = vae.config
        latents = latents.to(dtype=vae.dtype)
        mean = getattr(config, "latents_mean", None)
        std = getattr(config, "latents_std", None)
        if mean is not None and std is not None:
            channels = latents.shape[1]
            mean_t = torch.tensor(mean).view(1, channels, 1, 1).to(latents)
            std_t = torch.tensor(std).view(1, channels, 1, 1).to(latents)
            latents = latents * std_t / config.scaling_factor + mean_t
        else:
            latents = latents / config.scaling_factor
        decoded: torch.Tensor = vae.decode(latents, return_dict=False)[0]
        return decoded

    def _upcast_vae(self) -> None:
        if not self.vae_upcast and self.pipe.vae.dtype != torch.float32:
            log.warning(
                "the VAE gave non-finite pixels in %s; upcasting it to float32 for the rest of "
                "this run (set GENAUG_DTYPE=bfloat16 or use an fp16-fixed VAE to avoid this)",
                self.pipe.vae.dtype,
            )
            self.pipe.vae.to(dtype=torch.float32)
        self.vae_upcast = True

    def _decode(self, items: Sequence[Item], latents: torch.Tensor) -> Outcome:
        n = latents.shape[0]
        errors: dict[int, str] = {}
        finite_latents = torch.isfinite(latents.flatten(1)).all(dim=1)
        pixels = self._vae_decode(latents).float()
        bad = ~torch.isfinite(pixels.flatten(1)).all(dim=1)
        retry = (bad & finite_latents).nonzero().flatten()
        if retry.numel():
            self._upcast_vae()
            pixels[retry] = self._vae_decode(latents[retry].float()).float()
            bad = ~torch.isfinite(pixels.flatten(1)).all(dim=1)
        if bad.any():
            for i in bad.nonzero().flatten().tolist():
                errors[i] = (
                    "the model produced NaN/Inf pixels for this image even with a float32 VAE "
                    "(UNet overflow); use GENAUG_DTYPE=bfloat16 or float32"
                )
            if self.metrics is not None:
                self.metrics.nonfinite_images.inc(len(errors))
            pixels = torch.nan_to_num(pixels, nan=0.0, posinf=0.0, neginf=0.0)
        images = (pixels / 2 + 0.5).clamp(0, 1)
        out = [_finish(images[i : i + 1], item) for i, item in enumerate(items)]
        assert len(out) == n
        return Outcome(images=out, errors=errors)

    def warmup(self, key: GroupKey, guidance: float) -> None:
        """One small batch so the first request does not pay for lazy initialisation."""
        item = Item("warm-up", seed=0, guidance=guidance, output_height=key.height,
                    output_width=key.width)
        self.run(key, [item])


# RGB -> luminance weights (ITU-R BT.601, as PIL's "L" mode), for one-channel outputs.
_LUMA = (0.299, 0.587, 0.114)


def _finish(image: torch.Tensor, item: Item) -> np.ndarray:
    """One image in [0, 1], ``[1, 3, h, w]`` -> uint8 ``item.output_shape`` on the host."""
    if tuple(image.shape[2:]) != (item.output_height, item.output_width):
        image = F.interpolate(
            image,
            size=(item.output_height, item.output_width),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        ).clamp(0, 1)
    if item.channels == 1:
        weights = torch.tensor(_LUMA, dtype=image.dtype, device=image.device).view(1, 3, 1, 1)
        image = (image * weights).sum(dim=1, keepdim=True)
    as_uint8 = (image[0] * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    out: np.ndarray = as_uint8.cpu().numpy()
    return out


def _check_supported(key: GroupKey) -> None:
    unsupported = {
        "mode": key.mode != "text",
        "adapter": key.adapter is not None,
        "scheduler": key.scheduler != "default",
    }
    missing = [name for name, flag in unsupported.items() if flag]
    if missing:
        raise ValueError(f"this worker does not support {', '.join(missing)} yet: {key}")


def _concat(a: Outcome, b: Outcome, offset: int) -> Outcome:
    errors = dict(a.errors)
    errors.update({i + offset: msg for i, msg in b.errors.items()})
    return Outcome(images=[*a.images, *b.images], errors=errors)
