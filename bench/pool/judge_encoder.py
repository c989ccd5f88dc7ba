"""The judge's embedding: 8x8 vs 16x16 pixels, raw vs normalised, 0 vs 8 views, on validation 5-9.

The ``shots`` rule fits a logistic regression on the shots' embeddings (docs/curation.md).
Which embedding ``tiny-digits-encoder`` should give it is a setting, so it is chosen here on
a validation split of the training side, never on the test split:

* candidates: the image in grey, area-downsampled to 8x8 or 16x16 (:class:`PixelEncoder`),
  raw or centred and L2-normalised per image (the rule's :func:`normalise`), each fitted on
  the shots alone or on the shots and 8 shifted views of each (the rule's
  :func:`augmented_views`, same seeds); the logistic regression is the rule's (``C``);
* a draw: ``k`` shots per class of digits 5-9 from the ``fewshot`` split, drawn as every
  benchmark draws them (:func:`genaug.digits.subset` with the draw's seed, the 5-shot folders
  of ``write_split_folders``); its validation set is the ``fewshot`` split's other images of
  5-9 (``30 - k`` per class);
* the choice: the highest mean validation accuracy over every ``k`` (``--shots``, 1, 2 and 5
  by default: the judge serves one-shot users too) and every draw (``--seeds``); ties go to
  the earlier candidate in the table;
* then, once, every candidate on the ``test`` split's 250 digits 5-9, for the record.

Means carry a two-sided 95 % Student t interval over the draws. The result names the images
each phase read, by index into scikit-learn's ``load_digits()``: ``chosen_on`` (shots and
validation images of every draw) and ``test_indices``.

    python -m bench.pool.judge_encoder [--quick] [--seeds 20] [--shots 1,2,5] [--json FILE]

Goal: none; it reports whether the choice is the encoder the service embeds today.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.harness import finish, main, make_parser, table

DIGITS = (5, 6, 7, 8, 9)


@dataclass(frozen=True)
class Candidate:
    """One embedding the shots rule could be fitted on."""

    size: int  # pixels per side after area-downsampling
    normalised: bool  # centred and L2-normalised per image
    views: int  # shifted views per shot beside the shot itself

    @property
    def embedding(self) -> str:
        kind = "centred and L2-normalised" if self.normalised else "raw"
        return f"{self.size}x{self.size} pixels, {kind}"

    @property
    def name(self) -> str:
        return f"{self.embedding}, {self.views} views"


@dataclass(frozen=True)
class Draw:
    """One shot draw: indices into ``load_digits()`` of its shots and of its validation set."""

    k: int
    seed: int
    shots: np.ndarray
    validation: np.ndarray


def candidates(views: int) -> list[Candidate]:
    """The table's rows: each embedding without views, then with ``views`` shifted views."""
    return [Candidate(size, normalised, v)
            for size, normalised in ((8, False), (16, False), (16, True))
            for v in (0, views)]


def draws(ks: Sequence[int], seeds: Sequence[int]) -> list[Draw]:
    """Every (k, seed) draw of shots of digits 5-9 from ``fewshot``, with its validation set:
    the split's other images of 5-9. Nothing of the ``test`` split is read."""
    from genaug.digits import split_indices, subset

    fewshot = split_indices("fewshot")
    labels = _all_labels()[fewshot]
    task = np.isin(labels, DIGITS)
    out = []
    for k in ks:
        for seed in seeds:
            chosen = np.zeros(len(fewshot), dtype=bool)
            chosen[subset(labels, k, seed=seed)] = True
            out.append(Draw(k, seed, fewshot[chosen & task], fewshot[~chosen & task]))
    return out


def test_indices() -> np.ndarray:
    """Indices into ``load_digits()`` of the ``test`` split's digits 5-9."""
    from genaug.digits import split_indices

    test = split_indices("test")
    out: np.ndarray = test[np.isin(_all_labels()[test], DIGITS)]
    return out


def _all_labels() -> np.ndarray:
    from sklearn.datasets import load_digits

    return np.asarray(load_digits().target, dtype=np.int64)


def _all_images() -> np.ndarray:
    """Every digit as the judge receives an image: uint8 ``[1797, 64, 64, 3]``."""
    from sklearn.datasets import load_digits

    from genaug.digits import to_rgb64

    return to_rgb64(np.asarray(load_digits().images))


class Scorer:
    """Fits a candidate on a draw's shots and scores it on images given by index."""

    def __init__(self) -> None:
        import torch

        from genaug.service.judge.encoders import PixelEncoder

        self.images = _all_images()
        self.labels = _all_labels()
        self._encoders = {size: PixelEncoder(torch.device("cpu"), size) for size in (8, 16)}
        self._cache: dict[tuple[int, bool], np.ndarray] = {}

    def embed(self, images: np.ndarray, size: int, normalised: bool) -> np.ndarray:
        import torch

        from genaug.service.judge.rules import normalise

        with torch.inference_mode():
            x = self._encoders[size].images(images)
            out: np.ndarray = (normalise(x) if normalised else x).numpy()
        return out

    def _embedded(self, size: int, normalised: bool) -> np.ndarray:
        """Every digit's embedding without views (images are scored as the judge scores
        them: one view each), computed once per embedding."""
        key = (size, normalised)
        if key not in self._cache:
            self._cache[key] = self.embed(self.images, size, normalised)
        return self._cache[key]

    def accuracy(self, candidate: Candidate, shots: np.ndarray, scored: np.ndarray) -> float:
        from sklearn.linear_model import LogisticRegression

        from genaug.service.judge.rules import C, augmented_views

        xs, ys = [], []
        for position, digit in enumerate(DIGITS):
            own = shots[self.labels[shots] == digit]
            # The rule's views: label position as the seed, as ShotsRule(seed=0) draws them.
            images = augmented_views(self.images[own], candidate.views, seed=position)
            xs.append(self.embed(images, candidate.size, candidate.normalised))
            ys.append(np.full(len(images), digit))
        clf = LogisticRegression(C=C, max_iter=5000)
        clf.fit(np.concatenate(xs), np.concatenate(ys))
        x = self._embedded(candidate.size, candidate.normalised)[scored]
        return float(np.mean(clf.predict(x) == self.labels[scored]))


