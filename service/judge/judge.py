"""A recipe's judge: every pool image scored against the user's own images.

:func:`build_judges` makes one :class:`Judge` per recipe with a ``judge:`` block, once, at
start-up, on the generator's device: it loads the encoder (shared between recipes naming the
same one), reads the shots (``GENAUG_DATA_ROOT/<shots>/<label>/*``, at the recipe's output
size and channels, as the pool stores images) and fits the rule. The planner then calls
:meth:`Judge.score` on each decoded pool batch; the pool stores the scores, and the images
scoring below ``min_score`` are kept and counted but never sampled.

Example::

    judges = build_judges(recipes, data_root=Path("/data/real"), device=torch.device("cpu"))
    judge = judges["digits-5-9"]
    scores = judge.score(images, "7")       # float32 [n]: p(the image shows a 7)
    keep = judge.keep(scores)               # bool [n]: scores >= min_score (0.9)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..recipes.sources import load_shots, resolve_shots
from ..recipes.spec import JudgeSpec, Recipe
from .encoders import Encoder, load_encoder
from .rules import PromptsRule, Rule, ShotsRule

__all__ = ["Judge", "build_judge", "build_judges"]

log = logging.getLogger(__name__)


class Judge:
    """Scores images of a recipe's labels: the probability each shows its label."""

    def __init__(self, spec: JudgeSpec, encoder: Encoder, rule: Rule) -> None:
        self.spec = spec
        self.encoder = encoder
        self.rule = rule
        self.min_score = spec.min_score
        self._column = {label: k for k, label in enumerate(rule.labels)}

    def score(self, images: np.ndarray, label: str) -> np.ndarray:
        """uint8 ``[n, h, w, c]`` images made for ``label`` -> float32 ``[n]`` in 0..1."""
        column = self._column.get(label)
        if column is None:
            raise KeyError(f"the judge knows no label {label!r}; labels: {self.rule.labels}")
        if len(images) == 0:
            return np.zeros(0, np.float32)
        with torch.inference_mode():
            p = self.rule.probabilities(self.encoder.images(images))[:, column]
        return p.cpu().numpy().astype(np.float32)

    def score_and_embed(self, images: np.ndarray, label: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score` and the images' embeddings, each normalised to length 1 (float32
        ``[n, d]``): what ``speed: auto`` measures diversity in. One encoder pass."""
        column = self._column.get(label)
        if column is None:
            raise KeyError(f"the judge knows no label {label!r}; labels: {self.rule.labels}")
        if len(images) == 0:
            return np.zeros(0, np.float32), np.zeros((0, 0), np.float32)
        with torch.inference_mode():
            embeddings = self.encoder.images(images)
            p = self.rule.probabilities(embeddings)[:, column]
            unit = torch.nn.functional.normalize(embeddings.float(), dim=1)
        return (p.cpu().numpy().astype(np.float32), unit.cpu().numpy().astype(np.float32))

    def keep(self, scores: np.ndarray) -> np.ndarray:
        """Whether each score is at least ``min_score`` (the image may be sampled)."""
        return np.asarray(scores) >= self.min_score

    def describe(self) -> dict[str, Any]:
        """The judge's settings, for ``GET /v1/recipes/{name}``."""
        return {"rule": self.spec.rule, "encoder": self.spec.encoder,
                "shots": self.spec.shots, "min_score": self.min_score}


def build_judge(recipe: Recipe, data_root: Path | None, device: torch.device,
                encoder: Encoder | None = None) -> Judge:
    """The judge of ``recipe`` (which must have a ``judge:`` block) on ``device``."""
    spec = recipe.judge
    if spec is None:
        raise ValueError(f"recipe {recipe.name!r} has no judge")
    encoder = encoder or load_encoder(spec.encoder, device)
    rule: Rule
    if spec.rule == "prompts":
        scale = float(getattr(encoder, "logit_scale", 100.0))
        rule = PromptsRule(encoder, {label: list(recipe.labels[label].prompts)
                                     for label in recipe.label_names}, scale)
    else:
        files = resolve_shots(spec.shots, recipe.label_names, data_root)
        shots = {label: load_shots(paths, recipe.output_size, recipe.output_channels)
                 for label, paths in files.items()}
        rule = ShotsRule(encoder, shots)
    return Judge(spec, encoder, rule)


def build_judges(recipes: Mapping[str, Recipe], data_root: Path | None,
                 device: torch.device) -> dict[str, Judge]:
    """One judge per recipe with a ``judge:`` block (encoders shared by name)."""
    encoders: dict[str, Encoder] = {}
    judges = {}
    for name, recipe in recipes.items():
        if recipe.judge is None:
            continue
        started = time.monotonic()
        key = recipe.judge.encoder
        if key not in encoders:
            encoders[key] = load_encoder(key, device)
        judges[name] = build_judge(recipe, data_root, device, encoders[key])
        log.info("judge of recipe %r: rule %s, encoder %s, min_score %g, on %s (%.2f s)",
                 name, recipe.judge.rule, key, recipe.judge.min_score, device,
                 time.monotonic() - started)
    return judges
