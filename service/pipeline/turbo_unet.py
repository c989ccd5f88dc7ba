"""The turbo UNet: a second copy of the UNet with the turbo LoRA fused in, beside the first.

``GENAUG_TURBO_LORA`` (:mod:`genaug.service.turbo`) is fused into a copy of the UNet
(:func:`~genaug.service.pipeline.turbo_lora.fuse_turbo_unet`) before the acceleration options are
applied, so compiling and FP8 treat it as they treat the first (its weights are plain
weights); batches whose key says ``speed="turbo"`` run it, every other batch runs the first
UNet, untouched, so a quality image is the image it always was. Why a copy and not a second
LoRA slot: switching modes then costs nothing (no weights move, nothing compiles again), FP8
stays possible, and the cost is memory: one more UNet (2.6 B parameters: 5.1 GB in bf16, 2.6
GB in FP8), measured in docs/benchmarks.md.

The copy is the model's (``model.state.turbo_unet``: :class:`~genaug.service.pipeline.load.
ModelState`), not a component of the diffusers pipeline, so the pipeline's own methods never
see it. Example::

    turbo = attach_turbo(model, settings)   # the Turbo served, its LoRA hash named
    model.state.turbo_unet                  # the fused copy, or None
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..turbo import Turbo, turbo_mode
from .weights import hash_files

if TYPE_CHECKING:
    from .load import LoadedModel

__all__ = ["attach_turbo"]

log = logging.getLogger(__name__)


def attach_turbo(model: LoadedModel, settings: Any) -> Turbo | None:
    """The turbo mode ``settings`` serve on ``model``: with ``GENAUG_TURBO_LORA`` its UNet
    copy fused and kept in ``model.state.turbo_unet``, and its sampler named with the LoRA's
    kind and content hash (what the pool's provenance keeps); else the built-in model's
    setting, or None.

    Raises :class:`~genaug.service.pipeline.turbo_lora.TurboLoraError` for a file that is not
    a turbo LoRA of this model (one line, with the fix)."""
    turbo = turbo_mode(settings)
    if turbo is None or turbo.lora is None:
        # A model object served again without a turbo LoRA (tests share one) runs none.
        model.state.turbo_unet = None
        return turbo
    from .turbo_lora import fuse_turbo_unet, read_turbo_lora

    started = time.monotonic()
    pipeline: Any = model.pipeline  # diffusers' components are dynamic attributes
    unet = pipeline.unet
    state = read_turbo_lora(turbo.lora, str(turbo.kind), unet_config=unet.config)
    model.state.turbo_unet = fuse_turbo_unet(unet, state)
    digest = hash_files([turbo.lora])
    log.info("turbo: %s LoRA %s (%s) fused into a copy of the UNet in %.1f s", turbo.kind,
             turbo.lora, digest, time.monotonic() - started)
    return replace(turbo, sampling=turbo.sampling.with_lora(f"{turbo.kind} {digest}"))

