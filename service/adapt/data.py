"""``genaug adapt``'s data reader: ``DATA/<label>/*`` as training examples and as the judge's shots.

One folder of images per label of the recipe (png, jpg, any size), read twice over:
:func:`read_labelled_folder` resizes each to the recipe's generation size and pairs it with its
label's prompts for :func:`genaug.service.adapt.train.adapt` (with a hash naming the data,
recorded in the LoRA's header); :func:`read_shots` reads the same files as the pool stores
images (the recipe's output size and channels) for the final check's judge. A missing label
folder or an unreadable file is an :class:`AdaptInputError` whose message says what to change.

Example::

    images, prompts, data_hash = read_labelled_folder(Path("DATA"), {"7": ["a seven"]},
                                                      (64, 64))
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..recipes.spec import Recipe

__all__ = ["AdaptInputError", "read_labelled_folder", "read_shots"]

_SUFFIXES = {".png", ".jpg", ".jpeg"}


class AdaptInputError(ValueError):
    """The data, recipe or arguments cannot be used; the message says what to change."""


def read_labelled_folder(
    data: Path, labels: dict[str, list[str]], size: tuple[int, int]
) -> tuple[np.ndarray, list[list[str]], str]:
    """``data/<label>/*`` -> uint8 ``[N, height, width, 3]``, each image's prompts, and a data
    hash (16 hex chars over labels, prompts, generation size and file contents)."""
    from PIL import Image, UnidentifiedImageError

    if not data.is_dir():
        raise AdaptInputError(f"DATA {str(data)!r} is not a folder; give a folder with one "
                              "sub-folder of images per label")
    height, width = size
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(f"{height}x{width}".encode())
    images: list[np.ndarray] = []
    prompts: list[list[str]] = []
    for label, label_prompts in labels.items():
        folder = data / label
        files = sorted(p for p in folder.glob("*") if p.suffix.lower() in _SUFFIXES) \
            if folder.is_dir() else []
        if not files:
            raise AdaptInputError(
                f"no images for label {label!r}: {str(folder)!r} is missing or holds no "
                f".png/.jpg; every label of the recipe needs a folder DATA/{label}/"
            )
        hasher.update(b"\0label\0" + label.encode() + b"\0" + "\0".join(label_prompts).encode())
        for path in files:
            raw = path.read_bytes()
            hasher.update(hashlib.blake2b(raw, digest_size=16).digest())
            try:
                with Image.open(path) as img:
                    rgb = img.convert("RGB").resize((width, height),
                                                    Image.Resampling.BICUBIC)
            except (UnidentifiedImageError, OSError) as exc:
                raise AdaptInputError(f"{str(path)!r} is not a readable image: {exc}") from exc
            images.append(np.asarray(rgb, dtype=np.uint8))
            prompts.append(list(label_prompts))
    return np.stack(images), prompts, hasher.hexdigest()


def read_shots(data: Path, recipe: Recipe) -> dict[str, np.ndarray]:
    """``data/<label>/*`` as the pool stores images (the recipe's output size and channels),
    every label of the recipe (``genaug adapt`` has already checked each has images)."""
    from ..recipes.sources import load_shots

    shots = {}
    for label in recipe.label_names:
        files = sorted(p for p in (data / label).glob("*") if p.suffix.lower() in _SUFFIXES)
        shots[label] = load_shots(files, recipe.output_size, recipe.output_channels)
    return shots
