"""``genaug adapt``'s final check: does the new LoRA draw each label as asked?

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

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ..judge.encoders import Encoder
    from ..pipeline.load import LoadedModel
    from ..recipes.spec import Recipe

__all__ = ["GOAL", "SHEET_SIDE", "TRUST", "UNSURE_COLOUR", "WRONG_COLOUR", "CheckResult",
           "LabelCheck", "calibrated_bar", "check_adapter", "cross_validate", "draw",
           "read_sheet", "read_shots", "score"]

#: A label is learned when at least this share of its images is drawn as asked.
GOAL = 0.8
#: Below this leave-one-shot-out accuracy the judge cannot tell the user's own images apart
#: well enough for its table to mean much; the verdict says so.
TRUST = 0.7
#: The first seed of the check's images (label ``i``'s images: ``FIRST_SEED + i * per_label``
#: onwards): fixed, so the same LoRA always gets the same table.
FIRST_SEED = 10_000
#: The bar a drawn image's probability must reach: this quantile of the held-out shots'.
CALIBRATION = 0.1
#: The largest side, in pixels, of one image on the check's sheet (``OUT.check.png``).
SHEET_SIDE = 256
#: The frame, in pixels, around each image on the sheet: its colour says how the image counted
#: (none: drawn as asked), and it lies outside the image, so the image keeps its pixels.
SHEET_FRAME = 3
#: The frame of an image the judge scored as another label.
WRONG_COLOUR = (230, 0, 0)
#: The frame of an image scored as its own label, but under the bar (``min_score``): unsure.
UNSURE_COLOUR = (255, 170, 0)
#: The PNG text chunk that holds the sheet's layout, for :func:`read_sheet`.
_SHEET_KEY = "genaug-check-sheet"
_SUFFIXES = {".png", ".jpg", ".jpeg"}


@dataclass(frozen=True)
class LabelCheck:
    """One label: ``drawn`` of ``asked`` images scored as this label; ``seen_as`` counts the
    labels the others were scored as; ``calls`` says, image by image in the order drawn, what
    each was scored as (this label, another, or ``"unsure"``): the sheet's frames."""

    label: str
    asked: int
    drawn: int
    seen_as: dict[str, int] = field(default_factory=dict)
    calls: tuple[str, ...] = ()

    @property
    def share(self) -> float:
        return self.drawn / self.asked if self.asked else 0.0


