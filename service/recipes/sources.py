"""A label's real images, the one source hash of genaug, and their digest in a pool's identity.

A label with ``images: <folder>`` makes img2img variants of the real images in that folder
under ``GENAUG_DATA_ROOT`` (never outside it). :func:`load_label_sources` reads them at the
recipe's generation size; :func:`source_hash` is the ``source`` each variant remembers, the
same for an image placed in a recipe's folder and the same image uploaded to ``/v1/variants``
(stored pool ids depend on it: keep its algorithm, bytes then shape); :func:`sources_digest`
folds every label's images into the pool identity (:func:`~genaug.service.recipes.spec.pool_id`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .spec import Recipe

__all__ = [
    "IMAGE_SUFFIXES",
    "SourceImage",
    "encoder_config",
    "has_text_tower",
    "load_shots",
    "resolve_shots",
    "load_label_sources",
    "resolve_images_folder",
    "source_hash",
    "sources_digest",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


@dataclass(frozen=True)
class SourceImage:
    """One real image of a label: its file name, its pixels at the recipe's generation size
    (uint8 [height, width, 3]) and its hash (blake2b-16 of the pixels and shape, hex)."""

    name: str
    pixels: np.ndarray
    hash: str


def source_hash(pixels: np.ndarray) -> str:
    """blake2b-16 (hex) of an image's bytes and shape: the ``source`` a variant remembers."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(pixels).tobytes())
    h.update(repr(tuple(pixels.shape)).encode())
    return h.hexdigest()


def _folder_under_root(field: str, folder: str, data_root: Path | None, *, reads: str,
                       keep: str, create: str) -> tuple[Path, Path]:
    """``(root, root / folder)`` resolved, for the recipe field ``field``; raises
    ``ValueError`` when GENAUG_DATA_ROOT is unset, the folder resolves outside it (``..``,
    absolute paths, symlinks out) or is not a folder, each message with its fix."""
    if data_root is None:
        raise ValueError(
            f"{field}: {folder!r} needs GENAUG_DATA_ROOT, the folder {reads}; set it "
            "(e.g. GENAUG_DATA_ROOT=/data/real)"
        )
    root = Path(data_root).resolve()
    path = (root / folder).resolve()
    if Path(folder).is_absolute() or not path.is_relative_to(root):
        raise ValueError(f"{field}: {folder!r} resolves to {path}, outside GENAUG_DATA_ROOT "
                         f"{root}; {keep}")
    if not path.is_dir():
        raise ValueError(f"{field}: {folder!r}: {path} is not a folder under GENAUG_DATA_ROOT "
                         f"{root}; {create}")
    return root, path


def resolve_images_folder(folder: str, data_root: Path | None) -> Path:
    """``data_root / folder``, refusing anything that resolves outside ``data_root``
    (``..``, absolute paths, symlinks out). Raises ``ValueError`` saying what to fix."""
    root, path = _folder_under_root(
        "images", folder, data_root, reads="that label image folders are read from",
        keep="keep label folders inside it", create="create it or fix the name")
    files = _image_files(path, root)
    if not files:
        raise ValueError(f"images: {folder!r}: {path} holds no image "
                         f"({', '.join(IMAGE_SUFFIXES)}); add the label's real images")
    _check_images("images", folder, files)
    return path


def resolve_shots(folder: str, labels: list[str], data_root: Path | None) -> dict[str, list[Path]]:
    """A judge's shots: ``data_root / folder / <label> / *`` for every label, each with at
    least one image (the layout ``genaug adapt`` reads). Raises ``ValueError`` naming the
    folder or label and the fix."""
    root, path = _folder_under_root(
        "shots", folder, data_root, reads="the judge's shots are read from",
        keep="keep the shots inside it",
        create="create it with one subfolder of real images per label")
    out: dict[str, list[Path]] = {}
    for label in labels:
        sub = path / label
        files = _image_files(sub, root) if sub.is_dir() else []
        if not files:
            raise ValueError(
                f"shots: {folder!r} has no images for label {label!r}: {sub} is missing or "
                f"holds no image ({', '.join(IMAGE_SUFFIXES)}); every label needs a subfolder "
                "of its real images"
            )
        _check_images("shots", folder, files)
        out[label] = files
    return out