Cells = dict[tuple[Candidate, int], list[float]]
"""Accuracies (0..1) per candidate and k, one per draw."""


def _mean_over_k(cells: Cells, candidate: Candidate, ks: Sequence[int]) -> float:
    """Mean accuracy in % over every draw of every k (each k has as many draws)."""
    return 100.0 * float(np.mean([v for k in ks for v in cells[(candidate, k)]]))


def _per_seed_over_k(cells: Cells, candidate: Candidate, ks: Sequence[int]) -> list[float]:
    """Per data seed, the accuracy averaged over ``ks``: the draws the interval of the mean
    over k is taken over."""
    return [float(np.mean(row)) for row in zip(*(cells[(candidate, k)] for k in ks),
                                               strict=True)]


def _best(cells: Cells, rows: Sequence[Candidate], ks: Sequence[int]) -> Candidate:
    """The candidate with the highest mean over ``ks`` (the first of equals)."""
    return max(rows, key=lambda c: _mean_over_k(cells, c, ks))


def _summary(values: Sequence[float]) -> dict[str, Any]:
    from genaug.gain.stats import mean_interval

    mean, low, high = mean_interval([100.0 * v for v in values])
    return {"mean": round(mean, 2), "low": round(low, 2), "high": round(high, 2),
            "accuracies": [round(v, 4) for v in values]}


def _cell(summary: dict[str, Any]) -> str:
    return f"{summary['mean']:.1f} [{summary['low']:.1f}, {summary['high']:.1f}]"


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", quick="2 draws per k instead of --seeds")
    parser.add_argument("--seeds", type=int, default=20,
                        help="shot draws per k, data seeds 0..N-1 (default 20)")
    parser.add_argument("--shots", default="1,2,5",
                        help="shots per class, comma-separated (default 1,2,5)")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.shots.split(",")]
    if not ks or min(ks) < 1 or max(ks) >= 30:
        parser.error(f"--shots {args.shots!r}: each k must be 1..29 (the fewshot split has "
                     "30 per class; the rest are the validation set)")
    seeds = list(range(2 if args.quick else args.seeds))
    if len(seeds) < 2:
        parser.error(f"--seeds {args.seeds}: at least 2 draws, for an interval")

    import torch

    from genaug.service.judge.encoders import PIXEL_SIZE
    from genaug.service.judge.rules import VIEWS

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    scorer = Scorer()
    rows = candidates(VIEWS)
    today = Candidate(PIXEL_SIZE, True, VIEWS)  # what ShotsRule fits on PixelEncoder today
    all_draws = draws(ks, seeds)

    # Choosing: validation images only.
    validation: Cells = {(c, k): [] for c in rows for k in ks}
    for d in all_draws:
        for c in rows:
            validation[(c, d.k)].append(scorer.accuracy(c, d.shots, d.validation))
    overall = {c: _mean_over_k(validation, c, ks) for c in rows}
    chosen = _best(validation, rows, ks)

    # Reporting: every candidate on the test split, once, after the choice.
    held_out = test_indices()
    test: Cells = {(c, k): [] for c in rows for k in ks}
    for d in all_draws:
        for c in rows:
            test[(c, d.k)].append(scorer.accuracy(c, d.shots, held_out))

    summary = []
    for c in rows:
        for split, cells in (("validation", validation), ("test", test)):
            for k in ks:
                summary.append({"candidate": c.name, "k": k, "split": split,
                                **_summary(cells[(c, k)])})
            summary.append({"candidate": c.name, "k": "mean", "split": split,
                            **_summary(_per_seed_over_k(cells, c, ks))})
    chosen_on = np.unique(np.concatenate([np.concatenate([d.shots, d.validation])
                                          for d in all_draws]))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "ks": ks, "seeds": seeds,
        "candidates": [c.name for c in rows], "today": today.name, "chosen": chosen.name,
        "chosen_is_today": chosen == today,
        "validation_mean": {c.name: round(overall[c], 2) for c in rows},
        "best_per_k": {str(k): _best(validation, rows, [k]).name for k in ks},
        "summary": summary,
        "draws": [{"k": d.k, "seed": d.seed, "shots": d.shots.tolist(),
                   "validation": d.validation.tolist()} for d in all_draws],
        "chosen_on": chosen_on.tolist(), "test_indices": held_out.tolist(),
        "seconds": round(time.perf_counter() - started, 1),
    }

    def mark(c: Candidate) -> str:
        words = [w for w, on in (("chosen", c == chosen), ("today's", c == today)) if on]
        return f" ({', '.join(words)})" if words else ""

    by = {(s["candidate"], s["k"], s["split"]): s for s in summary}
    header = ["embedding", "views", *(f"k={k}" for k in ks), "mean over k"]
    for split in ("validation", "test"):
        table(f"Accuracy on the {split} digits 5-9, % [95 % interval over {len(seeds)} draws]",
              header, [[c.embedding + mark(c), c.views,
                        *(_cell(by[(c.name, k, split)]) for k in [*ks, "mean"])]
                       for c in rows])
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
