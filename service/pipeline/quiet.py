"""diffusers' log lines and warnings that say nothing about genaug's use of it, silenced.

Two context managers, for the calls that make them: :func:`quiet_diffusers` around LoRA
loading (:mod:`~genaug.service.pipeline.adapters`) and ``from_pipe``
(:mod:`~genaug.service.pipeline.sampler`); :func:`quiet_dtype_deprecation` around pipeline
loading (:mod:`~genaug.service.pipeline.load`). Errors still raise.

:func:`quiet_third_party`, called once before diffusers is imported (model loading, the tiny
pipelines), drops these lines for good, by their loggers and exact wording:
transformers' "`CLIPImageProcessor` requires torchvision (not installed); falling back"
(genaug never uses an image processor); transformers' "Token indices sequence length is
longer than the specified maximum" and diffusers' "The following part of your input was
truncated because CLIP can only handle sequences up to 77 tokens", which it logs on every
batch whose prompt is too long: a recipe's long prompts are reported once, per prompt, when
the model and recipes are loaded (:func:`~genaug.service.recipes.load.long_prompts`).

And torchao's, with the ``fp8`` extra installed: transformers and diffusers import it whenever
it is installed (their own torchao quantizers, which genaug never uses), FP8 on or off, and at
import it logs the compiled libraries it could not load for this torch ("Failed to load
.../_C_mxfp8...so"), "Detected no triton", torch's pytree deprecation for the enums it
registers ("... is an Enum subclass and is now natively supported by torch.compile") and
diffusers' "Unable to import `torchao` Tensor objects". With FP8 off none of it concerns
genaug. torchao's own lines are held back, not lost: :func:`held_back` returns them, and
:func:`~genaug.service.pipeline.quantize.quantize_fp8` logs them when FP8 is used.

Example::

    with quiet_diffusers():
        pipeline.load_lora_weights(state, adapter_name="wounds")
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

__all__ = ["held_back", "quiet_diffusers", "quiet_dtype_deprecation", "quiet_third_party"]

# Records a filter holds back, at most: what torchao says at import is a few lines.
_HOLD_AT_MOST = 32

# (logger, start, part): a logger's records whose message starts with `start` and contains
# `part` are dropped. Loggers are per module, so nothing else they say is lost.
_DROPPED = (
    # torchao's import: libraries built for another torch or for CUDA, Triton absent.
    ("torchao", "Failed to load ", ""),
    ("torchao", "Skipping import of cpp extensions", ""),
    ("torchao.kernel.intmm", "Warning: Detected no triton", ""),
    # torchao registers its enums with pytree, which torch 2.11+ deprecates (once per enum).
    ("torch.utils._pytree", "<enum ", "is an Enum subclass and is now natively supported"),
    ("diffusers.quantizers.torchao.torchao_quantizer",
     "Unable to import `torchao` Tensor objects", ""),
    ("transformers.utils.import_utils", "`", "requires torchvision (not installed)"),
    # the untruncated count diffusers takes to find what it cut (once per tokenizer)
    ("transformers.tokenization_utils_base",
     "Token indices sequence length is longer than the specified maximum", ""),
    ("diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl",
     "The following part of your input was truncated because CLIP", ""),
    ("diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl_img2img",
     "The following part of your input was truncated because CLIP", ""),
)


class _Drop(logging.Filter):
    """Drops the records whose message starts with ``start`` and contains ``part``; keeps the
    first :data:`_HOLD_AT_MOST` of their messages in :attr:`held`."""

    def __init__(self, start: str, part: str) -> None:
        super().__init__()
        self.start, self.part = start, part
        self.held: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.start) and self.part in message:
            if len(self.held) < _HOLD_AT_MOST:
                self.held.append(message)
            return False
        return True


def quiet_third_party() -> None:
    """Install the filters of :data:`_DROPPED` (once; calling again changes nothing)."""
    for name, start, part in _DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and (f.start, f.part) == (start, part)
                   for f in logger.filters):
            logger.addFilter(_Drop(start, part))


def held_back(logger_name: str, *, take: bool = False) -> list[str]:
    """The messages :func:`quiet_third_party`'s filters dropped from ``logger_name`` and
    its child loggers (per logger in :data:`_DROPPED`'s order, each in the order received);
    ``take`` forgets them, so whoever reports them does so once."""
    prefix = logger_name + "."
    held: list[str] = []
    for name in dict.fromkeys(name for name, _, _ in _DROPPED):
        if name == logger_name or name.startswith(prefix):
            for f in logging.getLogger(name).filters:
                if isinstance(f, _Drop):
                    held.extend(f.held)
                    if take:
                        f.held = []
    return held


@contextlib.contextmanager
def quiet_diffusers() -> Iterator[None]:
    """Silence diffusers' warnings for a moment (dtype casts, absent text-encoder LoRA keys)
    that say nothing about genaug's use of it; errors still raise."""
    logger = logging.getLogger("diffusers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def quiet_dtype_deprecation() -> Iterator[None]:
    """Silence diffusers' ``torch_dtype`` -> ``dtype`` rename warning.

    ``torch_dtype`` is kept because it works on every supported diffusers (>=0.31).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
        yield