def _check_images(field: str, folder: str, files: list[Path]) -> None:
    """Refuse, naming the file, one of ``files`` that is not a whole image: a file named
    ``.png`` that holds text, one cut short. Each is decoded (its header alone passes a cut
    file): the start decodes them all again, and a refusal here is one line when the recipes
    load instead of a traceback when the judge or the planner reads them."""
    from PIL import Image

    for file in files:
        try:
            with Image.open(file) as img:
                img.load()
        except (OSError, SyntaxError, ValueError) as exc:  # what PIL raises for a bad file
            raise ValueError(
                f"{field}: {folder!r}: {file} is not an image ({_reason(exc)}); remove it, or "
                "replace it with a .png or .jpg of the label") from None


def _reason(exc: BaseException) -> str:
    """PIL's reason without the path it repeats (``cannot identify image file '/x/a.png'``)."""
    text = str(exc)
    if text.startswith("cannot identify image file"):
        return "cannot identify image file: no image format knows it"
    return text or type(exc).__name__


def load_shots(files: list[Path], size: tuple[int, int], channels: int) -> np.ndarray:
    """Shot images as uint8 ``[n, height, width, channels]`` (resized like the pool's images:
    the recipe's output size and channels), in file order."""
    from PIL import Image

    height, width = size
    out = []
    for file in files:
        try:
            with Image.open(file) as img:
                conv = img.convert("L" if channels == 1 else "RGB")
                if conv.size != (width, height):
                    conv = conv.resize((width, height), Image.Resampling.BICUBIC)
                pixels = np.asarray(conv, dtype=np.uint8)
        except OSError as exc:
            raise ValueError(f"shots: {file} is not a readable image ({exc}); remove or "
                             "replace it") from None
        out.append(pixels.reshape(height, width, channels))
    return np.stack(out)


def encoder_config(encoder: str) -> dict[str, object]:
    """The ``config.json`` of a judge's encoder folder (a path, absolute or relative to the
    working directory). Raises ``ValueError`` naming the folder and the fix."""
    import json

    path = Path(encoder).expanduser()
    config = path / "config.json"
    if not path.is_dir() or not config.is_file():
        raise ValueError(
            f"encoder: {encoder!r} is neither 'tiny-digits-encoder' nor a local transformers "
            f"model folder ({config} not found); give the folder a CLIP model or a vision "
            "model was saved to (save_pretrained), or use 'tiny-digits-encoder'"
        )
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"encoder: {encoder!r}: {config} is not readable JSON ({exc}); "
                         "save the model again with save_pretrained") from None
    if not isinstance(data, dict):
        raise ValueError(f"encoder: {encoder!r}: {config} is not a JSON object; save the "
                         "model again with save_pretrained")
    return data


def has_text_tower(config: dict[str, object]) -> bool:
    """Whether an encoder's config describes a model with a text tower (CLIP-like)."""
    return "text_config" in config


def _image_files(path: Path, root: Path) -> list[Path]:
    return sorted(
        f for f in path.iterdir()
        if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file() and f.resolve().is_relative_to(root)
    )


def load_label_sources(recipe: Recipe, label: str, data_root: Path | None) -> list[SourceImage]:
    """The label's real images, RGB at the recipe's generation size, sorted by file name;
    [] for a text-to-image label. Raises ``ValueError`` for a folder that cannot be used."""
    from PIL import Image

    folder = recipe.labels[label].images
    if folder is None:
        return []
    path = resolve_images_folder(folder, data_root)
    out = []
    for file in _image_files(path, Path(data_root or ".").resolve()):
        try:
            with Image.open(file) as img:
                rgb = img.convert("RGB")
                if rgb.size != (recipe.width, recipe.height):
                    rgb = rgb.resize((recipe.width, recipe.height), Image.Resampling.LANCZOS)
                pixels = np.asarray(rgb, dtype=np.uint8).copy()
        except OSError as exc:
            raise ValueError(f"images: {folder!r}: {file.name} is not a readable image "
                             f"({exc}); remove or replace it") from None
        out.append(SourceImage(file.name, pixels, source_hash(pixels)))
    return out


def sources_digest(sources: Mapping[str, list[SourceImage]]) -> str | None:
    """One hash over every label's source images (None when there are none): part of the
    pool identity, so editing a label's folder starts a new pool."""
    if not any(sources.values()):
        return None
    h = hashlib.sha256()
    for label in sorted(sources):
        for image in sources[label]:
            h.update(f"{label}\x00{image.name}\x00{image.hash}\n".encode())
    return h.hexdigest()
