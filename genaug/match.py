"""Bring generated images to the user's domain: framed, sized and lit as the real shots are.

A generator draws its own idea of a class: the embedded digits model draws scikit-learn's
blurry 8x8 digits filling their square, while MNIST frames a thin digit of 20x20 pixels in
28x28, centred on its centre of mass. Mixed in as they are, such images teach the classifier
the generator's domain, and at more than one shot per class they cost more than they give.
:class:`DomainMatch` learns the real shots' framing and light and applies them to generated
images, before they are mixed:

- **Framing**, where the shots are objects on a plain background (their borders are one flat
  colour: digits, glyphs, isolated objects, scans): each generated image is cropped to what
  differs from its own border, scaled so that its longer side is the shots' median (relative to
  the image), and placed so that its centre of mass sits where the shots' does, on the shots'
  background colour.
- **Light**, always: each channel is mapped so that its mean and spread match the shots' (on
  the content, for framed images).

Shots with busy backgrounds (photos) keep their framing: only the light is matched. Nothing is
learned from labels, and a class never borrows another's images.

**Agreement**, before anything is mixed: :func:`agreement` asks whether a pool's labels say
which real shots its images resemble. For each class, the share of its (matched) images
nearest to that class's shots, minus the share of the other classes' images nearest to it,
averaged over the classes: 0 when the labels say nothing (a generator that cannot draw the
classes and draws something else under every label), about 0.3-0.4 for a pool of the right
classes from another domain, 0.6-0.9 for more real images. Below :data:`AGREEMENT_FLOOR` a pool
is not mixed: ``genaug gain`` trains that cell on the real shots alone and says so (docs/gain.md
has the figures that chose the floor).

Example::

    match = DomainMatch.fit(real_shots)             # uint8 [N, H, W, C]
    matched = match(generated)                      # uint8 [M, H, W, C], the shots' size
    match.describe()                                # {"framing": True, "box": 0.71, ...}
    agreement(real_shots, shot_labels, matched, labels) >= AGREEMENT_FLOOR   # mix it?
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from genaug.mixing import AGREEMENT_FLOOR

__all__ = ["AGREEMENT_FLOOR", "DomainMatch", "agreement"]

#: The side of the small view :func:`agreement` compares images in.
_VIEW = 16

#: A border is plain when its pixels differ from their median by less than this (0-255) on
#: average; shots are objects on a plain background when this many of them have one.
_PLAIN_BORDER = 12.0
_PLAIN_SHARE = 0.8
#: A pixel is content when it differs from the background by more than this share of the
#: image's largest difference.
_CONTENT = 0.2


def _grey(images: np.ndarray) -> np.ndarray:
    grey: np.ndarray = images.astype(np.float32).mean(axis=-1)
    return grey


def _border(image: np.ndarray) -> np.ndarray:
    """The outer ring of pixels, ``[n, C]`` float32."""
    return np.concatenate([image[0], image[-1], image[1:-1, 0], image[1:-1, -1]]).astype(
        np.float32)


def _background(image: np.ndarray) -> tuple[np.ndarray, float]:
    """The border's median colour and its mean absolute deviation from it."""
    ring = _border(image)
    colour = np.median(ring, axis=0)
    return colour, float(np.abs(ring - colour).mean())


def _content_mask(image: np.ndarray, colour: np.ndarray) -> np.ndarray:
    distance = np.abs(image.astype(np.float32) - colour).max(axis=-1)
    top = float(distance.max())
    return distance > _CONTENT * top if top > 0 else np.zeros(distance.shape, bool)


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image

    channels = [np.asarray(Image.fromarray(image[..., c].astype(np.float32)).resize(
        (width, height), Image.Resampling.BILINEAR)) for c in range(image.shape[-1])]
    return np.stack(channels, axis=-1)


