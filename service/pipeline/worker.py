"""The diffusers side: turns one batch of items into uint8 images. Nothing else touches torch.

:class:`PipelineWorker` is the batcher's :class:`Worker`. It is called from
one thread only (diffusers pipelines, schedulers and LoRA switches are not thread-safe), and it
is where the per-image guarantees are kept:

- **One UNet call per step for the whole batch.** :class:`~genaug.service.pipeline.sampler.Sampler`
  runs the denoising loop with classifier-free guidance per image: prompt, negative prompt
  (``None`` = zeros, text = encoded), guidance (``<= 1``: none for that image), seed, output
  size and channels may all differ between batch mates. What must be shared is the
  :class:`GroupKey`: generation size, steps, scheduler, LoRA adapter and
  scale, mode (text-to-image, or img2img with its strength).
- **Seeds.** Each image gets its own ``torch.Generator`` for its initial noise, its img2img
  source's VAE sample and noise, and any scheduler noise, so image ``i`` depends on its own
  item, never on its batch mates.
- **Schedulers.** ``GENAUG_SCHEDULER`` (``scheduler=``) is used for keys whose scheduler is
  ``"default"``; other names override it. One instance per name, built from the model's
  scheduler config and cached (:class:`~genaug.service.pipeline.schedulers.Schedulers`).
- **LoRA adapters.** All of ``GENAUG_LORAS`` (``loras=``) are loaded at construction, none
  active; each batch activates its key's adapter at its scale, or none
  (:class:`~genaug.service.pipeline.adapters.Adapters`). Switching costs no reload; with a
  compiled UNet (``hotswap=``) a switch copies the adapter into one slot and never compiles.
- **img2img.** Built from the same components (``StableDiffusionXLImg2ImgPipeline.from_pipe``,
  no second copy of the weights). An item whose source is missing or not uint8
  ``[key.height, key.width, 3]`` fails alone; its batch mates are made.
- **NaN/Inf guard.** The UNet loop returns latents and the worker decodes them through its
  :class:`~genaug.service.pipeline.vae.Vae` (shared with the sampler), so each image is
  checked. A non-finite decode (the SDXL fp16 VAE overflow that gives black images) upcasts
  the VAE to float32 for good and decodes those latents again (a non-finite img2img encode
  does the same); non-finite latents fail only their own items. No such image is ever
  served.
- **Out of memory.** The batch is halved and retried; only an image that cannot run alone
  fails. (The halves start over from their seeds and run to the end without stops.)
- **Stops between steps.** Given the batcher's :class:`Flight`, the worker reads it before
  every denoising step: images whose requests are gone are cut from the batch
  (:meth:`Denoising.keep <genaug.service.pipeline.denoising.Denoising.keep>`; with compiled
  shapes they are finished and not served), the batch stops when none is left, and a pause
  returns :class:`Paused`, whose ``resume`` goes on with the same latents, scheduler state
  and generators, so every image is exactly that of an uninterrupted run.
- **Output size.** Antialiased resize on the device per image, luminance for one-channel
  items, then uint8 HWC on the host.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..batching.items import Flight, GroupKey, Item, Outcome, Paused
from ..metrics import Metrics
from ..sampling.modes import Turbo
from .adapters import Adapters
from .denoising import Denoising
from .load import LoadedModel
from .quantize import nonfinite_advice
from .sampler import Sampler
from .schedulers import Schedulers
from .vae import Vae

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """One batch as the worker keeps it across pauses: the items as handed over, the rows
    still being made (indices into ``items``), refused rows' errors, dropped rows' saved
    steps, and the denoising loop in progress."""

    key: GroupKey
    items: list[Item]
    errors: dict[int, str]
    rows: list[int]
    dropped: dict[int, int] = field(default_factory=dict)
    run: Denoising | None = None

    def outcome(self, made: Outcome | None) -> Outcome:
        """The outcome over all the batch's items; ``made`` holds the images of ``rows``."""
        images = [np.zeros(item.output_shape, np.uint8) for item in self.items]
        errors = dict(self.errors)
        if made is not None:
            for j, r in enumerate(self.rows):
                images[r] = made.images[j]
                if j in made.errors:
                    errors[r] = made.errors[j]
        return Outcome(images=images, errors=errors, dropped=dict(self.dropped))


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class PipelineWorker:
    """Runs batches on one loaded SDXL pipeline (module docstring: the guarantees).

    Example::

        model = load_model(source=None, unet_weights=None, device="cpu", dtype="auto")
        worker = PipelineWorker(model, scheduler="euler_a",
                                loras={"wounds": Path("wounds.safetensors")})
        key = GroupKey(height=64, width=64, steps=4, adapter="wounds", adapter_scale=0.8)
        items = [Item("a red circle", seed=1, guidance=5.0, output_height=64, output_width=64),
                 Item("a blue square", seed=2, guidance=1.0, output_height=32, output_width=32,
                      channels=1)]
        out = worker.run(key, items)   # no flight: an Outcome, never Paused
        [image.shape for image in out.images]  # [(64, 64, 3), (32, 32, 1)]
        worker.schedulers.describe()  # "euler_a (EulerAncestralDiscreteScheduler)"
        worker.adapters.info()  # [{"name": "wounds", "hash": "...", "source": "..."}]

    Raises (from :meth:`run`, for the whole batch): :class:`UnknownSchedulerError` and
    :class:`UnknownAdapterError` (a key the API should have refused), ``ValueError`` for
    steps below 1 or an img2img strength outside (0, 1]. Construction raises
    :class:`AdapterLoadError` for a LoRA file that cannot be loaded.
    """

    def __init__(
        self,
        model: LoadedModel,
        metrics: Metrics | None = None,
        *,
        scheduler: str = "default",
        loras: Mapping[str, Path] | None = None,
        cut_rows: bool = True,
        hotswap: bool = False,
        lora_max_rank: int | None = None,
        turbo: Turbo | None = None,
    ) -> None:
        self.model = model
        #: What ``speed="turbo"`` batches draw with (None: no turbo); its UNet, with a turbo
        #: LoRA, is the model's copy (``model.state.turbo_unet``:
        #: :mod:`~genaug.service.pipeline.turbo_unet`).
        self.turbo = turbo
        self.cut_rows = cut_rows
        # diffusers' pipeline classes are dynamically typed: components are attributes.
        self.pipe: Any = model.pipeline
        self.metrics = metrics
        self.schedulers = Schedulers(self.pipe, default=scheduler)
        self.adapters = Adapters(self.pipe, loras or {}, base_hash=model.weights_hash,
                                base_name=model.source, hotswap=hotswap, max_rank=lora_max_rank)
        # A label's adapter applies in turbo mode too: the same files, loaded the same way
        # into the turbo UNet (a view of the pipeline that holds it, without the text
        # encoders, which the first Adapters already adapts and both modes share; nothing is
        # copied).
        turbo_unet = model.state.turbo_unet
        self.turbo_adapters: Adapters | None = None
        if turbo_unet is not None and loras:
            pipe: Any = model.pipeline
            view = type(pipe)(**{**pipe.components, "unet": turbo_unet, "text_encoder": None,
                                 "text_encoder_2": None})
            self.turbo_adapters = Adapters(
                view, loras, base_hash=model.weights_hash, base_name=model.source,
                hotswap=hotswap, max_rank=lora_max_rank)
        self.vae = Vae(self.pipe, device=model.device)
        self.sampler = Sampler(self.pipe, device=model.device, schedulers=self.schedulers,
                               vae=self.vae, turbo_unet=turbo_unet)

    @classmethod
    def from_settings(
        cls, model: LoadedModel, settings: Settings, metrics: Metrics | None = None,
        turbo: Turbo | None = None,
    ) -> PipelineWorker:
        """The worker the service runs: ``GENAUG_SCHEDULER`` and ``GENAUG_LORAS`` applied;
        dropped rows are cut from a batch only when nothing is compiled (with
        ``GENAUG_COMPILE`` a smaller batch would compile anew), and a compiled UNet's adapters
        are hotswapped into one slot (``GENAUG_LORA_MAX_RANK``), so none compiles anew."""
        compiled = settings.compile != "off"
        return cls(model, metrics, scheduler=settings.scheduler, loras=settings.loras,
                   cut_rows=not compiled, hotswap=compiled,
                   lora_max_rank=settings.lora_max_rank, turbo=turbo)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vae_upcast(self) -> bool:
        """The VAE was moved to float32 after a non-finite half-precision result."""
        return self.vae.upcast

    # -- Worker protocol ---------------------------------------------------------------------

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        """Generate ``items`` with one UNet call per step (or halves of it on out-of-memory).

        Between steps it reads ``flight``: rows dropped there stop (the whole batch stops when
        none is left), and a pause hands back :class:`Paused` to resume later."""
        self.schedulers.resolve(key.scheduler)  # unknown names fail before any work
        refused = _refused(key, items)
        batch = _Batch(key, list(items), errors=dict(refused),
                       rows=[i for i in range(len(items)) if i not in refused])
        return self._go(batch, flight)

    # -- internals ---------------------------------------------------------------------------

    def _go(self, batch: _Batch, flight: Flight | None) -> Outcome | Paused:
        # (Again on resume: the batches run meanwhile may have switched the adapter.) The
        # first UNet's adapters hold the text encoders' LoRA layers too: set for every batch.
        self.adapters.activate(batch.key.adapter, batch.key.adapter_scale)
        if batch.key.speed == "turbo" and self.turbo_adapters is not None:
            self.turbo_adapters.activate(batch.key.adapter, batch.key.adapter_scale)
        try:
            with torch.inference_mode():
                return self._advance(batch, flight)
        finally:
            if self.device.type == "cuda":
                # Freed activations go back to the allocator, not the OS: keep the peak stable.
                torch.cuda.empty_cache()

    def _advance(self, batch: _Batch, flight: Flight | None) -> Outcome | Paused:
        """Step ``batch`` on until it ends, every row is dropped, or ``flight`` asks a pause."""
        key, items = batch.key, batch.items
        if not batch.rows:
            return batch.outcome(None)
        if flight is None and batch.run is None:
            return batch.outcome(self._run(key, [items[r] for r in batch.rows]))  # no stops
        try:
            if batch.run is None:
                batch.run = self.sampler.start(key, [items[r] for r in batch.rows])
            run = batch.run
            while not run.done:
                if flight is not None:
                    dropped, pause = flight.poll()
                    if dropped and self._drop(batch, dropped):
                        return batch.outcome(None)
                    if pause:
                        return Paused(key, items, run.index, run.steps,
                                      resume=lambda later: self._go(batch, later))
                run.step()
            latents = run.latents
        except Exception as exc:
            if not _is_oom(exc):
                raise
            # The halves start over from their seeds (the same images) and run to the end.
            batch.run = None
            return batch.outcome(self._run(key, [items[r] for r in batch.rows]))
        return batch.outcome(self._decode([items[r] for r in batch.rows], latents))

    def _drop(self, batch: _Batch, dropped: frozenset[int]) -> bool:
        """Apply the flight's dropped rows; True when no row is left to make."""
        run = batch.run
        assert run is not None
        new = [r for r in batch.rows if r in dropped and r not in batch.dropped]
        if not new:
            return False
        live = [r for r in batch.rows if r not in dropped]
        if not live:
            for r in batch.rows:
                batch.dropped[r] = run.remaining
            return True
        if self.cut_rows:
            run.keep([batch.rows.index(r) for r in live])
            for r in new:
                batch.dropped[r] = run.remaining
            batch.rows = live
        else:
            # Compiled shapes: a smaller batch would compile anew; finish the rows, serve none.
            for r in new:
                batch.dropped[r] = 0
        return False

    def _run(self, key: GroupKey, items: Sequence[Item]) -> Outcome:
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
        """Latents of every item, in order, from one per-image-guidance sampling loop."""
        return self.sampler.denoise(key, items)

    def _decode(self, items: Sequence[Item], latents: torch.Tensor) -> Outcome:
        n = latents.shape[0]
        errors: dict[int, str] = {}
        pixels, bad = self.vae.decode(latents)
        if bad.any():
            # The fix depends on what the UNet runs (FP8 layers, its dtype): read the model.
            advice = nonfinite_advice(self.pipe.unet)
            for i in bad.nonzero().flatten().tolist():
                errors[i] = (
                    "the model produced NaN/Inf pixels for this image even with a float32 VAE "
                    f"(UNet overflow): {advice}"
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


def _refused(key: GroupKey, items: Sequence[Item]) -> dict[int, str]:
    """Items that cannot be made with ``key``: an img2img item without a uint8
    ``[key.height, key.width, 3]`` source, or a text-to-image item with one."""
    expected = (key.height, key.width, 3)
    refused: dict[int, str] = {}
    for i, item in enumerate(items):
        source = item.source
        if key.mode == "img2img":
            if source is None:
                refused[i] = "img2img item has no source image"
            elif source.dtype != np.uint8 or tuple(source.shape) != expected:
                refused[i] = (
                    f"img2img source is {source.dtype} {tuple(source.shape)}; it must be uint8 "
                    f"{expected}, the key's generation size"
                )
        elif source is not None:
            refused[i] = "a text-to-image item carries a source image; use an img2img key"
    return refused


def _concat(a: Outcome, b: Outcome, offset: int) -> Outcome:
    errors = dict(a.errors)
    errors.update({i + offset: msg for i, msg in b.errors.items()})
    return Outcome(images=[*a.images, *b.images], errors=errors)
