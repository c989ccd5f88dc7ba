"""The turbo UNet: a second copy of the UNet with the turbo LoRA fused in, beside the first.

``GENAUG_TURBO_LORA`` (:mod:`genaug.service.turbo`) is fused into a copy of the UNet
(:func:`~genaug.service.pipeline.turbo_lora.fuse_turbo_unet`) before the acceleration options are
applied, so compiling and FP8 treat it as they treat the first (its weights are plain
weights); batches whose key says ``speed="turbo"`` run it, every other batch runs the first
UNet, untouched, so a quality image is the image it always was. Why a copy and not a second
LoRA slot: switching modes then costs nothing (no weights move, nothing compiles again), FP8
stays possible, and the cost is memory: one more UNet (2.6 B parameters: 5.1 GB in bf16, 2.6
GB in FP8), measured in docs/benchmarks.md.

The copy hangs on the pipeline object as a plain attribute (not a registered component, so
diffusers' pipeline methods never see it). Example::

    turbo = attach_turbo(model.pipeline, settings)   # the Turbo served, its LoRA hash named
    turbo_unet_of(model.pipeline)                    # the fused copy, or None
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from ..turbo import Turbo, turbo_mode
from .weights import hash_files

__all__ = ["attach_turbo", "turbo_unet_of"]

log = logging.getLogger(__name__)

_ATTR = "_genaug_turbo_unet"


def attach_turbo(pipeline: Any, settings: Any) -> Turbo | None:
    """The turbo mode ``settings`` serve on ``pipeline``: with ``GENAUG_TURBO_LORA`` its UNet
    copy fused and attached, and its sampler named with the LoRA's kind and content hash
    (what the pool's provenance keeps); else the built-in model's setting, or None.

    Raises :class:`~genaug.service.pipeline.turbo_lora.TurboLoraError` for a file that is not
    a turbo LoRA of this model (one line, with the fix)."""
    turbo = turbo_mode(settings)
    if turbo is None or turbo.lora is None:
        # A model object served again without a turbo LoRA (tests share one) runs none.
        object.__setattr__(pipeline, _ATTR, None)
        return turbo
    from .turbo_lora import fuse_turbo_unet, read_turbo_lora

    started = time.monotonic()
    state = read_turbo_lora(turbo.lora, str(turbo.kind), unet_config=pipeline.unet.config)
    unet = fuse_turbo_unet(pipeline.unet, state)
    object.__setattr__(pipeline, _ATTR, unet)
    digest = hash_files([turbo.lora])
    log.info("turbo: %s LoRA %s (%s) fused into a copy of the UNet in %.1f s", turbo.kind,
             turbo.lora, digest, time.monotonic() - started)
    return replace(turbo, sampling=turbo.sampling.with_lora(f"{turbo.kind} {digest}"))


def turbo_unet_of(pipeline: Any) -> Any | None:
    """The turbo UNet attached to ``pipeline``, or None."""
    return getattr(pipeline, _ATTR, None)
