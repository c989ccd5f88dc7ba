"""A class-indexed reservoir of synthetic images in host memory, for a PyTorch input pipeline.

:class:`HostReservoir` is what the TensorFlow side's
:class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` is, without TensorFlow: a uint8
array ``images[C, M, H, W, K]`` with ``fill[C]``, written by a
:class:`~genaug.feeding.feeder.Feeder`'s thread (it is a ``ReservoirLike``)
and read by the dataset's iterator in the same process. Each class is a ring of ``M`` slots:
once full, new images replace its oldest ones. A draw copies one image under the lock, so a
reader never sees a slot half-written, and never an image of another class.

Memory is ``C * M * H * W * K`` bytes; :func:`slots_for` sizes ``M`` from a byte budget.

Example::

    reservoir = HostReservoir(num_classes=3, slots_per_class=64, image_shape=(64, 64, 3))
    reservoir.write(2, images)              # uint8 [n, 64, 64, 3], from any thread
    image = reservoir.draw(2, rng)          # uint8 [64, 64, 3] of class 2, or None while empty
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HostReservoir", "slots_for"]

#: Most slots a class gets, whatever the budget: beyond it a bigger budget buys no freshness.
MAX_SLOTS = 4096


def slots_for(budget_bytes: int, *, num_classes: int, image_shape: tuple[int, int, int],
              shares: int = 1) -> int:
    """Slots per class that fit ``budget_bytes`` split over ``shares`` reservoirs (a
    trainer's DataLoader workers): at least 1, at most :data:`MAX_SLOTS`."""
    h, w, k = image_shape
    per_slot = max(1, num_classes * h * w * k)
    return int(min(MAX_SLOTS, max(1, budget_bytes // max(1, shares) // per_slot)))


class HostReservoir:
    """Fixed-shape, class-indexed uint8 images in this process's memory; thread-safe.

    Args:
        num_classes: ``C``; labels are ints in ``[0, C)``.
        slots_per_class: ``M``, images kept per class.
        image_shape: ``(H, W, K)``, ``K`` 3 (RGB) or 1 (one channel).
    """

    def __init__(self, num_classes: int, slots_per_class: int,
                 image_shape: tuple[int, int, int]) -> None:
        if num_classes < 1 or slots_per_class < 1:
            raise ValueError(f"num_classes={num_classes} and slots_per_class="
                             f"{slots_per_class} must both be >= 1")
        shape = tuple(int(d) for d in image_shape)
        if len(shape) != 3 or shape[2] not in (1, 3) or min(shape) < 1:
            raise ValueError(f"image_shape {image_shape!r} must be (H, W, 3) or (H, W, 1)")
        self.num_classes = int(num_classes)
        self.slots_per_class = int(slots_per_class)
        self.image_shape: tuple[int, int, int] = (shape[0], shape[1], shape[2])
        self.images = np.zeros([self.num_classes, self.slots_per_class, *self.image_shape],
                               np.uint8)
        self._fill = np.zeros([self.num_classes], np.int32)
        self._cursor = np.zeros([self.num_classes], np.int64)
        self._lock = threading.Lock()
        #: Images written since construction (every class): what fresh images arrived.
        self.written = 0

    @property
    def nbytes(self) -> int:
        """Host memory the pixels take."""
        return int(self.images.nbytes)

    def write(self, label: int, images: np.ndarray) -> int:
        """Store ``images`` (uint8 ``[n, H, W, K]`` or one ``[H, W, K]``) as class ``label``;
        how many were stored (the last ``slots_per_class`` of a larger batch).

        Raises:
            ValueError: a label outside the classes, or images of another dtype or shape.
        """
        if not 0 <= int(label) < self.num_classes:
            raise ValueError(f"label {label} is outside [0, {self.num_classes})")
        arr = np.asarray(images)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4 or tuple(arr.shape[1:]) != self.image_shape or arr.dtype != np.uint8:
            raise ValueError(
                f"images {arr.dtype} {tuple(arr.shape)} do not fit the reservoir: expected "
                f"uint8 [n, {', '.join(map(str, self.image_shape))}]")
        arr = arr[-self.slots_per_class:]
        n, label = int(arr.shape[0]), int(label)
        if n == 0:
            return 0
        with self._lock:
            slots = (self._cursor[label] + np.arange(n)) % self.slots_per_class
            self.images[label, slots] = arr
            self._cursor[label] = (self._cursor[label] + n) % self.slots_per_class
            self._fill[label] = min(self.slots_per_class, int(self._fill[label]) + n)
            self.written += n
        return n

    def fill_counts(self) -> np.ndarray:
        """Images held per class, int32 ``[C]`` (a copy)."""
        with self._lock:
            return self._fill.copy()

    def draw(self, label: int, rng: np.random.Generator) -> np.ndarray | None:
        """A copy of one image of class ``label``, uniform over its filled slots; ``None``
        while the class holds none. Never waits on anything but the write lock."""
        with self._lock:
            held = int(self._fill[label])
            if held == 0:
                return None
            image: np.ndarray = self.images[label, int(rng.integers(held))].copy()
            return image

    def draw_any(self, rng: np.random.Generator) -> tuple[np.ndarray, int] | None:
        """One image and its class: the class uniform over those that hold images (a stream
        balanced over the classes), the slot uniform within it; ``None`` while all are
        empty."""
        with self._lock:
            held = np.flatnonzero(self._fill)
            if held.size == 0:
                return None
            label = int(held[int(rng.integers(held.size))])
            slot = int(rng.integers(int(self._fill[label])))
            return self.images[label, slot].copy(), label
