"""The diffusers side: turns one batch of items into uint8 images. Nothing else touches torch.

:class:`Generator` is the batcher's :class:`~genaug.service.batcher.Worker`. It is called from
one thread only, and it is where the per-image guarantees are kept:

- **Seeds.** Each image gets its own ``torch.Generator``, so image ``i`` depends on its seed
  and prompt, not on its batch mates.
- **NaN/Inf guard.** The UNet runs with ``output_type="latent"`` and the VAE decode happens
  here, so each image is checked. A non-finite decode (the SDXL fp16 VAE overflow that gives
  black images) upcasts the VAE to float32 for good and decodes those latents again;
  non-finite latents fail only their own items. No such image is ever served.
- **Out of memory.** The batch is halved and retried; only an image that cannot run alone
  fails.
- **Output size.** Antialiased resize on the device, then uint8 NHWC on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .batcher import GroupKey, Item, Outcome
from .metrics import Metrics
from .model import LoadedModel

log = logging.getLogger(__name__)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Generator:
    """Runs batches on one loaded SDXL pipeline.

    Example::

        gen = Generator(load_model(source=None, unet_weights=None, device="cpu", dtype="auto"))
        key = GroupKey(64, 64, 4, 5.0, 64, 64, negative=False)
        out = gen.run(key, [Item("a red circle", "", seed=1)])
        out.images.shape  # (1, 64, 64, 3)
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
        try:
            latents = self._denoise(key, items)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            if len(items) == 1:
                log.error("out of memory generating one %dx%d image", key.height, key.width)
                return Outcome(
                    images=np.zeros((1, key.output_height, key.output_width, 3), np.uint8),
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
        return self._decode(key, latents)

    def _denoise(self, key: GroupKey, items: Sequence[Item]) -> torch.Tensor:
        generators = [torch.Generator(device=self.device).manual_seed(item.seed) for item in items]
        output = self.pipe(
            prompt=[item.prompt for item in items],
            negative_prompt=[item.negative_prompt for item in items] if key.negative else None,
            height=key.height,
            width=key.width,
            num_inference_steps=key.steps,
            guidance_scale=key.guidance,
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

    def _decode(self, key: GroupKey, latents: torch.Tensor) -> Outcome:
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
        if (key.output_height, key.output_width) != (key.height, key.width):
            images = F.interpolate(
                images,
                size=(key.output_height, key.output_width),
                mode="bilinear",
                antialias=True,
                align_corners=False,
            ).clamp(0, 1)
        as_uint8 = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
        out = as_uint8.cpu().numpy()
        assert out.shape[0] == n
        return Outcome(images=out, errors=errors)

    def warmup(self, key: GroupKey) -> None:
        """One small batch so the first request does not pay for lazy initialisation."""
        self.run(key, [Item("warm-up", "", 0)])


def _concat(a: Outcome, b: Outcome, offset: int) -> Outcome:
    errors = dict(a.errors)
    errors.update({i + offset: msg for i, msg in b.errors.items()})
    return Outcome(images=np.concatenate([a.images, b.images]), errors=errors)
