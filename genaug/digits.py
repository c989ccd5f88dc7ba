"""scikit-learn's handwritten digits as genaug's real data: fixed splits, 64x64 images, folders.

The embedded default generator (``GENAUG_MODEL`` unset or ``tiny-digits``) is trained on these
images, the augmentation benchmark and ``genaug demo`` train few-shot classifiers on them, and
the fidelity check scores generated images with a classifier fitted on them. Nothing is
downloaded: :func:`sklearn.datasets.load_digits` reads the copy that ships inside
scikit-learn (UCI "Optical Recognition of Handwritten Digits", E. Alpaydin and C. Kaynak,
1998; CC BY 4.0).

The 1,797 images (8x8, integers 0..16, white ink on black) are split per class with one fixed
permutation (:data:`SPLIT_SEED`), so the three splits are disjoint and stratified:

=============  ==============  ========  ==================================================
split          per class       total     used for
=============  ==============  ========  ==================================================
``test``       50              500       every accuracy reported (never trained on)
``fewshot``    30              300       few-shot classifiers draw their 5 per class here
``generator``  the rest        997       training the generator and the fidelity classifier
=============  ==============  ========  ==================================================

(``generator`` holds 124 to 133 images per class: 1,797 - 800.)

Images become 64x64 RGB uint8 by bicubic upsampling (:func:`to_rgb64`); a 64x64 image goes back
to load_digits' 8x8, 0..16 scale by 8x8 block averaging (:func:`to_digits8`).

Example::

    from genaug.digits import load_split, write_split_folders, fidelity

    images, labels = load_split("fewshot")      # uint8 [300, 64, 64, 3], int64 [300]
    write_split_folders("/tmp/digits")          # /tmp/digits/{generator,fewshot,test}/<0..9>/*.png
    fidelity(images, labels)                    # share a classifier labels as asked, ~0.97

The module needs numpy and scikit-learn only (no torch, no TensorFlow): the service side, the
trainer side and the tools all import it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression

__all__ = [
    "LABELS",
    "PROMPTS",
    "SPLITS",
    "SPLIT_SEED",
    "fidelity",
    "fidelity_classifier",
    "load_split",
    "subset",
    "to_digits8",
    "to_rgb64",
    "write_split_folders",
]

log = logging.getLogger(__name__)

SPLIT_SEED = 20261123
"""Seed of the one permutation (per class) that defines the splits. Never change it: the
shipped generator, the benchmark figures and the demo all refer to these splits."""

SPLITS: dict[str, int | None] = {"test": 50, "fewshot": 30, "generator": None}
"""Images per class in each split, in the order they are taken from the permutation
(``None``: all that remain)."""

LABELS = tuple(str(d) for d in range(10))
"""Class names, also the recipe's label names (``recipes/digits.yaml``)."""

_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PROMPTS = {label: f"a handwritten {word}" for label, word in zip(LABELS, _WORDS, strict=True)}
"""The prompt of each label; the default generator was trained on exactly these."""

IMAGE_SIZE = 64
_INK_MAX = 16.0  # load_digits' pixel range is 0..16


def _require_sklearn() -> Any:
    try:
        import sklearn.datasets
    except ImportError as exc:
        raise ImportError(
            "the digits data set ships with scikit-learn, which is not installed; "
            "pip install scikit-learn (or 'genaug[dev]')"
        ) from exc
    return sklearn.datasets


@lru_cache(maxsize=1)
def _split_indices() -> dict[str, np.ndarray]:
    datasets = _require_sklearn()
    target = np.asarray(datasets.load_digits().target)
    rng = np.random.default_rng(SPLIT_SEED)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for label in range(10):
        members = rng.permutation(np.flatnonzero(target == label))
        start = 0
        for name, count in SPLITS.items():
            stop = len(members) if count is None else start + count
            parts[name].append(members[start:stop])
            start = stop
    return {name: np.sort(np.concatenate(idx)) for name, idx in parts.items()}


def split_indices(split: str) -> np.ndarray:
    """Indices into ``load_digits()`` of one split (sorted, disjoint from the other splits)."""
    if split not in SPLITS:
        raise ValueError(f"unknown digits split {split!r}; choose one of {sorted(SPLITS)}")
    return _split_indices()[split].copy()


