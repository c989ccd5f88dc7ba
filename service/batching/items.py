"""What flows from the queue to the pipeline: a batch's shared key and its images.

A leaf module (numpy only, no torch, no FastAPI), so the API, the queue, the pool planner and
the pipeline worker all speak about work in the same terms without importing each other.

- :class:`GroupKey` holds what must be equal for every image of one pipeline call, because
  those images share one UNet call per step: generation size, steps, scheduler, LoRA adapter
  and scale, the mode (text-to-image or img2img with its strength) and the speed mode.
- :class:`Item` holds everything that may differ between batch mates: prompt, negative
  prompt, seed, guidance, output size and channels, and for img2img the source image. An
  image depends on its own item and the key, never on its batch mates: guidance and the
  negative prompt are applied per image inside one UNet call (``service/pipeline/sampler.py``).
- A :class:`Worker` turns ``(key, items)`` into an :class:`Outcome`, in one thread. While it
  runs, the batcher speaks to the batch through its :class:`Flight` (read between denoising
  steps): drop the images of requests that are gone, or pause so a person's request, or a
  client served less, goes first. A paused batch comes back as :class:`Paused`, which goes
  on where it stopped.

Example::

    key = GroupKey(height=64, width=64, steps=4)
    items = [Item("a red circle", seed=1, guidance=5.0, output_height=64, output_width=64)]
    outcome = worker.run(key, items)
    outcome.images[0].shape  # (64, 64, 3)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

import numpy as np

from .names import SchedulerName

Mode = Literal["text", "img2img"]


@dataclass(frozen=True)
class GroupKey:
    """Pipeline arguments that must be equal for every image of one pipeline call.

    ``strength`` only means something in ``img2img`` mode (the share of the denoising
    schedule that is run, in (0, 1]: the last ``max(1, int(steps * strength))`` steps);
    text-to-image keys keep the default 1.0. ``scheduler`` is a name from :data:`SCHEDULERS`;
    in a key ``"default"`` means the service's ``GENAUG_SCHEDULER`` (whose own ``"default"``
    is the scheduler the model brings). ``adapter`` is a loaded LoRA's name (``GENAUG_LORAS``)
    or ``None``, active at ``adapter_scale`` for the whole call. ``speed`` is the mode the
    batch is drawn in (:mod:`genaug.service.sampling.modes`): ``"turbo"`` runs the turbo UNet when a
    turbo LoRA is served, so two modes never share a UNet call.
    """

    height: int
    width: int
    steps: int
    scheduler: str = "default"
    adapter: str | None = None
    adapter_scale: float = 1.0
    mode: Mode = "text"
    strength: float = 1.0
    speed: str = "quality"


def runs_guidance(guidance: float) -> bool:
    """Whether an image drawn with ``guidance`` runs classifier-free guidance: above 1 (the
    unconditional half of the UNet runs too, so it costs two UNet rows), as in diffusers;
    1 or less means none. The one place the rule is written."""
    return guidance > 1


@dataclass(frozen=True, eq=False)
class Item:
    """One image to make.

    ``guidance`` above 1 applies classifier-free guidance to this image; 1 or less means none
    (its negative prompt is then ignored), as in diffusers. ``negative_prompt`` ``None`` and
    ``""`` differ: SDXL encodes "no negative prompt" as zeros but an empty one as text.
    ``channels`` is 3 (RGB) or 1 (luminance, for depth-like inputs). ``source`` is the img2img
    input, uint8 ``[key.height, key.width, 3]``, and ``source_hash`` names it (kept with the
    output in the pool).
    """

    prompt: str
    seed: int
    guidance: float
    output_height: int
    output_width: int
    negative_prompt: str | None = None
    channels: int = 3
    source: np.ndarray | None = field(default=None, repr=False)
    source_hash: str | None = None

    @property
    def guided(self) -> bool:
        """Whether this image runs classifier-free guidance (:func:`runs_guidance`)."""
        return runs_guidance(self.guidance)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the image this item becomes."""
        return self.output_height, self.output_width, self.channels


#: Scheduler names a key, a recipe or a request may use. ``default`` in a key, a recipe or a
#: request is the service's setting (``GENAUG_SCHEDULER``); as that setting, the model's own.
SCHEDULERS: tuple[str, ...] = get_args(SchedulerName)


