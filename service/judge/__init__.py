"""The judge: every pool image scored, on the generator's device, against the user's shots.

``encoders.py`` (the embedded ``tiny-digits-encoder`` and a user's transformers folder),
``rules.py`` (``shots``: a classifier fitted on the shots' embeddings; ``prompts``: zero-shot
agreement with the labels' prompts), ``judge.py`` (:class:`Judge`, :func:`build_judges`).
The recipe's ``judge:`` block is :class:`~genaug.service.recipes.spec.JudgeSpec`.
"""

from __future__ import annotations

from .judge import Judge, build_judge, build_judges

__all__ = ["Judge", "build_judge", "build_judges"]
