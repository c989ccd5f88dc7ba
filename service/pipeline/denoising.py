"""One batch's denoising loop, stepped one UNet call at a time, that can stop and go on.

:class:`Denoising` is made by :meth:`Sampler.start <genaug.service.pipeline.sampler.Sampler.start>`
(text and img2img encoding, the schedule, the starting latents) and holds all the loop
carries between steps, so the worker can pause a batch at a step boundary, run other batches,
and resume it with bit-identical results, or drop some of its images and go on with the
rest (:meth:`Denoising.keep`). The arithmetic of a step is the sampler's (see its module
docstring): per-image classifier-free guidance, each image's own generator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..batching.items import GroupKey, Item
from .schedulers import STEP_KWARGS

__all__ = ["Denoising", "guide", "step_kwargs"]


class Denoising:
    """One batch's denoising loop, run a step at a time (:meth:`Sampler.start`).

    It holds everything the loop carries between steps: the latents, the batch's own
    scheduler (with its multistep history), each image's generator, the embeddings. So a
    batch can stop at any step boundary, let other batches run, and go on later with
    bit-identical results; and :meth:`keep` goes on with fewer images, each row still
    exactly what it would have been (an image depends only on its own item).

    Example::

        run = sampler.start(key, items)
        while not run.done:
            run.step()          # one UNet call for every image still kept
        run.keep([0, 2])        # (between steps) continue with items 0 and 2 only
        latents = run.latents
    """

    def __init__(
        self,
        unet: Any,
        time_ids: Callable[..., torch.Tensor],
        key: GroupKey,
        items: list[Item],
        generators: list[torch.Generator],
        scheduler: Any,
        timesteps: torch.Tensor,
        latents: torch.Tensor,
        *,
        embeds: torch.Tensor,
        pooled: torch.Tensor,
        guided: list[int],
        negative: torch.Tensor | None,
        negative_pooled: torch.Tensor | None,
        timestep_cond: torch.Tensor | None,
    ) -> None:
        self._unet = unet
        self._time_ids = time_ids  # Sampler.time_ids: SDXL micro-conditioning rows
        self.key = key
        self.items = items
        self.generators = generators
        self.scheduler = scheduler
        self.timesteps = timesteps
        self.latents = latents
        self.index = 0  # the next step to run
        self._embeds = embeds
        self._pooled = pooled
        self._guided = guided
        self._negative = negative
        self._negative_pooled = negative_pooled
        self._timestep_cond = timestep_cond
        self._prepare()

    @property
    def steps(self) -> int:
        """Denoising steps this batch runs (fewer than ``key.steps`` for img2img)."""
        return len(self.timesteps)

    @property
    def done(self) -> bool:
        return self.index >= self.steps

    @property
    def remaining(self) -> int:
        return self.steps - self.index

    def step(self) -> None:
        """Run the next denoising step for every kept image: one UNet call."""
        t = self.timesteps[self.index]
        k = len(self._guided)
        latents = self.latents
        model_input = torch.cat([latents[self._guided_index], latents]) if k else latents
        model_input = self.scheduler.scale_model_input(model_input, t)
        noise = self._unet(
            model_input,
            t,
            encoder_hidden_states=self._input_embeds,
            timestep_cond=self._timestep_cond,
            added_cond_kwargs=self._added_cond,
            return_dict=False,
        )[0]
        if k:
            noise = guide(
                noise[:k], noise[k:], self._guided_index, self._scale,
                all_guided=k == len(self.items),
            )
        self.latents = self.scheduler.step(
            noise, t, latents, **self._step_kwargs, return_dict=False
        )[0]
        self.index += 1

    def keep(self, rows: Sequence[int]) -> None:
        """Go on with the images at ``rows`` (indices into the current :attr:`items`, in
        order) and drop the others: latents, generators, embeddings, guidance and the
        scheduler's per-image history all lose the dropped rows."""
        rows = list(rows)
        if rows == list(range(len(self.items))):
            return
        n = len(self.items)
        index = torch.tensor(rows, dtype=torch.long, device=self.latents.device)
        shape = tuple(self.latents.shape)
        _keep_scheduler_rows(self.scheduler, index, shape)
        self.latents = self.latents[index]
        self.items = [self.items[r] for r in rows]
        self.generators = [self.generators[r] for r in rows]
        self._embeds = self._embeds[index]
        self._pooled = self._pooled[index]
        if self._timestep_cond is not None:
            self._timestep_cond = self._timestep_cond[index]
        if self._negative is not None and self._negative_pooled is not None:
            position = {row: j for j, row in enumerate(self._guided)}  # row -> negative row
            kept = [r for r in rows if r in position]
            negative_index = torch.tensor(
                [position[r] for r in kept], dtype=torch.long, device=self._negative.device
            )
            self._negative = self._negative[negative_index] if kept else None
            self._negative_pooled = (
                self._negative_pooled[negative_index] if kept else None
            )
            new_row = {row: j for j, row in enumerate(rows)}
            self._guided = [new_row[r] for r in kept]
        assert len(self.items) == len(rows) <= n
        self._prepare()

    def _prepare(self) -> None:
        """The per-step inputs that depend on which images are kept."""
        k = len(self._guided)
        device = self.latents.device
        n = len(self.items)
        embeds, pooled = self._embeds, self._pooled
        if k and self._negative is not None and self._negative_pooled is not None:
            embeds = torch.cat([self._negative, embeds])
            pooled = torch.cat([self._negative_pooled, pooled])
        self._input_embeds = embeds
        time_ids = self._time_ids(self.key, rows=k + n, negative_rows=k, dtype=embeds.dtype)
        self._added_cond = {"text_embeds": pooled, "time_ids": time_ids}
        self._step_kwargs = step_kwargs(self.scheduler, self.generators)
        self._guided_index = torch.tensor(self._guided, device=device, dtype=torch.long)
        self._scale = torch.tensor(
            [self.items[i].guidance for i in self._guided], dtype=torch.float32,
            device=device,
        ).view(-1, *([1] * (self.latents.dim() - 1)))


