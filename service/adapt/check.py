"""``genaug adapt``'s final check: does the new LoRA draw each label as asked?

Drawing, cross-validation, the calibrated bar and scoring: one piece, because the bar is
the cross-validation's own output and scoring is only meaningful against it. The table,
verdict and sheet it feeds are :mod:`genaug.service.adapt.report`'s; the shots it scores
against come from :func:`genaug.service.adapt.data.read_shots`.

After training, :func:`check_adapter` draws ``per_label`` images of every label of the recipe
through the service's own path (:class:`~genaug.service.pipeline.worker.PipelineWorker` with
the new file loaded as ``GENAUG_LORAS`` loads it, active at scale 1; the recipe's prompts,
size, steps, guidance, scheduler and output size), and scores them with the judge's ``shots``
rule (:class:`~genaug.service.judge.rules.ShotsRule`: a logistic regression on the user's own
images' embeddings, with augmented views) over the recipe's labels. An image is *drawn as
asked* when the rule's most probable label is the one it was drawn for, with a probability at
least the judge's own on the user's images: the :data:`CALIBRATION` quantile (10 %) of the
probabilities the cross-validated rule gives held-out shots of their own label (below).

**Which images the rule is fitted on.** With a few shots per label there are none to spare:
holding shots out of the adapter's training would cost it the data it needs most, and holding
them out of the judge would leave it a weaker classifier than the one the service's curation
uses. So the rule is fitted on all of the user's images, the same ones the adapter trained
on. The leak this opens is memorisation: an image that copies a shot is scored as its label.
That is right for this question (a copy of a 7 is drawn as asked) but says nothing about
variety. What the check must not be is a judge that cannot tell the labels apart, so its own
reliability is measured by cross-validation on the shots: leave one shot of every label out
(one fold per shot index), fit on the rest, classify the held-out shots. That accuracy is
printed with the table (below :data:`TRUST` the verdict says not to trust the check), and the
held-out shots' probabilities set the bar a drawn image must reach: a judge that is sure of
90 % of your own images at p >= 0.7 counts a drawn image only at p >= 0.7. With one shot per
label there is nothing to hold out: the most probable label decides alone.

**It errs on the kind side.** The rule knows only the recipe's labels (a closed set): an image
of something else (the base's old classes, a smudge) is counted as the nearest label. On the
embedded base and digits 5-9 the check read 97 % where an outside 10-way classifier read 86 %
(per label 0 to +30 points) with the most probable label alone; the calibrated bar brings
that to -10 to +15 (docs/benchmarks.md). A "not learned" verdict is reliable; a "learned" one
is an upper bound.

The encoder is the recipe's ``judge.encoder`` when it has a ``judge:`` block, else the
embedded ``tiny-digits-encoder`` (16x16 grey pixels: right for small drawings such as the
digits, weak for photos: give such a recipe a ``judge:`` with a CLIP folder).

Example::

    result = check_adapter(model, Path("five-to-nine.safetensors"), recipe,
                           read_shots(Path("DATA"), recipe), per_label=50)
    print(result.table())
    print(result.verdict(steps=6000, rank=32))
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .report import CheckResult, LabelCheck

if TYPE_CHECKING:
    from ..judge.encoders import Encoder
    from ..pipeline.load import LoadedModel
    from ..recipes.spec import Recipe

__all__ = ["CALIBRATION", "FIRST_SEED", "calibrated_bar", "check_adapter", "cross_validate",
           "draw", "score"]

#: The first seed of the check's images (label ``i``'s images: ``FIRST_SEED + i * per_label``
#: onwards): fixed, so the same LoRA always gets the same table.
FIRST_SEED = 10_000
#: The bar a drawn image's probability must reach: this quantile of the held-out shots'.
CALIBRATION = 0.1


def draw(model: LoadedModel, lora: Path | None, recipe: Recipe, per_label: int,
         first_seed: int = FIRST_SEED, scheduler: str = "default",
         batch: int = 50) -> dict[str, np.ndarray]:
    """``per_label`` images of every label through the service's worker, with ``lora``
    loaded as ``GENAUG_LORAS`` loads it and active at scale 1 (``None``: the base alone);
    each label's prompts in turn. Returns uint8 images at the recipe's output shape."""
    from ..batching.items import GroupKey, Item, Paused
    from ..pipeline.worker import PipelineWorker

    name = "checked"
    worker = PipelineWorker(model, scheduler=scheduler,
                            loras={name: lora} if lora is not None else None)
    key = GroupKey(height=recipe.height, width=recipe.width, steps=recipe.steps,
                   scheduler=recipe.scheduler, adapter=name if lora is not None else None)
    out_h, out_w = recipe.output_size
    images: dict[str, np.ndarray] = {}
    for i, label in enumerate(recipe.label_names):
        spec = recipe.labels[label]
        items = [Item(spec.prompts[k % len(spec.prompts)], seed=first_seed + i * per_label + k,
                      guidance=recipe.guidance, output_height=out_h, output_width=out_w,
                      negative_prompt=spec.negative_prompt, channels=recipe.output_channels)
                 for k in range(per_label)]
        made: list[np.ndarray] = []
        for start in range(0, len(items), batch):
            outcome = worker.run(key, items[start:start + batch])
            assert not isinstance(outcome, Paused)  # no flight given: never paused
            made += [outcome.images[j] for j in outcome.good()]
        images[label] = np.stack(made) if made else np.zeros((0, out_h, out_w,
                                                              recipe.output_channels), np.uint8)
    if lora is not None:  # the model as it was
        pipe: Any = model.pipeline
        pipe.delete_adapters([name])
    return images


def cross_validate(encoder: Encoder,
                   shots: Mapping[str, np.ndarray]) -> tuple[float | None, np.ndarray]:
    """Leave-one-shot-out accuracy of the ``shots`` rule on the user's images, and the
    probability it gave each held-out shot of its own label: fold ``j`` holds out shot ``j``
    of every label that has more than one, fits on the rest, classifies the held-out shots.
    ``(None, [])`` when no label has two."""
    from ..judge.rules import ShotsRule

    labels = list(shots)
    folds = max(len(v) for v in shots.values())
    right = total = 0
    own: list[float] = []
    for j in range(folds):
        held = {label: j for label in labels if len(shots[label]) > 1 and j < len(shots[label])}
        if not held:
            continue
        train = {label: np.delete(shots[label], held[label], axis=0) if label in held
                 else shots[label] for label in labels}
        rule = ShotsRule(encoder, train)
        images = np.stack([shots[label][held[label]] for label in held])
        with torch.inference_mode():
            p = rule.probabilities(encoder.images(images)).cpu().numpy()
        columns = [rule.labels.index(label) for label in held]
        right += int((p.argmax(axis=1) == columns).sum())
        own += [float(p[i, c]) for i, c in enumerate(columns)]
        total += len(held)
    return (right / total if total else None), np.asarray(own, np.float64)


def calibrated_bar(own: np.ndarray) -> float:
    """The probability a drawn image must reach: the :data:`CALIBRATION` quantile of what the
    leave-one-shot-out rule gave held-out shots of their own label (``own`` from
    :func:`cross_validate`); 0.0 when no shot could be held out."""
    return float(np.quantile(own, CALIBRATION)) if len(own) else 0.0


def score(encoder: Encoder, shots: Mapping[str, np.ndarray],
          drawn: Mapping[str, np.ndarray], min_score: float = 0.0) -> list[LabelCheck]:
    """Each label's drawn images scored by the ``shots`` rule fitted on all of ``shots``: one
    counts when its label is the most probable at ``min_score`` or more; the others are
    counted under the most probable label (``"unsure"`` when that is their own)."""
    from ..judge.rules import ShotsRule

    rule = ShotsRule(encoder, shots)
    checks = []
    for label, images in drawn.items():
        if len(images) == 0:
            checks.append(LabelCheck(label, 0, 0))
            continue
        with torch.inference_mode():
            p = rule.probabilities(encoder.images(images)).cpu().numpy()
        names = [rule.labels[k] if rule.labels[k] != label or p[i, k] >= min_score else "unsure"
                 for i, k in enumerate(p.argmax(axis=1))]
        seen: dict[str, int] = {}
        for name in names:
            if name != label:
                seen[name] = seen.get(name, 0) + 1
        checks.append(LabelCheck(label, len(names), names.count(label), seen, tuple(names)))
    return checks


def check_adapter(model: LoadedModel, lora: Path | None, recipe: Recipe,
                  shots: Mapping[str, np.ndarray], *, per_label: int,
                  scheduler: str = "default") -> CheckResult:
    """Draw ``per_label`` images of every label with ``lora`` (``None``: the base alone) and
    score them against ``shots`` (see the module docstring)."""
    from ..judge.encoders import load_encoder
    from ..recipes.spec import TINY_ENCODER

    started = time.monotonic()
    name = recipe.judge.encoder if recipe.judge is not None else TINY_ENCODER
    encoder = load_encoder(name, model.device)
    drawn = draw(model, lora, recipe, per_label, scheduler=scheduler)
    accuracy, own = cross_validate(encoder, shots)
    bar = calibrated_bar(own)
    checks = score(encoder, shots, drawn, bar)
    return CheckResult(checks, accuracy, len(own), name, time.monotonic() - started,
                       min_score=bar, drawn=drawn)
