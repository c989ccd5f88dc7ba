"""diffusers' log lines and warnings that say nothing about genaug's use of it, silenced.

Two context managers, for the calls that make them: :func:`quiet_diffusers` around LoRA
loading (:mod:`~genaug.service.pipeline.adapters`) and ``from_pipe``
(:mod:`~genaug.service.pipeline.sampler`); :func:`quiet_dtype_deprecation` around pipeline
loading (:mod:`~genaug.service.pipeline.load`). Errors still raise.

Example::

    with quiet_diffusers():
        pipeline.load_lora_weights(state, adapter_name="wounds")
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

__all__ = ["quiet_diffusers", "quiet_dtype_deprecation"]


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