def _keep_scheduler_rows(scheduler: Any, index: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Index every per-image tensor a scheduler keeps between steps (multistep solvers'
    ``model_outputs``, ``sample``, ``last_sample``, Heun's ``prev_derivative``): those shaped
    exactly like the batch's latents, alone or in a list or tuple."""

    def kept(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
            return value[index.to(value.device)]
        if isinstance(value, list):
            return [kept(v) for v in value]
        if isinstance(value, tuple):
            return tuple(kept(v) for v in value)
        return value

    for name, value in list(vars(scheduler).items()):
        new = kept(value)
        if new is not value and name not in ("config", "_internal_dict"):
            setattr(scheduler, name, new)


def guide(
    uncond: torch.Tensor,
    cond: torch.Tensor,
    guided: torch.Tensor,
    scale: torch.Tensor,
    *,
    all_guided: bool,
) -> torch.Tensor:
    """``uncond + g * (cond - uncond)`` for the guided rows, ``cond`` for the others.

    The product is taken in float32 and rounded to the latents' dtype, which is what diffusers'
    ``python_float * half_tensor`` computes; in float32 it is the same product bit for bit.
    """
    selected = cond if all_guided else cond[guided]
    delta = selected - uncond
    out = uncond + (delta.float() * scale).to(delta.dtype)
    if all_guided:
        return out
    return cond.index_copy(0, guided, out)


def step_kwargs(scheduler: Any, generators: list[torch.Generator]) -> dict[str, Any]:
    """``prepare_extra_step_kwargs``: the per-image generators to schedulers that draw noise,
    and ``eta`` (0, or the class's :data:`~genaug.service.pipeline.schedulers.STEP_KWARGS`)."""
    accepted = inspect.signature(scheduler.step).parameters
    kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        kwargs["eta"] = STEP_KWARGS.get(type(scheduler).__name__, {}).get("eta", 0.0)
    if "generator" in accepted:
        kwargs["generator"] = generators
    return kwargs
