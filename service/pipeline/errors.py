"""The acceleration options' one error (:class:`AccelerationError`), below the modules that raise it
(:mod:`~genaug.service.pipeline.acceleration`, :mod:`~genaug.service.pipeline.quantize`,
:mod:`~genaug.service.pipeline.attention`). Imports nothing."""

from __future__ import annotations

__all__ = ["AccelerationError"]


class AccelerationError(RuntimeError):
    """An acceleration option cannot be applied; the message (one line) names the setting, the
    device where it matters, and the fix."""
