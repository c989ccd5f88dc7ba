"""The warm-up before ``/readyz`` turns 200: which batches to run, running them, and the
bookkeeping of which batch shapes the (compiled) pipeline has seen.

- :func:`warmup_plan`: the batches, from ``GENAUG_WARMUP_SHAPES``, the recipes and the default
  size (with compilation on, each at ``max_batch_images``, for :data:`WARMUP_STEPS` steps; with
  CUDA graphs at every size of :func:`batch_sizes`, the only sizes a padded batch takes).
- :func:`run_warmup`: runs them on the worker and records each shape as compiled.
- :class:`ShapeTracker`: the shapes compiled so far; a batch of a new shape after warm-up is a
  recompile (counted, and logged with the setting that avoids it). The hot path reports each
  batch to it through :class:`~genaug.service.pipeline.tracked.TrackedWorker`.

The lifespan drives all three through
:class:`~genaug.service.pipeline.acceleration.Acceleration`. Nothing here imports torch.

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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..batching.items import GroupKey, Item, Worker, to_end

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "CUDA_GRAPH_MODES",
    "WARMUP_STEPS",
    "CompileCounts",
    "ShapeTracker",
    "WarmupProgress",
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
    the size its batch is padded to. With a turbo LoRA (``GENAUG_TURBO_LORA``) every shape
    again in ``speed="turbo"``, which runs the turbo UNet, a module compiled on its own. A
    shape (size, batch, speed) is never repeated: an adapter
    needs no warm-up of its own (it is hotswapped into the compiled UNet).
    """
    size, steps, guidance = defaults
    full = settings.max_batch_images
    compiling = settings.compile != "off"
    graphs = compiling and uses_cuda_graphs(settings.compile_mode)
    sizes = batch_sizes(full) if graphs else (full,)
    fills = sorted(sizes, reverse=True)
    plan: list[WarmupStep] = []
    seen: set[tuple[Shape, str]] = set()

    def add(step: WarmupStep) -> None:
        shape = (_shape_of(step.key, step.batch), step.key.speed)
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
    if getattr(settings, "turbo_lora", None) is not None:
        # The turbo UNet is a module of its own: every shape compiles for it too.
        for step in list(plan):
            add(step._replace(key=replace(step.key, speed="turbo"),
                              source=f"{step.source}, turbo"))
    return plan


# -- running it ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WarmupRecord:
    """How long one warm-up batch took (compilation included), and what compiling did:
    ``status`` is ``compiled`` (new code: ``compiled`` graphs), ``from the cache`` (the graphs
    came from ``GENAUG_COMPILE_CACHE``), ``packaged`` (the UNet ran from its AOTInductor
    package: nothing traced), ``reused`` (an earlier compile served it: another batch size of
    the same image size) or ``ran`` (compilation is off)."""

    shape: str
    source: str
    seconds: float
    failed: int
    compiled: int = 0
    status: str = "ran"


@dataclass(frozen=True)
class CompileCounts:
    """dynamo's and inductor's counters at one moment (:func:`compile_counts`): graphs
    compiled, and inductor's FX graph cache hits and misses."""

    graphs: int = 0
    hits: int = 0
    misses: int = 0


@dataclass
class WarmupProgress:
    """How far the warm-up is, as ``/readyz``, ``/v1/info`` and the status page say it:
    ``warming 3 of 8: 1024x1024 batch 4 (41 s, compiling)``. Written by the worker thread,
    read by the event loop (one object replaced per step: no lock)."""

    done: int
    total: int
    shape: tuple[int, int, int] | None = None
    phase: str = "running"
    started: float = field(default_factory=time.monotonic)
    finished: bool = False
    seconds: float = 0.0

    def text(self, now: float | None = None) -> str:
        if self.finished:
            return f"warmed up: {self.total} shape(s) in {self.seconds:.0f} s"
        if self.shape is None:
            return f"warming {self.done} of {self.total}"
        elapsed = (time.monotonic() if now is None else now) - self.started
        height, width, batch = self.shape
        return (f"warming {self.done + 1} of {self.total}: {height}x{width} batch {batch} "
                f"({elapsed:.0f} s, {self.phase})")

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "finished": self.finished,
                "text": self.text()}


