"""The turbo UNet: a second copy of the UNet with the turbo LoRA fused in, beside the first.

``GENAUG_TURBO_LORA`` (:mod:`genaug.service.sampling.modes`) is fused into a copy of the UNet
(:func:`~genaug.service.pipeline.turbo_lora.fuse_turbo_unet`) before the acceleration options are
applied, so compiling and FP8 treat it as they treat the first (its weights are plain
weights); batches whose key says ``speed="turbo"`` run it, every other batch runs the first
UNet, untouched, so a quality image is the image it always was. Why a copy and not a second
LoRA slot: switching modes then costs nothing (no weights move, nothing compiles again), FP8
stays possible, and the cost is memory: one more UNet (2.6 B parameters: 5.1 GB in bf16, 2.6
GB in FP8), measured in docs/benchmarks.md.

The copy is the model's (``model.state.turbo_unet``: :class:`~genaug.service.pipeline.load.
ModelState`), not a component of the diffusers pipeline, so the pipeline's own methods never
see it. The service's turbo mode is resolved once (:func:`served_turbo`, at the app's
start: its sampler names the LoRA's kind and content hash) and that one
:class:`~genaug.service.sampling.modes.Turbo` draws ``/v1/generate``'s turbo requests, the
pools' and ``auto``'s. Example::

    turbo = served_turbo(settings)     # the Turbo served, its LoRA hash named (or None)
    attach_turbo(model, turbo)         # with a turbo LoRA: its fused copy of the UNet
    model.state.turbo_unet             # the fused copy, or None
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..sampling.modes import Turbo, turbo_mode
from .weights import hash_files

if TYPE_CHECKING:
    from .load import LoadedModel

__all__ = ["attach_turbo", "served_turbo"]

log = logging.getLogger(__name__)


def served_turbo(settings: Any) -> Turbo | None:
    """The turbo mode ``settings`` serve, resolved once: with ``GENAUG_TURBO_LORA`` its
    sampler names the LoRA's kind and content hash (what the pool's provenance keeps); else
    the built-in model's setting, or None. Torch-free. A file that is not there is named
    without a hash: :func:`attach_turbo` then refuses it, in one line, before anything is
    served."""
    lora: Path | None = settings.turbo_lora
    digest = hash_files([lora]) if lora is not None and lora.is_file() else None
    return turbo_mode(settings, lora_hash=digest)


def attach_turbo(model: LoadedModel, turbo: Turbo | None) -> None:
    """Serve ``turbo`` on ``model``: with a turbo LoRA, its UNet copy fused and kept in
    ``model.state.turbo_unet``; else none (a built-in model's setting draws with the first
    UNet).

    Raises :class:`~genaug.service.pipeline.turbo_lora.TurboLoraError` for a file that is not
    a turbo LoRA of this model (one line, with the fix)."""
    if turbo is None or turbo.lora is None:
        # A model object served again without a turbo LoRA (tests share one) runs none.
        model.state.turbo_unet = None
        return
    from .turbo_lora import fuse_turbo_unet, read_turbo_lora

    started = time.monotonic()
    pipeline: Any = model.pipeline  # diffusers' components are dynamic attributes
    unet = pipeline.unet
    state = read_turbo_lora(turbo.lora, str(turbo.kind), unet_config=unet.config)
    model.state.turbo_unet = fuse_turbo_unet(unet, state)
    log.info("turbo: %s LoRA %s (%s) fused into a copy of the UNet in %.1f s", turbo.kind,
             turbo.lora, turbo.sampling.lora, time.monotonic() - started)