@dataclass(frozen=True)
class DomainMatch:
    """The real shots' framing and light (module doc); call it on generated images.

    ``size`` and ``channels``: the shots' image size and channels (what the matched images
    have). ``framing``: whether the shots are objects on a plain background. ``box``: the
    shots' median content side over the image side; ``centre``: their median centre of mass
    (row, column) over the image side; ``background``: their median border colour;
    ``mean`` / ``std``: per channel, of their content (framed) or of whole images."""

    size: tuple[int, int]
    channels: int
    framing: bool
    box: float
    centre: tuple[float, float]
    background: tuple[float, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def fit(cls, shots: np.ndarray) -> DomainMatch:
        """Learn the framing and light of ``shots`` (uint8 ``[N, H, W, C]``, ``C`` 1 or 3)."""
        shots = np.asarray(shots)
        if (shots.dtype != np.uint8 or shots.ndim != 4 or shots.shape[-1] not in (1, 3)
                or len(shots) == 0):
            raise ValueError(f"shots must be uint8 [N, H, W, 1 or 3] with N >= 1, got "
                             f"{shots.dtype} {list(shots.shape)}")
        height, width, channels = shots.shape[1:]
        backgrounds = [_background(s) for s in shots]
        plain = np.mean([spread < _PLAIN_BORDER for _, spread in backgrounds]) >= _PLAIN_SHARE
        colour = np.median(np.stack([c for c, _ in backgrounds]), axis=0)
        boxes, centres, content = [], [], []
        for shot in shots:
            mask = _content_mask(shot, colour) if plain else np.ones(shot.shape[:2], bool)
            if not mask.any():
                continue
            rows, cols = np.nonzero(mask)
            boxes.append(max(rows.max() - rows.min() + 1, cols.max() - cols.min() + 1)
                         / max(height, width))
            weight = np.abs(shot.astype(np.float32) - colour).max(axis=-1) * mask
            total = float(weight.sum())
            if total > 0:
                grid_r, grid_c = np.indices(mask.shape)
                centres.append((float((weight * grid_r).sum() / total) / height,
                                float((weight * grid_c).sum() / total) / width))
            content.append(shot[mask].astype(np.float32))
        pixels = np.concatenate(content) if content else shots.reshape(-1, channels).astype(
            np.float32)
        centre = tuple(np.median(np.asarray(centres), axis=0)) if centres else (0.5, 0.5)
        return cls(size=(height, width), channels=channels, framing=bool(plain),
                   box=float(np.median(boxes)) if boxes else 1.0,
                   centre=(float(centre[0]), float(centre[1])),
                   background=tuple(float(c) for c in colour),
                   mean=tuple(float(m) for m in pixels.mean(axis=0)),
                   std=tuple(float(s) for s in pixels.std(axis=0)))

    def describe(self) -> dict[str, Any]:
        """What was learned, rounded, for reports."""
        return {"size": list(self.size), "channels": self.channels, "framing": self.framing,
                "box": round(self.box, 3), "centre": [round(c, 3) for c in self.centre],
                "background": [round(c, 1) for c in self.background],
                "mean": [round(m, 1) for m in self.mean], "std": [round(s, 1) for s in self.std]}

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """``images`` (uint8 ``[M, h, w, 1 or 3]``, any size) at the shots' size, channels,
        framing and light."""
        images = np.asarray(images)
        if images.ndim == 3:
            images = images[None]
        out = np.empty((len(images), *self.size, self.channels), np.uint8)
        for i, image in enumerate(images):
            out[i] = self._one(image)
        return out

    def _channels(self, image: np.ndarray) -> np.ndarray:
        if image.shape[-1] == self.channels:
            return image.astype(np.float32)
        if self.channels == 1:
            return _grey(image)[..., None]
        return np.repeat(image.astype(np.float32), 3, axis=-1)

    def _one(self, image: np.ndarray) -> np.ndarray:
        image = self._channels(image)
        height, width = self.size
        if not self.framing:
            whole = _resize(image, height, width)
            return self._light(whole, np.ones((height, width), bool))
        colour, _ = _background(image)
        mask = _content_mask(image, colour)
        if not mask.any():
            canvas = np.empty((height, width, self.channels), np.float32)
            canvas[:] = np.asarray(self.background, np.float32)
            empty: np.ndarray = np.clip(canvas + 0.5, 0, 255).astype(np.uint8)
            return empty
        rows, cols = np.nonzero(mask)
        top, bottom, left, right = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        crop = image[top:bottom, left:right]
        # Content as the distance from the generated image's own background, laid on the
        # shots' background: ink keeps its strength, the background becomes theirs.
        ink = np.abs(crop - colour)
        scale = self.box * max(height, width) / max(crop.shape[:2])
        new_h = max(1, min(height, round(crop.shape[0] * scale)))
        new_w = max(1, min(width, round(crop.shape[1] * scale)))
        ink = _resize(ink, new_h, new_w)
        placed = np.zeros((height, width, self.channels), np.float32)
        weight = ink.max(axis=-1)
        total = float(weight.sum())
        if total > 0:
            grid_r, grid_c = np.indices(weight.shape)
            mass_r = float((weight * grid_r).sum() / total)
            mass_c = float((weight * grid_c).sum() / total)
        else:
            mass_r, mass_c = new_h / 2, new_w / 2
        off_r = int(round(self.centre[0] * height - mass_r))
        off_c = int(round(self.centre[1] * width - mass_c))
        off_r = min(max(off_r, 0), height - new_h)
        off_c = min(max(off_c, 0), width - new_w)
        placed[off_r:off_r + new_h, off_c:off_c + new_w] = ink
        background = np.asarray(self.background, np.float32)
        # The shots' ink runs from their background toward their content's mean: dark ink on
        # light paper or light ink on black alike.
        direction = np.sign(np.asarray(self.mean, np.float32) - background)
        direction[direction == 0] = 1.0
        framed = background + direction * placed
        mask_out = placed.max(axis=-1) > _CONTENT * max(float(placed.max()), 1e-6)
        return self._light(framed, mask_out)

    def _light(self, image: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Map each channel's mean and spread on ``mask`` to the shots'."""
        out = image.copy()
        if mask.any():
            for c in range(self.channels):
                values = image[..., c][mask]
                spread = float(values.std())
                gain = self.std[c] / spread if spread > 1e-3 else 1.0
                out[..., c] = np.where(mask, (image[..., c] - values.mean()) * gain + self.mean[c],
                                       image[..., c])
        return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def _view(images: np.ndarray) -> np.ndarray:
    """Grey, ``_VIEW`` pixels square, zero mean and unit norm: ``[N, _VIEW * _VIEW]``."""
    from PIL import Image

    grey = _grey(np.asarray(images))
    views = np.stack([np.asarray(Image.fromarray(g).resize(
        (_VIEW, _VIEW), Image.Resampling.BILINEAR)) for g in grey]).reshape(
        len(grey), -1).astype(np.float32)
    views -= views.mean(axis=1, keepdims=True)
    unit: np.ndarray = views / (np.linalg.norm(views, axis=1, keepdims=True) + 1e-6)
    return unit


def agreement(shots: np.ndarray, shot_labels: np.ndarray, images: np.ndarray,
              labels: np.ndarray) -> float:
    """How much ``labels`` say which of ``shots``' classes each image resembles (module doc).

    ``shots`` uint8 ``[N, H, W, C]`` with int ``shot_labels`` ``[N]``; ``images`` uint8
    ``[M, h, w, C]`` (matched to the shots, or any size: they are compared in a small grey
    view) with ``labels`` ``[M]`` in the same label space. Each image is given the class whose
    shots' mean view is nearest (cosine); for each class with images and shots, the share of
    its images given it, less the share of the other classes' images given it; the mean over
    those classes, in [-1, 1]. ``nan`` with fewer than two such classes."""
    shot_labels, labels = np.asarray(shot_labels), np.asarray(labels)
    classes = [c for c in np.unique(shot_labels) if np.any(labels == c)]
    if len(classes) < 2 or len(images) == 0:
        return float("nan")
    shot_views, views = _view(shots), _view(images)
    centroids = np.stack([shot_views[shot_labels == c].mean(axis=0) for c in classes])
    nearest = np.asarray(classes)[(views @ centroids.T).argmax(axis=1)]
    known = np.isin(labels, classes)
    lifts = [float(np.mean(nearest[labels == c] == c))
             - float(np.mean(nearest[known & (labels != c)] == c)) for c in classes]
    return float(np.mean(lifts))