@dataclass
class Outcome:
    """What the worker made of one batch: one image per item, the items that failed, and
    the items it dropped because the batcher said nobody waits for them.

    ``images[i]`` is uint8 ``items[i].output_shape``. ``errors`` maps an item's index to a
    message; ``dropped`` maps an item's index to the denoising steps it did not run. Those
    items' images are undefined and never served.
    """

    images: list[np.ndarray]
    errors: dict[int, str] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)

    def good(self) -> list[int]:
        """Indices of the items that succeeded."""
        return [
            i for i in range(len(self.images)) if i not in self.errors and i not in self.dropped
        ]


class Flight:
    """The batcher's word to one batch in the pipeline, read by the worker between steps.

    The event loop writes (:meth:`drop` the rows of a request that is gone, :meth:`pause`
    for work that goes first, :meth:`pause_at` for the end of the batch's time slice) and the
    worker thread reads (:meth:`poll`) at every denoising step boundary, so a word takes
    effect within one step. Rows are indices into the batch's items as first handed to the
    worker. ``clock`` is the batcher's (what :meth:`pause_at` times are on). Thread-safe.

    Example::

        flight = Flight()
        flight.drop([2, 3])            # loop: request gone
        dropped, pause = flight.poll() # worker: ({2, 3}, False)
        flight.pause_at(time.monotonic() + 0.1)  # loop: yield once the slice is used
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._dropped: set[int] = set()
        self._pause_at: float | None = None
        self._clock = clock

    def drop(self, rows: Iterable[int]) -> None:
        """Nobody waits for these rows' images any more: stop making them."""
        with self._lock:
            self._dropped.update(rows)

    def pause(self) -> None:
        """Stop at the next step boundary and hand back a :class:`Paused` batch."""
        self.pause_at(-math.inf)

    def pause_at(self, when: float | None) -> None:
        """Stop at the first step boundary at or after ``when`` (on ``clock``); ``None``:
        run on. Replaces any earlier word."""
        with self._lock:
            self._pause_at = when

    def go_on(self) -> None:
        """Withdraw a pause (before resuming, or when the batch must finish)."""
        self.pause_at(None)

    def poll(self) -> tuple[frozenset[int], bool]:
        """``(rows dropped so far, pause asked)``; the worker's view between two steps."""
        with self._lock:
            at = self._pause_at
            return frozenset(self._dropped), at is not None and self._clock() >= at


@dataclass
class Paused:
    """A batch stopped at a denoising step boundary so other work could run.

    ``resume(flight)`` (in the worker thread) goes on from step ``step`` of ``steps`` with
    the same latents, scheduler state and random generators, so the images are exactly those
    of an uninterrupted run; it returns an :class:`Outcome`, or ``Paused`` again.
    """

    key: GroupKey
    items: Sequence[Item]
    step: int
    steps: int
    resume: Callable[[Flight | None], Outcome | Paused] = field(repr=False)


class Worker(Protocol):
    """The one thing that calls the pipeline. Runs in the batcher's worker thread.

    Without a ``flight`` a worker never pauses and drops nothing: the answer is an
    :class:`Outcome` (:func:`to_end` says so to the type checker). A worker that cannot stop
    between steps may ignore ``flight``.
    """

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused: ...


def to_end(result: Outcome | Paused) -> Outcome:
    """``result``'s outcome, resuming it to the end if it was paused."""
    while isinstance(result, Paused):
        result = result.resume(None)
    return result


@dataclass
class IdleWork:
    """A batch the worker may run when no request waits (pool pre-generation).

    ``on_done`` is called with the outcome in the batcher's store thread, in order, while the
    worker already makes the next batch; ``on_failed`` (optional) when the batch raised, so
    the planner can release what it reserved for it.
    """

    key: GroupKey
    items: list[Item]
    on_done: Callable[[Outcome], None]
    on_failed: Callable[[BaseException], None] | None = None


class IdleSource(Protocol):
    """Supplies background batches; ``None`` when there is nothing to do (never spin)."""

    def next_idle_batch(self, max_images: int) -> IdleWork | None: ...
