"""Image-folder datasets for the reference trainer: checks with clear errors, and a demo set.

Two halves, neither imports TensorFlow:

* :func:`scan_image_folder` checks a ``DIR/<class>/<image>.png`` tree *before* anything is
  built and raises :class:`DatasetError` saying what it found, where, and what layout it
  expected (a missing folder, no images at all, a class folder with none, fewer images than
  one global batch). ``image_dataset_from_directory`` would otherwise print "Found 0 files"
  and fail somewhere later, or train on nothing (``../shared/seeds``: "loaded 0 items").
* :func:`make_demo_dataset` writes a small deterministic "real-looking" dataset there is no
  download for: three wound-healing phases ``I``/``P``/``R`` drawn procedurally as false-colour
  depth maps (a deep irregular crater with a raised rim; a shallower cavity with granular
  tissue; a nearly level scar), written as PNG files so the trainer exercises the same
  directory-loading path as with real data.

Example::

    root = make_demo_dataset(Path("/tmp/wounds"), per_class=96)
    scan = scan_image_folder(root, global_batch=32)
    scan.class_names, scan.counts        # ['I', 'P', 'R'], {'I': 96, 'P': 96, 'R': 96}
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DEMO_CLASSES",
    "IMAGE_EXTENSIONS",
    "DatasetError",
    "FolderScan",
    "make_demo_dataset",
    "scan_image_folder",
]

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""What ``tf.keras.utils.image_dataset_from_directory`` loads (case-insensitive)."""

DEMO_CLASSES = ("I", "P", "R")
"""Demo classes, named like the labels of ``recipes/wound_phases.yaml``."""

LAYOUT = "DIR/<class>/<image>.png (one sub-folder per class; .png, .jpg, .jpeg, .bmp or .gif)"


class DatasetError(ValueError):
    """The training data cannot be used; the message says what was found and what to fix."""


@dataclass(frozen=True)
class FolderScan:
    """What :func:`scan_image_folder` found.

    Attributes:
        root: the folder scanned (resolved).
        class_names: class sub-folders in sorted order (the label index is the position).
        counts: images per class.
    """

    root: Path
    class_names: tuple[str, ...]
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """Images in all classes."""
        return sum(self.counts.values())

    def describe(self) -> str:
        """``I: 96, P: 96, R: 96`` (the counts per class)."""
        return ", ".join(f"{name}: {self.counts[name]}" for name in self.class_names)


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def scan_image_folder(root: Path | str, *, global_batch: int = 1) -> FolderScan:
    """Check ``root`` holds ``<class>/<image>`` files enough for one global batch.

    Hidden entries (``.name``) are ignored, as Keras ignores them.

    Raises:
        DatasetError: ``root`` is missing or not a folder; it holds no class sub-folders or no
            images at all (images lying directly in ``root`` are reported); a class folder
            holds no images; the total is below ``global_batch`` (``drop_remainder`` would
            leave no step to run).
    """
    root = Path(root).expanduser()
    if not root.exists():
        parent = root.parent
        hint = ""
        if parent.is_dir():
            entries = sorted(p.name for p in parent.iterdir())
            hint = f"; {parent} exists and holds: {', '.join(entries[:10]) or 'nothing'}"
            hint += f" (+{len(entries) - 10} more)" if len(entries) > 10 else ""

        raise DatasetError(
            f"training data folder {root} does not exist{hint}. Expected the layout {LAYOUT}."
        )
    if not root.is_dir():
        raise DatasetError(f"training data path {root} is a file, not a folder. Expected {LAYOUT}.")
    root = root.resolve()
    class_dirs = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.name,
    )
    loose = sorted(p.name for p in root.iterdir() if _is_image(p))
    counts = {
        d.name: sum(1 for p in d.iterdir() if _is_image(p) and not p.name.startswith("."))
        for d in class_dirs
    }
    total = sum(counts.values())
    if total == 0:
        if loose:
            found = (
                f"{len(loose)} image(s) directly in the folder (e.g. {loose[0]}) but no class "
                "sub-folders holding images"
            )
        elif class_dirs:
            found = (
                f"{len(class_dirs)} sub-folder(s) ({', '.join(d.name for d in class_dirs[:10])}) "
                "with 0 images in them"
            )
        else:
            found = "an empty folder"
        raise DatasetError(
            f"found 0 images in {root}: {found}. Expected the layout {LAYOUT}, "
            "e.g. DIR/cat/001.png, DIR/dog/002.png."
        )
    empty = [name for name, n in counts.items() if n == 0]
    if empty:
        others = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise DatasetError(
            f"class folder(s) {', '.join(repr(e) for e in empty)} in {root} hold 0 images "
            f"(images per class: {others}). Every class needs at least one image in the layout "
            f"{LAYOUT}; remove the empty folder(s) or add images."
        )
    if len(class_dirs) < 2:
        log.warning("only one class (%s) in %s: the classifier has nothing to tell apart",
                       class_dirs[0].name, root)
    scan = FolderScan(root, tuple(d.name for d in class_dirs), counts)
    if total < global_batch:
        raise DatasetError(
            f"{root} holds {total} images ({scan.describe()}), fewer than one global batch of "
            f"{global_batch}: with drop_remainder=True (fixed shapes, no retracing) there would "
            "be no step to run. Add images or lower --batch-size (the global batch is split "
            "across the replicas)."
        )
    return scan


