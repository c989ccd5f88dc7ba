"""The warm-up before ``/readyz`` turns 200: which batches to run, running them, and the
bookkeeping of which batch shapes the (compiled) pipeline has seen.

- :func:`warmup_plan`: the batches, from ``GENAUG_WARMUP_SHAPES``, the recipes and the default
  size (with compilation on, each at ``max_batch_images``, for :data:`WARMUP_STEPS` steps; with
  CUDA graphs at every size of :func:`batch_sizes`, the only sizes a padded batch takes).
- :func:`run_warmup`: runs them on the worker and records each shape as compiled.
- :class:`ShapeTracker`: the shapes compiled so far; a batch of a new shape after warm-up is a
  recompile (counted, and logged with the setting that avoids it). The hot path reports each
  batch to it through :class:`~genaug.service.pipeline.tracked.TrackedWorker`.

The lifespan drives all three through :class:`~genaug.service.pipeline.speed.Speed`. Nothing
here imports torch.

Example::

    tracker = ShapeTracker(active=True)
    plan = warmup_plan(settings, recipes.values(), defaults=(64, 4, 5.0))
    records = run_warmup(generator, plan, tracker)  # [WarmupRecord("64x64:8", ...), ...]
    tracker.compiled_shapes                         # ["64x64:8"]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..batching.items import GroupKey, Item, Worker, to_end

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "CUDA_GRAPH_MODES",
    "WARMUP_STEPS",
    "ShapeTracker",
    "WarmupRecord",
    "WarmupStep",
    "batch_sizes",
    "padded_size",
    "run_warmup",
    "uses_cuda_graphs",
    "warmup_plan",
]

log = logging.getLogger(__name__)

#: Denoising steps of a warm-up batch: compiling needs one UNet call; the second step runs
#: the compiled code once more (and a multistep scheduler's second-order branch).
WARMUP_STEPS = 2

# A batch's compiled shape: height, width, batch size.
Shape = tuple[int, int, int]

#: torch.compile modes that record and replay CUDA graphs (GENAUG_COMPILE_MODE).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def uses_cuda_graphs(compile_mode: str) -> bool:
    """Whether torch.compile's ``compile_mode`` replays CUDA graphs."""
    return compile_mode in CUDA_GRAPH_MODES


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a CUDA-graph service runs: powers of two below ``max_batch``, and
    ``max_batch`` itself (``8`` -> ``(1, 2, 4, 8)``, ``12`` -> ``(1, 2, 4, 8, 12)``).

    A graph is recorded per shape and keeps its memory pool, so a few sizes; powers of two
    waste at most half a batch of padding on a small batch, and a full batch none.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch {max_batch} must be >= 1")
    sizes = [1 << k for k in range(max_batch.bit_length()) if 1 << k < max_batch]
    return (*sizes, max_batch)


