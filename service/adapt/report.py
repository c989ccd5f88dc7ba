"""``genaug adapt``'s report: the per-label table, the verdict line, the sheet PNG and its reader.

:mod:`genaug.service.adapt.check` fills a :class:`CheckResult` (one :class:`LabelCheck` per
label, the judge's cross-validated accuracy, the calibrated bar, the images it scored); this
module turns it into what the user reads: :meth:`CheckResult.table`,
:meth:`CheckResult.judge_line`, :meth:`CheckResult.verdict` (learned, or the worst label and
the fix), ``OUT.check.json`` (:meth:`CheckResult.to_dict`) and ``OUT.check.png``
(:meth:`CheckResult.sheet`, cut back into images by :func:`read_sheet`). It draws and scores
nothing: the figures come from the check, and the benchmarks read sheets without a model.

Example::

    print(result.table())
    print(result.verdict(steps=6000, rank=32))
    read_sheet(Path("five-to-nine.check.png"))["7"]   # uint8 [n, h, w, C], as drawn
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GOAL", "SHEET_SIDE", "TRUST", "UNSURE_COLOUR", "WRONG_COLOUR", "CheckResult",
           "LabelCheck", "read_sheet"]

#: A label is learned when at least this share of its images is drawn as asked.
GOAL = 0.8
#: Below this leave-one-shot-out accuracy the judge cannot tell the user's own images apart
#: well enough for its table to mean much; the verdict says so.
TRUST = 0.7
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
        """A PNG of every image the check scored: one row per label in the recipe's order, the
        label's name at its left, its images left to right in the order they were drawn (seed
        :data:`~genaug.service.adapt.check.FIRST_SEED` + ``i * per_label`` onwards). An image
        that did not count as drawn as asked has a frame: :data:`WRONG_COLOUR` when it was
        scored as another label, :data:`UNSURE_COLOUR` when its own label was the most probable
        but under the bar; a legend line above says so. Images up to ``max_side`` pixels keep
        their pixels (the frames lie around them), and :func:`read_sheet` cuts them back out;
        larger ones (SDXL) are shrunk to fit ``max_side``. ``genaug adapt`` writes it as
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