@dataclass(frozen=True)
class CheckResult:
    """The check's figures: per label, the judge's cross-validated accuracy on the shots
    (``None`` with one shot per label) and the seconds the check took."""

    labels: list[LabelCheck]
    judge_accuracy: float | None
    judge_held_out: int
    encoder: str
    seconds: float
    goal: float = GOAL
    min_score: float = 0.0
    #: the images scored, per label (uint8 ``[N, H, W, C]``): what :meth:`sheet` draws
    drawn: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def share(self) -> float:
        """Drawn as asked over all labels."""
        asked = sum(c.asked for c in self.labels)
        return sum(c.drawn for c in self.labels) / asked if asked else 0.0

    @property
    def missed(self) -> list[LabelCheck]:
        """Labels under the goal, the worst first."""
        return sorted((c for c in self.labels if c.share < self.goal), key=lambda c: c.share)

    def table(self) -> str:
        """The per-label table: label, drawn as asked (k of N), %, what the others looked like."""
        width = max([5, *(len(c.label) for c in self.labels)])
        lines = [f"{'label':<{width}}  drawn as asked      %  the others scored as"]
        for c in self.labels:
            others = ", ".join(f"{k}: {v}" for k, v in sorted(c.seen_as.items(),
                                                                key=lambda kv: -kv[1]))
            lines.append(f"{c.label:<{width}}  {c.drawn:>5} of {c.asked:<5}  "
                         f"{100 * c.share:>5.0f}  {others or '-'}")
        asked = sum(c.asked for c in self.labels)
        lines.append(f"{'all':<{width}}  {sum(c.drawn for c in self.labels):>5} of {asked:<5}  "
                     f"{100 * self.share:>5.0f}")
        return "\n".join(lines)

    def judge_line(self) -> str:
        """How far the judge itself can be trusted, in one line."""
        if self.judge_accuracy is None:
            return (f"judge: {self.encoder}, fitted on your images; with one image per label "
                    "it cannot be cross-validated")
        return (f"judge: {self.encoder}, fitted on your images; it labels "
                f"{100 * self.judge_accuracy:.0f} % of {self.judge_held_out} held-out images "
                f"right (one per label left out in turn); an image counts at p >= "
                f"{self.min_score:.2f}")

    def verdict(self, steps: int, rank: int) -> str:
        """One line: learned, or the worst label and the fix."""
        unsure = ""
        if self.judge_accuracy is not None and self.judge_accuracy < TRUST:
            unsure = (f" (but the judge tells your own held-out images apart only "
                      f"{100 * self.judge_accuracy:.0f} % of the time: add images per label, "
                      "or give the recipe a judge: encoder that suits them)")
        missed = self.missed
        if not missed:
            low = min(self.labels, key=lambda c: c.share)
            return (f"learned: every label drawn as asked at least {100 * self.goal:.0f} % of "
                    f"the time (lowest: label {low.label}, {low.drawn} of {low.asked})"
                    f"{unsure}")
        worst = missed[0]
        fix = f"train longer, --steps {2 * steps}"
        if rank < 32:
            fix += " --rank 32"
        if worst.share == 0 and worst.seen_as:
            seen = max(worst.seen_as.items(), key=lambda kv: kv[1])[0]
            what = f"drawn as asked, most scored as {seen}"
        else:
            what = "drawn as asked"
        more = (f"; {len(missed) - 1} more label(s) under {100 * self.goal:.0f} %"
                if len(missed) > 1 else "")
        return (f"not learned: label {worst.label}: {worst.drawn} of {worst.asked} {what}: "
                f"{fix}{more}{unsure}")

    def sheet(self, max_side: int = SHEET_SIDE) -> bytes:
        """A PNG of every image the check scored: one row per label in the recipe's order,
        the label's name at its left, its images left to right in the order they were drawn
        (seed :data:`FIRST_SEED` + ``i * per_label`` onwards). An image that did not count
        as drawn as asked has a frame: :data:`WRONG_COLOUR` when it was scored as another
        label, :data:`UNSURE_COLOUR` when its own label was the most probable but under the
        bar; a legend line above says so. Images up to ``max_side`` pixels keep their pixels
        (the frames lie around them), and :func:`read_sheet` cuts them back out; larger ones
        (SDXL) are shrunk to fit ``max_side``. ``genaug adapt`` writes it as
        ``OUT.check.png``."""
        import json

        from PIL import Image, ImageDraw, ImageFont
        from PIL.PngImagePlugin import PngInfo

        rows = [(c, self.drawn[c.label]) for c in self.labels if c.label in self.drawn]
        if not rows or not any(len(r) for _, r in rows):
            raise ValueError("the check kept no images to draw")
        h, w, ch = next(r for _, r in rows if len(r)).shape[1:]
        scale = min(1.0, max_side / max(h, w))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        font = ImageFont.load_default()
        legend = [(WRONG_COLOUR, "scored as another label"),
                  (UNSURE_COLOUR, f"its own label at p < {self.min_score:.2f} (unsure)"),
                  (None, "no frame: drawn as asked")]
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        # the legend is one line of swatch + words; the label column fits the longest name
        words = [probe.textlength(text, font=font) for _, text in legend]
        legend_w = round(sum(words) + 24 * len(legend) + 8)
        left = round(max(probe.textlength(c.label, font=font) for c, _ in rows)) + 12
        top, frame = 18, SHEET_FRAME
        pitch_x, pitch_y = size[0] + 2 * frame + 2, max(size[1] + 2 * frame + 2, 16)
        columns = max(len(r) for _, r in rows)
        canvas = Image.new("RGB", (max(left + columns * pitch_x, legend_w),
                                   top + len(rows) * pitch_y), "white")
        pen = ImageDraw.Draw(canvas)
        x = 4
        for (colour, text), width in zip(legend, words, strict=True):
            if colour is not None:
                pen.rectangle((x, 4, x + 9, 13), fill=colour)
                x += 14
            pen.text((x, 3), text, fill="black", font=font)
            x += round(width) + 10
        boxes: dict[str, list[list[int]]] = {}
        for i, (check, images) in enumerate(rows):
            y = top + i * pitch_y
            pen.text((4, y + pitch_y // 2 - 6), check.label, fill="black", font=font)
            boxes[check.label] = []
            for j, image in enumerate(images):
                tile = Image.fromarray(image[..., 0] if ch == 1 else image).convert("RGB")
                if scale < 1.0:
                    tile = tile.resize(size, Image.Resampling.LANCZOS)
                x = left + j * pitch_x
                call = check.calls[j] if j < len(check.calls) else check.label
                if call != check.label:
                    pen.rectangle((x, y, x + size[0] + 2 * frame - 1,
                                   y + size[1] + 2 * frame - 1),
                                  fill=UNSURE_COLOUR if call == "unsure" else WRONG_COLOUR)
                canvas.paste(tile, (x + frame, y + frame))
                boxes[check.label].append([x + frame, y + frame])
        info = PngInfo()
        info.add_text(_SHEET_KEY, json.dumps({"size": list(size), "channels": int(ch),
                                              "boxes": boxes}))
        buf = io.BytesIO()
        canvas.save(buf, format="PNG", pnginfo=info)
        return buf.getvalue()

    def to_dict(self) -> dict[str, Any]:
        return {"share": round(self.share, 4), "goal": self.goal,
                "judge_accuracy": (None if self.judge_accuracy is None
                                   else round(self.judge_accuracy, 4)),
                "judge_held_out": self.judge_held_out, "encoder": self.encoder,
                "min_score": round(self.min_score, 4),
                "seconds": round(self.seconds, 2),
                "labels": {c.label: {"drawn": c.drawn, "asked": c.asked,
                                     "share": round(c.share, 4), "seen_as": c.seen_as}
                           for c in self.labels}}


def read_sheet(png: bytes | Path) -> dict[str, np.ndarray]:
    """The images on a sheet :meth:`CheckResult.sheet` wrote (``OUT.check.png``), per label
    in the sheet's order: uint8 ``[n, h, w, C]`` (C as drawn; shrunk images as shown).

    Raises:
        ValueError: the PNG is not such a sheet (its layout chunk is missing).
    """
    import json

    from PIL import Image

    data = png.read_bytes() if isinstance(png, Path) else png
    with Image.open(io.BytesIO(data)) as image:
        layout = image.info.get(_SHEET_KEY)
        pixels = np.asarray(image.convert("RGB"))
    if layout is None:
        raise ValueError(f"not a genaug adapt check sheet (no {_SHEET_KEY!r} chunk); read the "
                         "OUT.check.png genaug adapt wrote")
    spec = json.loads(layout)
    w, h = spec["size"]
    out = {}
    for label, boxes in spec["boxes"].items():
        cells = [pixels[y:y + h, x:x + w] for x, y in boxes]
        stacked = np.stack(cells) if cells else np.zeros((0, h, w, 3), np.uint8)
        out[label] = stacked[..., :1] if spec["channels"] == 1 else stacked
    return out


def read_shots(data: Path, recipe: Recipe) -> dict[str, np.ndarray]:
    """``data/<label>/*`` as the pool stores images (the recipe's output size and channels),
    every label of the recipe (``genaug adapt`` has already checked each has images)."""
    from ..recipes.sources import load_shots

    shots = {}
    for label in recipe.label_names:
        files = sorted(p for p in (data / label).glob("*") if p.suffix.lower() in _SUFFIXES)
        shots[label] = load_shots(files, recipe.output_size, recipe.output_channels)
    return shots


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