def padded_size(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest of ``sizes`` that holds ``n`` images (``n`` itself above them all)."""
    return next((size for size in sorted(sizes) if size >= n), n)


# -- the plan ------------------------------------------------------------------------------


class WarmupStep(NamedTuple):
    """One warm-up batch: the key (``WARMUP_STEPS`` steps), how many images, their guidance.

    Guidance matters only through classifier-free guidance being on (> 1) or off, which
    doubles the UNet's batch; ``source`` says why the step is in the plan.
    """

    key: GroupKey
    batch: int
    guidance: float = 5.0
    source: str = "GENAUG_WARMUP_SHAPES"


def warmup_plan(
    settings: Settings,
    recipes: Iterable[Any] = (),
    *,
    defaults: tuple[int, int, float],
) -> list[WarmupStep]:
    """The batches to run before ``/readyz`` turns 200, in order.

    ``defaults`` is ``(size, steps, guidance)`` used when a request omits them. Without
    compilation: one image at the default size and steps (lazy initialisation, so the first
    request does not pay for it), then the ``GENAUG_WARMUP_SHAPES``. With compilation: the
    ``GENAUG_WARMUP_SHAPES``, each recipe's generation size (with its guidance, scheduler and
    adapter when the recipe has them) and the default size, those two at
    ``max_batch_images`` (what a saturated service runs), each for ``WARMUP_STEPS`` steps. With
    CUDA graphs (``GENAUG_COMPILE_MODE`` reduce-overhead or max-autotune) each recipe size and
    the default size at every one of :func:`batch_sizes`, largest first, and a listed shape at
    the size its batch is padded to. A shape (size, batch) is never repeated: an adapter
    needs no warm-up of its own (it is hotswapped into the compiled UNet).
    """
    size, steps, guidance = defaults
    full = settings.max_batch_images
    compiling = settings.compile != "off"
    graphs = compiling and uses_cuda_graphs(settings.compile_mode)
    sizes = batch_sizes(full) if graphs else (full,)
    fills = sorted(sizes, reverse=True)
    plan: list[WarmupStep] = []
    seen: set[Shape] = set()

    def add(step: WarmupStep) -> None:
        shape = _shape_of(step.key, step.batch)
        if shape not in seen:
            seen.add(shape)
            plan.append(step)

    if not compiling:
        add(WarmupStep(GroupKey(size, size, steps), 1, guidance, "default size"))
    for shape in settings.warmup_shapes:
        batch = padded_size(shape.batch, sizes) if graphs else shape.batch
        add(WarmupStep(GroupKey(shape.height, shape.width, WARMUP_STEPS), batch, guidance))
    if not compiling:
        return plan
    for recipe in recipes:
        adapter = getattr(recipe, "adapter", None)
        adapter_name = getattr(adapter, "name", adapter) if adapter is not None else None
        key = GroupKey(
            height=int(recipe.height),
            width=int(recipe.width),
            steps=WARMUP_STEPS,
            scheduler=str(getattr(recipe, "scheduler", None) or "default"),
            adapter=str(adapter_name) if adapter_name is not None else None,
            adapter_scale=float(getattr(adapter, "scale", 1.0) or 1.0),
        )
        for batch in fills:
            add(WarmupStep(key, batch, float(recipe.guidance), f"recipe {recipe.name}"))
    for batch in fills:
        add(WarmupStep(GroupKey(size, size, WARMUP_STEPS), batch, guidance, "default size"))
    return plan


# -- running it ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WarmupRecord:
    """How long one warm-up batch took (compilation included)."""

    shape: str
    source: str
    seconds: float
    failed: int


def run_warmup(
    worker: Worker, plan: Iterable[WarmupStep], tracker: ShapeTracker
) -> list[WarmupRecord]:
    """Run each planned batch on ``worker`` (the unwrapped generator), mark its shape compiled
    in ``tracker``, and say how long it took. Call it in the worker thread."""
    records: list[WarmupRecord] = []
    for step in plan:
        shape = _shape_text(_shape_of(step.key, step.batch))
        items = [
            Item(
                "warm-up",
                seed=i,
                guidance=step.guidance,
                output_height=step.key.height,
                output_width=step.key.width,
            )
            for i in range(step.batch)
        ]
        started = time.perf_counter()
        outcome = to_end(worker.run(step.key, items))
        seconds = time.perf_counter() - started
        tracker.mark_compiled(step.key, step.batch)
        records.append(WarmupRecord(shape, step.source, seconds, len(outcome.errors)))
        log.info("warm-up %s (%s): %.2f s", shape, step.source, seconds)
        if outcome.errors:
            log.warning("warm-up %s: %d image(s) failed: %s", shape, len(outcome.errors),
                        next(iter(outcome.errors.values())))
    return records


# -- shape tracking -------------------------------------------------------------------------


def _shape_of(key: GroupKey, batch: int) -> Shape:
    # What makes torch.compile (static shapes) compile again: the latent size and the batch.
    # Not the LoRA adapter nor its scale: with compilation on they are hotswapped into one
    # slot whose tensors the compiled graph reads (adapters.py). Nor steps, scheduler,
    # guidance values, prompts and seeds.
    return key.height, key.width, batch


def _shape_text(shape: Shape) -> str:
    height, width, batch = shape
    return f"{height}x{width}:{batch}"


class ShapeTracker:
    """Which batch shapes the compiled pipeline has seen; counts batches of new ones.

    A shape is (generation size, batch size). With compilation on, a batch of a
    shape not compiled before makes torch compile again (seconds to minutes on a GPU): the
    worker reports each batch with :meth:`observe`, which counts such a batch as a recompile
    (``on_recompile``, the ``genaug_recompiles_total`` counter) and remembers the shape. With
    compilation off it records nothing.

    Example::

        tracker = ShapeTracker(active=True, on_recompile=metrics.recompiles.inc)
        tracker.mark_compiled(GroupKey(64, 64, 2), 8)      # warm-up
        tracker.observe(GroupKey(64, 64, 30), 8)           # False: compiled at warm-up
        tracker.observe(GroupKey(64, 64, 30), 3)           # True: a recompile
        tracker.compiled_shapes                            # ['64x64:8', '64x64:3']
    """

    def __init__(
        self,
        *,
        active: bool,
        on_recompile: Callable[[], object] | None = None,
        on_new_shape: Callable[[], object] | None = None,
    ) -> None:
        self.active = active
        self.on_recompile = on_recompile
        self.on_new_shape = on_new_shape
        self.recompiles = 0
        self._shapes: list[Shape] = []
        self._lock = threading.Lock()

    def mark_compiled(self, key: GroupKey, batch: int) -> None:
        """Record a shape compiled on purpose (warm-up); never counted as a recompile."""
        if not self.active:
            return
        shape = _shape_of(key, batch)
        with self._lock:
            if shape in self._shapes:
                return
            self._shapes.append(shape)
        if self.on_new_shape is not None:
            self.on_new_shape()

    def observe(self, key: GroupKey, batch: int) -> bool:
        """Report one batch before it runs; ``True`` (and counted) when its shape is new."""
        if not self.active:
            return False
        shape = _shape_of(key, batch)
        with self._lock:
            if shape in self._shapes:
                return False
            self._shapes.append(shape)
            self.recompiles += 1
        log.warning(
            "a batch of shape %s was not compiled at warm-up: compiling it now (add it to "
            "GENAUG_WARMUP_SHAPES to compile it before the service reports ready)",
            _shape_text(shape),
        )
        if self.on_recompile is not None:
            self.on_recompile()
        if self.on_new_shape is not None:
            self.on_new_shape()
        return True

    @property
    def compiled_shapes(self) -> list[str]:
        """``HxW:batch`` of every shape compiled so far (warm-up first), as GENAUG_WARMUP_SHAPES
        writes them."""
        with self._lock:
            return [_shape_text(s) for s in self._shapes]