def load_split8(split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split at load_digits' own scale: float64 [N, 8, 8] in 0..16, labels int64 [N]."""
    datasets = _require_sklearn()
    digits = datasets.load_digits()
    idx = split_indices(split)
    return np.asarray(digits.images)[idx], np.asarray(digits.target, dtype=np.int64)[idx]


def load_split(split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split as 64x64 RGB: uint8 [N, 64, 64, 3] (see :func:`to_rgb64`), labels int64 [N]."""
    images8, labels = load_split8(split)
    return to_rgb64(images8), labels


def to_rgb64(images8: np.ndarray) -> np.ndarray:
    """8x8 digits in 0..16 -> uint8 [N, 64, 64, 3]: bicubic upsampling, grey on all channels."""
    from PIL import Image

    images8 = np.asarray(images8, dtype=np.float32)
    out = np.empty((len(images8), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, image in enumerate(images8):
        big = Image.fromarray(image * (255.0 / _INK_MAX), mode="F").resize(
            (IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC
        )
        grey = np.clip(np.rint(np.asarray(big)), 0, 255).astype(np.uint8)
        out[i] = grey[..., None]
    return out


def to_digits8(images: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, C] (H, W multiples of 8) -> float64 [N, 64] scaled like load_digits.

    Channels are averaged to grey, each (H/8)x(W/8) block averaged, 0..255 mapped to 0..16.
    """
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[None]
    n, h, w = images.shape[:3]
    if h % 8 or w % 8:
        raise ValueError(f"images of {h}x{w} do not split into 8x8 blocks; use multiples of 8")
    grey = images.astype(np.float64).mean(axis=-1) if images.ndim == 4 else images
    blocks = grey.reshape(n, 8, h // 8, 8, w // 8).mean(axis=(2, 4))
    result: np.ndarray = (blocks * (_INK_MAX / 255.0)).reshape(n, 64)
    return result


@lru_cache(maxsize=1)
def fidelity_classifier() -> LogisticRegression:
    """Logistic regression on the ``generator`` split's real digits (8x8, round-tripped
    through 64x64 like generated images are), the judge of :func:`fidelity`."""
    from sklearn.linear_model import LogisticRegression

    images, labels = load_split("generator")
    clf = LogisticRegression(max_iter=2000, C=0.5)
    clf.fit(to_digits8(images), labels)
    return clf


def fidelity(images: np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """Share of ``images`` (uint8 [N, H, W, C]) that :func:`fidelity_classifier` labels as
    ``labels`` (the digit each was asked to show)."""
    labels = np.asarray(labels)
    if len(labels) != len(images) or len(labels) == 0:
        raise ValueError(f"{len(images)} images and {len(labels)} labels; need equal, non-zero")
    predicted = fidelity_classifier().predict(to_digits8(images))
    return float(np.mean(predicted == labels))


def subset(labels: np.ndarray, per_class: int, *, seed: int | None = None) -> np.ndarray:
    """Positions of ``per_class`` examples of each class in ``labels`` (sorted per class).

    With ``seed`` they are drawn at random (one generator, classes in order); without it the
    first ones. E.g. the 5-shot training set of benchmark seed ``s``::

        images, labels = load_split("fewshot")
        keep = subset(labels, 5, seed=s)
    """
    rng = np.random.default_rng(seed)
    chosen = []
    for label in range(10):
        members = np.flatnonzero(labels == label)
        if seed is not None:
            members = rng.permutation(members)
        chosen.append(np.sort(members[:per_class]))
    return np.concatenate(chosen)


def write_split_folders(
    root: Path | str, splits: Sequence[str] = tuple(SPLITS), *, per_class: int | None = None,
    seed: int | None = None,
) -> dict[str, Path]:
    """Write ``root/<split>/<label>/<index>.png`` (64x64 RGB) for each split; return the folders.

    ``per_class`` keeps only that many images per class (drawn with ``seed``; without a seed,
    the first ones), e.g. the 5-shot subset of ``fewshot``. The file name is the image's index
    in ``load_digits()``, so a subset can be traced back to the data set.
    """
    from PIL import Image

    root = Path(root)
    written: dict[str, Path] = {}
    for split in splits:
        images, labels = load_split(split)
        idx = split_indices(split)
        keep = (np.arange(len(labels)) if per_class is None
                else subset(labels, per_class, seed=seed))
        folder = root / split
        for label in LABELS:
            (folder / label).mkdir(parents=True, exist_ok=True)
        for i in keep:
            Image.fromarray(images[i]).save(folder / LABELS[labels[i]] / f"{idx[i]:04d}.png")
        written[split] = folder
        log.info("wrote %d images of split %r to %s", len(keep), split, folder)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.digits OUT [--split NAME ...]``: write the split folders."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m genaug.digits",
        description="Write scikit-learn's digits as OUT/<split>/<label>/<index>.png (64x64).",
    )
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--split", action="append", choices=list(SPLITS), default=None,
                        help="split(s) to write (default: all three)")
    parser.add_argument("--per-class", type=int, default=None,
                        help="keep this many images per class (a few-shot subset)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the per-class subset")
    args = parser.parse_args(argv)
    written = write_split_folders(args.out, args.split or tuple(SPLITS),
                                  per_class=args.per_class, seed=args.seed)
    for split, folder in written.items():
        count = sum(1 for _ in folder.glob("*/*.png"))
        sys.stdout.write(f"{split}: {count} images in {folder}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