# ------------------------------------------------------------------------------- demo data


def _png_bytes(image: np.ndarray) -> bytes:
    """Encode an RGB uint8 ``[H, W, 3]`` image as PNG (no imaging library needed)."""
    h, w, _ = image.shape
    raw = b"".join(b"\x00" + image[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _false_colour(depth: np.ndarray) -> np.ndarray:
    """Depth in [0, 1] (1 = high) to an RGB false-colour image (blue low, red high)."""
    d = np.clip(depth, 0.0, 1.0)
    r = np.clip(1.5 * d - 0.25, 0, 1)
    g = np.clip(1.0 - 2.0 * np.abs(d - 0.55), 0, 1)
    b = np.clip(1.0 - 1.6 * d, 0, 1)
    return (np.stack([r, g, b], axis=-1) * 255.0 + 0.5).astype(np.uint8)


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Low-frequency noise in about [-1, 1]: a coarse random grid, bilinearly upsampled."""
    grid = rng.uniform(-1, 1, (cells + 1, cells + 1))
    t = np.linspace(0, cells, size, endpoint=False)
    i = t.astype(int)
    f = t - i
    top = grid[i][:, i] * (1 - f)[None, :] + grid[i][:, i + 1] * f[None, :]
    bottom = grid[i + 1][:, i] * (1 - f)[None, :] + grid[i + 1][:, i + 1] * f[None, :]
    out: np.ndarray = top * (1 - f)[:, None] + bottom * f[:, None]
    return out


def demo_image(label: str, rng: np.random.Generator, size: int = 64) -> np.ndarray:
    """One procedurally drawn wound of phase ``label`` (``I``, ``P`` or ``R``), uint8 RGB."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    cy, cx = rng.uniform(0.35, 0.65, 2)
    angle = np.arctan2(yy - cy, xx - cx)
    r = np.hypot(yy - cy, xx - cx)
    # skin: a gently tilted plane with soft bumps
    depth = 0.62 + 0.08 * (xx - 0.5) * rng.uniform(-1, 1) + 0.04 * _smooth_noise(rng, size, 4)
    if label == "I":
        # deep, irregular crater with a swollen raised rim
        radius = rng.uniform(0.18, 0.26) * (1 + 0.25 * np.sin(3 * angle + rng.uniform(0, 6.3)))
        depth -= 0.55 * np.exp(-((r / radius) ** 2) * 1.5)
        depth += 0.25 * np.exp(-(((r - radius) / 0.05) ** 2))
    elif label == "P":
        # shallower cavity, wound floor covered in granulation bumps
        radius = rng.uniform(0.16, 0.22)
        inside = np.exp(-((r / radius) ** 4))
        depth -= 0.28 * inside
        bumps = _smooth_noise(rng, size, 16)
        depth += 0.12 * bumps * inside
    elif label == "R":
        # almost level: a thin, slightly depressed, smooth elongated scar
        theta = rng.uniform(0, np.pi)
        along = (xx - cx) * np.cos(theta) + (yy - cy) * np.sin(theta)
        across = -(xx - cx) * np.sin(theta) + (yy - cy) * np.cos(theta)
        length = rng.uniform(0.2, 0.3)
        depth -= 0.1 * np.exp(-((across / 0.03) ** 2)) * np.exp(-((along / length) ** 6))
    else:
        raise ValueError(f"unknown demo class {label!r}; expected one of {DEMO_CLASSES}")
    depth += rng.normal(0, 0.015, depth.shape)  # sensor noise
    return _false_colour(depth)


def make_demo_dataset(
    root: Path | str, *, per_class: int = 96, size: int = 64, seed: int = 0
) -> Path:
    """Write ``per_class`` PNG images for each of :data:`DEMO_CLASSES` under ``root``.

    Deterministic for a given ``(per_class, size, seed)``; existing files are overwritten.
    Returns ``root``. About 0.1 s per 100 images at 64x64.
    """
    root = Path(root)
    if per_class < 1 or size < 8:
        raise ValueError(f"per_class={per_class} must be >= 1 and size={size} >= 8")
    for c, label in enumerate(DEMO_CLASSES):
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, c])
        for i in range(per_class):
            (folder / f"{label}_{i:04d}.png").write_bytes(_png_bytes(demo_image(label, rng, size)))
    log.info("wrote %d demo images (%s, %dx%d) to %s", per_class * len(DEMO_CLASSES),
                "/".join(DEMO_CLASSES), size, size, root)
    return root