def run_warmup(
    worker: Worker,
    plan: Iterable[WarmupStep],
    tracker: ShapeTracker,
    *,
    counts: Callable[[], CompileCounts] | None = None,
    cached: bool = False,
    packaged: bool = False,
    progress: Callable[[WarmupProgress], object] | None = None,
    stop: threading.Event | None = None,
) -> list[WarmupRecord]:
    """Run each planned batch on ``worker`` (the unwrapped generator), mark its shape in
    ``tracker``, and say how long it took and what compiling did (``counts``: dynamo's
    counters, None when compilation is off; ``cached``: a compile cache entry was loaded;
    ``packaged``: the UNet runs from its packages).
    ``progress`` is told before each step and at the end; ``stop`` (set: the service is
    stopping) ends the warm-up before its next step. Call it in the worker thread."""
    steps = list(plan)
    records: list[WarmupRecord] = []
    began = time.monotonic()
    sizes_done: set[tuple[int, int]] = set()
    for index, step in enumerate(steps):
        if stop is not None and stop.is_set():
            log.info("warm-up stopped after %d of %d shapes: the service is stopping",
                     index, len(steps))
            break
        shape = _shape_of(step.key, step.batch)
        phase = ("running" if counts is None else "from the package" if packaged
                 else "reusing the compile" if shape[:2] in sizes_done
                 else "from the cache" if cached else "compiling")
        if progress is not None:
            progress(WarmupProgress(index, len(steps), shape, phase))
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
        before = counts() if counts is not None else None
        started = time.perf_counter()
        outcome = to_end(worker.run(step.key, items))
        seconds = time.perf_counter() - started
        after = counts() if counts is not None else None
        tracker.mark_compiled(step.key, step.batch)
        sizes_done.add(shape[:2])
        compiled, status = _what_compiling_did(before, after)
        if packaged and compiled == 0 and status == "reused":
            status = "packaged"
        text = _shape_text(shape)
        records.append(WarmupRecord(text, step.source, seconds, len(outcome.errors),
                                    compiled, status))
        log.info("warm-up %d of %d, %s (%s): %.2f s, %s", index + 1, len(steps), text,
                 step.source, seconds, status)
        if outcome.errors:
            log.warning("warm-up %s: %d image(s) failed: %s", text, len(outcome.errors),
                        next(iter(outcome.errors.values())))
    if progress is not None:
        progress(WarmupProgress(len(records), len(steps), finished=True,
                                seconds=time.monotonic() - began))
    return records


def _what_compiling_did(before: CompileCounts | None,
                        after: CompileCounts | None) -> tuple[int, str]:
    if before is None or after is None:
        return 0, "ran"
    graphs = after.graphs - before.graphs
    if graphs == 0:
        return 0, "reused"
    if after.hits > before.hits and after.misses == before.misses:
        return graphs, "from the cache"
    return graphs, "compiled"


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
    """Which batch shapes the compiled pipeline has run, and the compiles after warm-up.

    A shape is (generation size, batch size); :attr:`compiled_shapes` lists those warmed
    (:meth:`mark_compiled`) and served (:meth:`observe`), in order. Whether a batch made torch
    compile again is not guessed from its shape (the batch dimension is dynamic, and the
    UNet's batch counts each guided image twice): ``graphs`` reads dynamo's count of compiled
    graphs, and :meth:`ran` counts what grew since the warm-up ended (:meth:`settle`) as
    recompiles (``on_recompile``, the ``genaug_recompiles_total`` counter), logged with the
    shape and the setting that warms it. With compilation off it records nothing.

    Example::

        tracker = ShapeTracker(active=True, graphs=lambda: compile_counts().graphs)
        tracker.mark_compiled(GroupKey(64, 64, 2), 8)      # warm-up
        tracker.settle()                                   # warm-up done
        tracker.observe(GroupKey(64, 64, 30), 3)           # a batch of 3: a shape served
        tracker.ran(GroupKey(64, 64, 30), 3)               # 0: nothing compiled for it
        tracker.compiled_shapes                            # ['64x64:8', '64x64:3']
    """

    def __init__(
        self,
        *,
        active: bool,
        on_recompile: Callable[[], object] | None = None,
        on_new_shape: Callable[[], object] | None = None,
        graphs: Callable[[], int] | None = None,
    ) -> None:
        self.active = active
        self.on_recompile = on_recompile
        self.on_new_shape = on_new_shape
        self.graphs = graphs
        self.recompiles = 0
        self._settled: int | None = None
        self._shapes: list[Shape] = []
        self._lock = threading.Lock()

    def mark_compiled(self, key: GroupKey, batch: int) -> None:
        """Record a shape run on purpose (warm-up)."""
        self._record(key, batch)

    def settle(self) -> None:
        """The warm-up ended: from now on a compile is a recompile."""
        if self.active and self.graphs is not None:
            with self._lock:
                self._settled = self.graphs()

    def observe(self, key: GroupKey, batch: int) -> bool:
        """Report one batch before it runs; ``True`` when its shape is new."""
        return self._record(key, batch)

    def ran(self, key: GroupKey, batch: int) -> int:
        """After a batch ran: the graphs compiled for it since the warm-up (counted, and
        logged once each time)."""
        if not self.active or self.graphs is None:
            return 0
        with self._lock:
            if self._settled is None:
                return 0
            now = self.graphs()
            new, self._settled = now - self._settled, now
            self.recompiles += max(0, new)
        if new <= 0:
            return 0
        log.warning(
            "a batch of shape %s compiled %d new graph(s) after the warm-up (add its size to "
            "GENAUG_WARMUP_SHAPES to compile it before the service reports ready)",
            _shape_text(_shape_of(key, batch)), new,
        )
        if self.on_recompile is not None:
            for _ in range(new):
                self.on_recompile()
        return new

    def _record(self, key: GroupKey, batch: int) -> bool:
        if not self.active:
            return False
        shape = _shape_of(key, batch)
        with self._lock:
            if shape in self._shapes:
                return False
            self._shapes.append(shape)
        if self.on_new_shape is not None:
            self.on_new_shape()
        return True

    @property
    def compiled_shapes(self) -> list[str]:
        """``HxW:batch`` of every shape warmed or served so far (warm-up first), as
        GENAUG_WARMUP_SHAPES writes them."""
        with self._lock:
            return [_shape_text(s) for s in self._shapes]
