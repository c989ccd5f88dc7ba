"""The speed options' one error (:class:`SpeedError`), below the modules that raise it
(:mod:`~genaug.service.pipeline.speed`, :mod:`~genaug.service.pipeline.quantize`,
:mod:`~genaug.service.pipeline.attention`). Imports nothing."""

from __future__ import annotations

__all__ = ["SpeedError"]


class SpeedError(RuntimeError):
    """A speed option cannot be applied; the message (one line) names the setting, the
    device where it matters, and the fix."""
