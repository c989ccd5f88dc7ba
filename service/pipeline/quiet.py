"""diffusers' log lines and warnings that say nothing about genaug's use of it, silenced.

Two context managers, for the calls that make them: :func:`quiet_diffusers` around LoRA
loading (:mod:`~genaug.service.pipeline.adapters`) and ``from_pipe``
(:mod:`~genaug.service.pipeline.sampler`); :func:`quiet_dtype_deprecation` around pipeline
loading (:mod:`~genaug.service.pipeline.load`). Errors still raise.

:func:`quiet_third_party`, called once before diffusers is imported (model loading, the tiny
pipelines), drops three kinds of lines for good, by their loggers and exact wording:
transformers' "`CLIPImageProcessor` requires torchvision (not installed); falling back"
(genaug never uses an image processor); transformers' "Token indices sequence length is
longer than the specified maximum" and diffusers' "The following part of your input was
truncated because CLIP can only handle sequences up to 77 tokens", which it logs on every
batch whose prompt is too long: a recipe's long prompts are reported once, per prompt, when
the model and recipes are loaded (:func:`~genaug.service.recipes.load.long_prompts`).

Example::

    with quiet_diffusers():
        pipeline.load_lora_weights(state, adapter_name="wounds")
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

__all__ = ["quiet_diffusers", "quiet_dtype_deprecation", "quiet_third_party"]

# (logger, start, part): a logger's records whose message starts with `start` and contains
# `part` are dropped. Loggers are per module, so nothing else they say is lost.
_DROPPED = (
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
    """Drops the records whose message starts with ``start`` and contains ``part``."""

    def __init__(self, start: str, part: str) -> None:
        super().__init__()
        self.start, self.part = start, part

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.start) and self.part in message)


def quiet_third_party() -> None:
    """Install the filters of :data:`_DROPPED` (once; calling again changes nothing)."""
    for name, start, part in _DROPPED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(start, part))


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
