"""The pipeline's errors, below the modules that raise them, importing nothing (so a process
that never loads a model, the api role, can name them without torch):
:class:`ModelLoadError` (:mod:`~genaug.service.pipeline.device`,
:mod:`~genaug.service.pipeline.load`) and the acceleration options' :class:`AccelerationError`
(:mod:`~genaug.service.pipeline.acceleration`, :mod:`~genaug.service.pipeline.quantize`,
:mod:`~genaug.service.pipeline.attention`)."""

from __future__ import annotations

__all__ = ["AccelerationError", "ModelLoadError"]


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says what was wrong and how to fix it."""


class AccelerationError(RuntimeError):
    """An acceleration option cannot be applied; the message (one line) names the setting, the
    device where it matters, and the fix."""
