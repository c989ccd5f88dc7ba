"""The VAE both ways: img2img sources to latents, latents to pixels, with the overflow guard.

SDXL's VAE overflows in float16 (non-finite values: black images). Both directions check each
row: a non-finite encode or decode in half precision upcasts the VAE to float32 for good (for
the rest of the run) and redoes those rows; rows still non-finite are reported, never served.
The worker builds one :class:`Vae` and hands it to its sampler: the sampler encodes img2img
sources through it, the worker decodes each batch's latents through it, so an upcast made by
either holds for both and neither calls back up into the other.

Example::

    vae = Vae(pipeline, device=torch.device("cpu"))
    latents = vae.encode(sources, generators, dtype=torch.float32)  # uint8 [N, H, W, 3] in
    pixels, bad = vae.decode(latents)  # float32 [N, 3, H, W] in about [-1, 1]; bad rows
    vae.upcast  # True once a non-finite half-precision result moved the VAE to float32
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

__all__ = ["Vae"]

log = logging.getLogger(__name__)


class Vae:
    """The pipeline's VAE, encoding and decoding with the float32 fallback (module docstring).

    Used by the worker thread only. ``upcast`` is ``True`` once the fallback was taken.

    Example::

        vae = Vae(pipeline, device=torch.device("cuda"))
        pixels, bad = vae.decode(latents)
        images = (pixels / 2 + 0.5).clamp(0, 1)  # rows in ``bad`` are NaN/Inf: fail them
    """

    def __init__(self, pipeline: Any, *, device: torch.device) -> None:
        self.pipe: Any = pipeline
        self.device = device
        self.upcast = False

    @property
    def module(self) -> Any:
        """The diffusers ``AutoencoderKL`` (read from the pipeline each time)."""
        return self.pipe.vae

    def upcast_to_float32(self) -> None:
        """Move the VAE to float32 for the rest of the run (a no-op when it already is)."""
        vae = self.module
        if not self.upcast and vae.dtype != torch.float32:
            log.warning(
                "the VAE gave non-finite values in %s; upcasting it to float32 for the rest of "
                "this run (set GENAUG_DTYPE=bfloat16 or use an fp16-fixed VAE to avoid this)",
                vae.dtype,
            )
            vae.to(dtype=torch.float32)
        self.upcast = True

    # -- encode (img2img sources) --------------------------------------------------------------

    def encode(
        self, sources: np.ndarray, generators: list[torch.Generator], *, dtype: torch.dtype
    ) -> torch.Tensor:
        """Scaled latents of uint8 ``[N, H, W, 3]`` sources, in ``dtype``.

        A source becomes ``x / 255 * 2 - 1`` (diffusers' PIL path), is encoded, and its
        posterior is sampled with its own generator (one draw per row), then scaled as the UNet
        expects (``latents_mean``/``latents_std`` when the VAE config has them).
        """
        from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
        from diffusers.utils.torch_utils import randn_tensor

        pixels = torch.from_numpy(sources).permute(0, 3, 1, 2).float() / 255.0
        pixels = (2.0 * pixels - 1.0).to(self.device)
        moments = self._encode_moments(pixels)
        posterior = DiagonalGaussianDistribution(moments)
        # posterior.sample(generators), spelled out: one draw per row from that row's generator
        draw = randn_tensor(
            posterior.mean.shape, generator=generators, device=self.device, dtype=moments.dtype
        )
        latents = (posterior.mean + posterior.std * draw).to(dtype)
        config = self.module.config
        mean = getattr(config, "latents_mean", None)
        std = getattr(config, "latents_std", None)
        if mean is not None and std is not None:
            channels = latents.shape[1]
            mean_t = torch.tensor(mean).view(1, channels, 1, 1).to(self.device, dtype)
            std_t = torch.tensor(std).view(1, channels, 1, 1).to(self.device, dtype)
            scaled: torch.Tensor = (latents - mean_t) * config.scaling_factor / std_t
        else:
            scaled = config.scaling_factor * latents
        return scaled

    def _encode_moments(self, pixels: torch.Tensor) -> torch.Tensor:
        """The VAE posterior's moments ``[N, 2C, h, w]``, encoded in the VAE's dtype. A source
        whose moments are not finite in half precision upcasts the VAE to float32 for good, as
        a non-finite decode does, and is encoded again."""
        vae = self.module
        moments = _moments(vae, pixels.to(vae.dtype))
        bad = ~torch.isfinite(moments.flatten(1)).all(dim=1)
        if bad.any() and vae.dtype != torch.float32:
            self.upcast_to_float32()
            rows = bad.nonzero().flatten()
            moments = moments.float()
            moments[rows] = _moments(vae, pixels[rows].to(vae.dtype)).float()
        return moments

    # -- decode (every batch) ------------------------------------------------------------------

    def decode(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels ``[N, 3, H, W]`` in float32 (about ``[-1, 1]``) and a boolean ``[N]`` of the
        rows that are not finite even so.

        A row whose latents are finite but whose pixels are not (the half-precision overflow)
        upcasts the VAE to float32 and is decoded again; non-finite latents (a UNet overflow)
        stay bad.
        """
        finite_latents = torch.isfinite(latents.flatten(1)).all(dim=1)
        pixels = self._decode(latents).float()
        bad = ~torch.isfinite(pixels.flatten(1)).all(dim=1)
        retry = (bad & finite_latents).nonzero().flatten()
        if retry.numel():
            self.upcast_to_float32()
            pixels[retry] = self._decode(latents[retry].float()).float()
            bad = ~torch.isfinite(pixels.flatten(1)).all(dim=1)
        return pixels, bad

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.module
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


def _moments(vae: Any, pixels: torch.Tensor) -> torch.Tensor:
    moments: torch.Tensor = vae.encode(pixels).latent_dist.parameters
    return moments
