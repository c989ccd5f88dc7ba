"""genaug's denoising loop: classifier-free guidance per image, over the loaded SDXL components.

diffusers' ``StableDiffusionXLPipeline.__call__`` takes one ``guidance_scale`` and one kind of
negative prompt per call, so a batch whose requests differ in guidance had to be split into
several calls, each a full UNet pass per step. :class:`Sampler` runs the same loop with the
same components (text encoders, UNet, VAE, scheduler) but with guidance as a per-image vector
and negative embeddings per image, so every image of a :class:`GroupKey`
shares one UNet call per step.

Semantics, per image, as diffusers defines them for one call:

- **Guidance.** ``guidance > 1`` runs classifier-free guidance for that image:
  ``eps = eps_uncond + g * (eps_text - eps_uncond)``. ``guidance <= 1`` means no guidance: the
  image's prediction is the text-conditioned one and its negative prompt is ignored. The UNet
  input is ``[unconditional rows of the guided images, conditional rows of all images]``; a
  batch in which no image is guided has no unconditional half at all. With a guidance-distilled
  UNet (``time_cond_proj_dim``, e.g. LCM-distilled SDXL) nothing is guided this way: each
  image's ``guidance - 1`` goes into the UNet's guidance embedding instead, as diffusers does.
- **Negative prompt.** ``None`` is zeros (SDXL's ``force_zeros_for_empty_prompt``; a model
  configured without it encodes ``""``); ``""`` or any text is encoded.
- **Micro-conditioning.** ``add_time_ids`` are ``(height, width, 0, 0, height, width)`` of the
  key's generation size for every row, conditional and unconditional; pooled embeddings come
  from the second text encoder, zeros for a ``None`` negative.
- **Randomness.** Each image has its own ``torch.Generator`` seeded with its item's seed.
  It draws, in this order: the VAE posterior sample of its source (img2img), its initial or
  img2img noise, then every scheduler noise (``euler_a``, ``lcm``). An image is therefore a
  function of its own item, the key and the weights, never of its batch mates.
- **img2img.** The source (uint8 ``[H, W, 3]``) becomes ``x / 255 * 2 - 1`` (diffusers'
  PIL path), is VAE-encoded (:class:`~genaug.service.pipeline.vae.Vae`) and sampled with its
  item's generator, scaled, and noised to the first timestep of the strength's share of the
  schedule; the loop then runs the remaining ``int(steps * strength)`` steps, as
  ``StableDiffusionXLImg2ImgPipeline`` does, except that at least one step always runs
  (diffusers fails when ``int(steps * strength)`` is 0).

For a batch with one shared guidance and one kind of negative prompt, the latents equal
``StableDiffusionXLPipeline.__call__(..., output_type="latent")`` (and the img2img pipeline's)
bit for bit on the CPU: same calls, same shapes, same arithmetic
(tests/service/pipeline/test_sampler.py).

Example::

    sampler = Sampler(pipeline, device=torch.device("cpu"), schedulers=Schedulers(pipeline))
    key = GroupKey(height=64, width=64, steps=4)
    items = [Item("a", seed=1, guidance=5.0, output_height=64, output_width=64),
             Item("b", seed=2, guidance=1.0, output_height=64, output_width=64)]
    latents = sampler.denoise(key, items)  # [2, 4, 8, 8], one UNet call of 3 rows per step
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..batching.items import GroupKey, Item
from .denoising import Denoising
from .quiet import quiet_diffusers
from .schedulers import Schedulers
from .vae import Vae

__all__ = ["Sampler", "img2img_pipeline", "prompt_tokens"]

log = logging.getLogger(__name__)

def img2img_pipeline(pipeline: Any) -> Any:
    """``StableDiffusionXLImg2ImgPipeline.from_pipe(pipeline)``: the same component objects
    (no second copy of any weight), in the pipeline's own dtype (``from_pipe`` would otherwise
    cast every shared component to float32)."""
    from diffusers import StableDiffusionXLImg2ImgPipeline

    with quiet_diffusers():
        img2img = StableDiffusionXLImg2ImgPipeline.from_pipe(pipeline, dtype=pipeline.dtype)
    img2img.set_progress_bar_config(disable=True)
    return img2img


def prompt_tokens(pipeline: Any) -> tuple[Callable[[str], int], int]:
    """How many tokens the pipeline's text encoders see of a text (the most over its
    tokenizers, start and end tokens included), and the fewest they read (CLIP's 77)."""
    tokenizers = [t for t in (getattr(pipeline, "tokenizer", None),
                              getattr(pipeline, "tokenizer_2", None)) if t is not None]

    def count(text: str) -> int:
        return max((len(t(text, truncation=False).input_ids) for t in tokenizers), default=0)

    limit = min((int(t.model_max_length) for t in tokenizers), default=77)
    return count, limit


class Sampler:
    """The denoising loop with per-image guidance (module docstring); returns latents.

    img2img sources are encoded through ``vae`` (the worker passes the one it decodes with,
    so a float32 upcast made by either holds for both); without one the sampler makes its own.

    Example::

        sampler = Sampler(pipeline, device=torch.device("cpu"),
                          schedulers=Schedulers(pipeline))
        latents = sampler.denoise(GroupKey(height=64, width=64, steps=4), items)
    """

    def __init__(
        self,
        pipeline: Any,
        *,
        device: torch.device,
        schedulers: Schedulers,
        vae: Vae | None = None,
        turbo_unet: Any | None = None,
    ) -> None:
        self.pipe: Any = pipeline
        #: The UNet ``speed="turbo"`` batches run (the model's fused copy), or None.
        self.turbo_unet = turbo_unet
        self.img2img: Any = img2img_pipeline(pipeline)
        self.device = device
        self.schedulers = schedulers
        self.vae = vae if vae is not None else Vae(pipeline, device=device)

    # -- the loop ------------------------------------------------------------------------------

    def denoise(self, key: GroupKey, items: Sequence[Item]) -> torch.Tensor:
        """Latents ``[len(items), C, key.height / 8, key.width / 8]``, in item order."""
        run = self.start(key, items)
        while not run.done:
            run.step()
        return run.latents

    def start(self, key: GroupKey, items: Sequence[Item]) -> Denoising:
        """Everything before the first step (text and img2img encoding, the schedule, the
        starting latents), as a :class:`Denoising` to step through."""
        _check_key(key)
        pipe = self.pipe
        turbo = self.turbo_unet if key.speed == "turbo" else None
        unet = turbo if turbo is not None else pipe.unet
        generators = [torch.Generator(device=self.device).manual_seed(it.seed) for it in items]
        # The batch's own scheduler: one paused at a step boundary keeps its state (multistep
        # history, step index) while other batches use the same named scheduler.
        scheduler = copy.deepcopy(self.schedulers.get(key.scheduler))

        embeds, pooled = self._encode([item.prompt for item in items])
        distilled = unet.config.time_cond_proj_dim is not None
        guided = [i for i, item in enumerate(items) if item.guided and not distilled]
        negative = negative_pooled = None
        if guided:
            negative, negative_pooled = self._negatives([items[i] for i in guided], embeds, pooled)
        dtype = embeds.dtype

        # Timesteps, then the starting latents (the order diffusers uses: init_noise_sigma and
        # add_noise read the schedule that set_timesteps made).
        scheduler.set_timesteps(key.steps, device=self.device)
        if key.mode == "img2img":
            timesteps = _strength_timesteps(scheduler, key.steps, key.strength)
            latents = self._img2img_latents(
                key, items, generators, scheduler, timesteps[:1], dtype
            )
        else:
            timesteps = scheduler.timesteps
            latents = self._noise_latents(key, len(items), generators, dtype, scheduler)
            if hasattr(scheduler, "set_begin_index"):
                scheduler.set_begin_index(0)

        timestep_cond = None
        if distilled:
            w = torch.tensor([item.guidance - 1 for item in items])
            timestep_cond = pipe.get_guidance_scale_embedding(
                w, embedding_dim=unet.config.time_cond_proj_dim
            ).to(device=self.device, dtype=latents.dtype)
        return Denoising(
            unet, self.time_ids, key, list(items), generators, scheduler, timesteps, latents,
            embeds=embeds, pooled=pooled, guided=guided, negative=negative,
            negative_pooled=negative_pooled, timestep_cond=timestep_cond,
        )

    # -- pieces --------------------------------------------------------------------------------

    def _encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Penultimate hidden states of both text encoders, concatenated, and the pooled
        projection of the second: ``encode_prompt`` without its guidance half."""
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=False,
        )
        return embeds, pooled

    def _negatives(
        self, items: list[Item], embeds: torch.Tensor, pooled: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Negative embeddings of the guided items: zeros for ``None`` (when the model forces
        zeros for an empty prompt), else the encoded text. diffusers encodes a negative prompt
        exactly as a prompt (same tokenizers, padding, layers), so one path serves both."""
        k = len(items)
        negative = torch.zeros((k, *embeds.shape[1:]), dtype=embeds.dtype, device=embeds.device)
        negative_pooled = torch.zeros(
            (k, *pooled.shape[1:]), dtype=pooled.dtype, device=pooled.device
        )
        zeros_for_none = bool(self.pipe.config.force_zeros_for_empty_prompt)
        texts = {
            j: item.negative_prompt if item.negative_prompt is not None else ""
            for j, item in enumerate(items)
            if item.negative_prompt is not None or not zeros_for_none
        }
        if texts:
            rows = list(texts)
            encoded, encoded_pooled = self._encode(list(texts.values()))
            index = torch.tensor(rows, device=embeds.device, dtype=torch.long)
            negative[index] = encoded.to(negative.dtype)
            negative_pooled[index] = encoded_pooled.to(negative_pooled.dtype)
        return negative, negative_pooled

    def time_ids(
        self, key: GroupKey, *, rows: int, negative_rows: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """SDXL micro-conditioning for every UNet row, from the mode's own pipeline method."""
        size = (key.height, key.width)
        projection_dim = int(self.pipe.text_encoder_2.config.projection_dim)
        if key.mode == "img2img":
            positive, negative = self.img2img._get_add_time_ids(
                size, (0, 0), size, 6.0, 2.5, size, (0, 0), size,
                dtype=dtype, text_encoder_projection_dim=projection_dim,
            )
        else:
            positive = negative = self.pipe._get_add_time_ids(
                size, (0, 0), size, dtype=dtype, text_encoder_projection_dim=projection_dim
            )
        ids = torch.cat(
            [negative.repeat(negative_rows, 1), positive.repeat(rows - negative_rows, 1)]
        )
        return ids.to(self.device)

    def _noise_latents(
        self,
        key: GroupKey,
        n: int,
        generators: list[torch.Generator],
        dtype: torch.dtype,
        scheduler: Any,
    ) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        factor = self.pipe.vae_scale_factor
        shape = (n, self.pipe.unet.config.in_channels, key.height // factor, key.width // factor)
        noise: torch.Tensor = randn_tensor(
            shape, generator=generators, device=self.device, dtype=dtype
        )
        scaled: torch.Tensor = noise * scheduler.init_noise_sigma
        return scaled

    def _img2img_latents(
        self,
        key: GroupKey,
        items: Sequence[Item],
        generators: list[torch.Generator],
        scheduler: Any,
        start: torch.Tensor,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """Encode the sources, sample each posterior with its item's generator, scale, and
        noise to ``start`` (the strength's first timestep) with the same generators."""
        from diffusers.utils.torch_utils import randn_tensor

        sources = np.stack([_source_array(item, key) for item in items])
        latents = self.vae.encode(sources, generators, dtype=dtype)
        noise = randn_tensor(latents.shape, generator=generators, device=self.device, dtype=dtype)
        noised: torch.Tensor = scheduler.add_noise(latents, noise, start.repeat(len(items)))
        return noised


def _strength_timesteps(scheduler: Any, steps: int, strength: float) -> torch.Tensor:
    """``StableDiffusionXLImg2ImgPipeline.get_timesteps`` (without ``denoising_start``), with
    at least one step: the last ``max(1, int(steps * strength))`` steps of the schedule."""
    run = max(1, min(int(steps * strength), steps))
    start = (steps - run) * scheduler.order
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(start)
    timesteps: torch.Tensor = scheduler.timesteps[start:]
    return timesteps


def _source_array(item: Item, key: GroupKey) -> np.ndarray:
    source = item.source
    expected = (key.height, key.width, 3)
    if source is None or source.dtype != np.uint8 or tuple(source.shape) != expected:
        got = "none" if source is None else f"{source.dtype} {tuple(source.shape)}"
        raise ValueError(f"img2img source must be uint8 {expected}, got {got}")
    return source


def _check_key(key: GroupKey) -> None:
    if key.steps < 1:
        raise ValueError(f"steps {key.steps} must be at least 1")
    if key.mode == "img2img" and not 0 < key.strength <= 1:
        raise ValueError(f"img2img strength {key.strength} is outside (0, 1]")
    if key.mode not in ("text", "img2img"):
        raise ValueError(f"unknown mode {key.mode!r}; use 'text' or 'img2img'")
