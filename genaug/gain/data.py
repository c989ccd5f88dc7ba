"""The user's folder of labelled images, read once into memory at the classifier's size.

``DATA/<label>/*`` (PNG, JPEG, any size or mode; one folder per label, its name the label's
name) becomes :class:`Images`: uint8 ``[N, size, size, C]`` with ``C`` 1 when every image is
greyscale (mode ``L``, or RGB with three equal channels) and 3 otherwise, int64 labels that
index the sorted folder names, and each image's path relative to ``DATA``. A file that is not
an image (or cannot be decoded) is skipped and counted (:attr:`Images.skipped`); a missing or
empty folder, or no image at all, is a :class:`GainInputError` (one line). Every image is
resized whole, as the classifier sees it (bilinear, its aspect kept by padding with its own
border colour: digits stay digits, photos stay photos).

Example::

    data = read_folder("DATA", size=32)
    data.pixels.shape, data.names, data.count("7"), data.skipped
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_SUFFIXES", "GainInputError", "Images", "default_size", "fit_image",
           "read_folder", "read_images"]

#: The files read as images (case-insensitive); others are skipped and counted.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class GainInputError(ValueError):
    """A mistake in what ``genaug gain`` was given: one line that names it and the fix."""


@dataclass(frozen=True)
class Images:
    """Labelled images in memory (module doc). ``pixels`` uint8 ``[N, H, W, C]``, ``labels``
    int64 ``[N]`` indexing ``names``, ``files`` each image's path (relative to its folder),
    ``skipped`` the files that could not be read (relative paths)."""

    pixels: np.ndarray
    labels: np.ndarray
    names: tuple[str, ...]
    files: tuple[str, ...]
    skipped: tuple[str, ...] = field(default=())

    def count(self, name: str) -> int:
        """Images of label ``name``."""
        return int((self.labels == self.names.index(name)).sum())

    def of(self, name: str) -> np.ndarray:
        """The indices of label ``name``'s images, in file order."""
        return np.flatnonzero(self.labels == self.names.index(name))


def _label_folders(root: Path) -> list[Path]:
    if not root.is_dir():
        raise GainInputError(f"{root} is not a folder; give a folder with one sub-folder of "
                             "images per label: DATA/<label>/*.png")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise GainInputError(f"{root} holds no label folder; put each label's images in a "
                             "sub-folder named after the label: DATA/<label>/*.png")
    return folders


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _open(path: Path) -> np.ndarray | None:
    """The image as uint8 ``[H, W, 3]`` RGB (alpha over black), or None when it is none."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            rgb = image.convert("RGBA")
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    pixels = np.asarray(rgb, dtype=np.float32)
    alpha = pixels[..., 3:4] / 255.0
    return np.clip(pixels[..., :3] * alpha + 0.5, 0, 255).astype(np.uint8)


def fit_image(pixels: np.ndarray, size: int) -> np.ndarray:
    """``pixels`` (uint8 ``[H, W, 3]``) as a ``size`` x ``size`` square: padded to a square
    with its own border's median colour, then resized (bilinear, antialiased)."""
    from PIL import Image

    h, w = pixels.shape[:2]
    if h != w:
        border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
        fill = np.median(border, axis=0).astype(np.uint8)
        side = max(h, w)
        square = np.empty((side, side, 3), np.uint8)
        square[:] = fill
        top, left = (side - h) // 2, (side - w) // 2
        square[top:top + h, left:left + w] = pixels
        pixels = square
    if pixels.shape[0] == size:
        return pixels
    return np.asarray(Image.fromarray(pixels).resize((size, size), Image.Resampling.BILINEAR))


def _greyscale(images: Iterable[np.ndarray]) -> bool:
    return all(np.array_equal(i[..., 0], i[..., 1]) and np.array_equal(i[..., 0], i[..., 2])
               for i in images)


def default_size(sides: Sequence[int]) -> int:
    """The classifier's input side when none is given: the images' median side, within
    16 to 32 (a small CNN learns the classes at 32; larger only costs time)."""
    return int(min(32, max(16, float(np.median(sides)) if sides else 32)))


def read_images(paths: Sequence[Path]) -> tuple[list[np.ndarray], list[int]]:
    """The images of ``paths`` that decode (RGB), and the positions of those that do not."""
    read: list[np.ndarray] = []
    bad: list[int] = []
    for i, path in enumerate(paths):
        image = _open(path)
        if image is None:
            bad.append(i)
        else:
            read.append(image)
    return read, bad


def read_folder(root: str | Path, *, size: int | None = None, channels: int | None = None,
                names: Sequence[str] | None = None, what: str = "DATA") -> Images:
    """``root/<label>/*`` as :class:`Images` at ``size`` (None: :func:`default_size`) with
    ``channels`` (None: 1 when every image is greyscale, else 3). ``names``: read only these
    labels, in this order (a label folder ``root`` lacks is a :class:`GainInputError`
    naming it); ``what`` names the folder in errors (``DATA``, ``--extra NAME``)."""
    root = Path(root)
    folders = {p.name: p for p in _label_folders(root)}
    if names is not None:
        lacking = [n for n in names if n not in folders]
        if lacking:
            raise GainInputError(
                f"{what} ({root}) has no folder for label(s) {', '.join(lacking)}; it holds "
                f"{', '.join(sorted(folders))}. Give one folder per label, named as in DATA")
        folders = {n: folders[n] for n in names}
    order = tuple(folders)
    images: list[np.ndarray] = []
    labels: list[int] = []
    files: list[str] = []
    skipped: list[str] = []
    for index, name in enumerate(order):
        paths = _files(folders[name])
        read, bad = read_images(paths)
        skipped += [str(paths[i].relative_to(root)) for i in bad]
        good = [p for i, p in enumerate(paths) if i not in set(bad)]
        if not read:
            raise GainInputError(
                f"{what} label {name!r} ({folders[name]}) holds no image that can be read "
                f"({len(paths)} file(s)); put its PNG or JPEG images there")
        images += read
        labels += [index] * len(read)
        files += [str(p.relative_to(root)) for p in good]
    side = size if size is not None else default_size([min(i.shape[:2]) for i in images])
    grey = channels == 1 if channels is not None else _greyscale(images)
    fitted = np.stack([fit_image(i, side) for i in images])
    pixels = fitted[..., :1] if grey else fitted
    return Images(pixels, np.asarray(labels, np.int64), order, tuple(files), tuple(skipped))
