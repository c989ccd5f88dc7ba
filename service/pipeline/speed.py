"""Speed options for the loaded pipeline, the compile warm-up, and its shape bookkeeping.

The options (``GENAUG_*`` settings, all off by default):

- ``compile``: ``off``; ``unet`` (``torch.compile`` of the whole UNet); ``regional`` (only the
  UNet's repeated transformer blocks, diffusers' ``compile_repeated_blocks``: one compiled
  block serves all 70 of SDXL's, so warm-up is several times shorter for most of the gain).
  Shapes are static (``dynamic=False``): every (generation size, batch size, adapter) compiles
  once, at warm-up or on its first batch.
- ``channels_last``: UNet and VAE weights in NHWC memory layout (faster convolutions on
  tensor cores).
- ``fuse_qkv``: one matrix product for the query, key and value projections of each attention
  (key and value for cross-attention), in the UNet and the VAE.
- ``vae_slicing``: decode a batch one image at a time (lower peak memory, same images).
- ``vae_tiling``: decode in overlapping tiles when the latents exceed the VAE's own sample
  size (1024 px for SDXL, 64 px for the tiny model): much lower peak memory for large images;
  tiles are blended, so pixels differ slightly from an untiled decode.

Life cycle (the app's lifespan is the one caller)::

    speed = Speed.setup(model, settings, metrics)   # after load, before the worker starts
    worker = speed.wrap(generator)                  # counts batches of shapes not compiled
    ...                                             # start the batcher
    plan = speed.plan(settings, recipes.values(), defaults=(size, steps, guidance))
    await batcher.run_in_worker(lambda: speed.warm_up(generator, plan))  # before /readyz 200
    speed.info()  # {"compile": "regional", ..., "compiled_shapes": ["1024x1024:8"]}

Everything that touches torch is imported inside functions: ``settings.py`` imports this
module for :class:`WarmupShape`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ..batching.items import GroupKey, Item, Outcome, Worker

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..settings import Settings
    from .load import LoadedModel

__all__ = [
    "COMPILE_MODES",
    "WARMUP_STEPS",
    "Speed",
    "SpeedError",
    "SpeedOptions",
    "ShapeTracker",
    "TrackedWorker",
    "WarmupRecord",
    "WarmupShape",
    "WarmupStep",
    "apply_speed",
    "parse_warmup_shapes",
    "warmup_plan",
]

log = logging.getLogger(__name__)

CompileMode = Literal["off", "unet", "regional"]
COMPILE_MODES: tuple[CompileMode, ...] = ("off", "unet", "regional")

#: Denoising steps of a warm-up batch: compiling needs one UNet call; the second step runs
#: the compiled code once more (and a multistep scheduler's second-order branch).
WARMUP_STEPS = 2

#: torch.compile recompiles a function for each new static shape up to this many times, then
#: silently runs it eagerly. Regional compilation shares one code object among all transformer
#: blocks, and SDXL's two block widths make two graphs per shape: raise torch's default of 8.
RECOMPILE_LIMIT = 64

# The attribute on a pipeline that records the options applied to it (see apply_speed).
_APPLIED_ATTR = "_genaug_speed"

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*:\s*(\d+)\s*$")

# A batch's compiled shape: height, width, batch size, adapter ("name@scale") or None.
Shape = tuple[int, int, int, str | None]


class SpeedError(RuntimeError):
    """A speed option cannot be applied; the message names the setting and the fix."""


# -- options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedOptions:
    """What to do to a loaded pipeline; all off by default.

    Example::

        options = SpeedOptions(compile="regional", channels_last=True, fuse_qkv=True)
        options.enabled        # ['compile=regional', 'channels_last', 'fuse_qkv']
        SpeedOptions.from_settings(Settings())  # all off
    """

    compile: CompileMode = "off"
    channels_last: bool = False
    fuse_qkv: bool = False
    vae_slicing: bool = False
    vae_tiling: bool = False

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise SpeedError(
                f"compile mode {self.compile!r} is not one of {', '.join(COMPILE_MODES)}; "
                "set GENAUG_COMPILE to one of those"
            )

    @classmethod
    def from_settings(cls, settings: Settings) -> SpeedOptions:
        return cls(
            compile=settings.compile,
            channels_last=settings.channels_last,
            fuse_qkv=settings.fuse_qkv,
            vae_slicing=settings.vae_slicing,
            vae_tiling=settings.vae_tiling,
        )

    @classmethod
    def parse(cls, text: str) -> SpeedOptions:
        """``"compile=regional,channels_last,fuse_qkv"`` (or ``"baseline"``/``""``: all off)."""
        values: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        for raw in text.split(","):
            part = raw.strip()
            if not part or part in ("baseline", "off"):
                continue
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in names:
                known = ", ".join(sorted(names))
                raise SpeedError(f"unknown speed option {name!r} in {text!r}; options: {known}")
            if name == "compile":
                values[name] = value.strip() or "unet"
            else:
                values[name] = value.strip().lower() not in ("false", "0", "off", "no")
        return cls(**values)

    @property
    def enabled(self) -> list[str]:
        """The options that are on, as short names (``[]`` for the baseline)."""
        out = [f"compile={self.compile}"] if self.compile != "off" else []
        out += [f.name for f in fields(self) if f.name != "compile" and getattr(self, f.name)]
        return out

    @property
    def label(self) -> str:
        """``"baseline"`` or the enabled options joined by ``+``."""
        return "+".join(self.enabled) or "baseline"

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def apply_speed(pipeline: Any, options: SpeedOptions) -> SpeedOptions:
    """Apply ``options`` to a loaded SDXL pipeline in place; return what was applied.

    Call it after loading and before the worker's first batch. Order: fused QKV (new weights),
    then channels_last (their layout), then the VAE switches, then compile (which traces what
    the others made). Compilation itself happens lazily, on the first call of each shape:
    that is what the warm-up is for.

    Applying the same options again is a no-op that returns them (the app's lifespan may run
    after a benchmark prepared the model); other options on an already changed pipeline are
    refused, since fusing or compiling cannot be undone.

    Raises:
        SpeedError: an option this pipeline does not support, or different options already
            applied.
    """
    previous: SpeedOptions | None = getattr(pipeline, _APPLIED_ATTR, None)
    if previous is not None:
        if previous == options:
            return previous
        raise SpeedError(
            f"this pipeline already has the speed options {previous.label} applied and "
            f"cannot take {options.label} as well (fused weights and compiled modules cannot "
            "be undone); load a fresh model"
        )
    if not options.enabled:
        return options

    import torch

    unet = pipeline.unet
    vae = pipeline.vae
    if options.fuse_qkv:
        for name, module in (("unet", unet), ("vae", vae)):
            try:
                module.fuse_qkv_projections()
            except (ValueError, AttributeError, NotImplementedError) as exc:
                raise SpeedError(
                    f"GENAUG_FUSE_QKV: the {name} ({type(module).__name__}) cannot fuse its "
                    f"attention projections: {exc}; set GENAUG_FUSE_QKV=false"
                ) from exc
    if options.channels_last:
        unet.to(memory_format=torch.channels_last)
        vae.to(memory_format=torch.channels_last)
    for flag, method, setting in (
        (options.vae_slicing, "enable_slicing", "GENAUG_VAE_SLICING"),
        (options.vae_tiling, "enable_tiling", "GENAUG_VAE_TILING"),
    ):
        if flag:
            try:
                getattr(vae, method)()
            except (AttributeError, NotImplementedError) as exc:
                raise SpeedError(
                    f"{setting}: the VAE ({type(vae).__name__}) does not support it: {exc}; "
                    f"set {setting}=false"
                ) from exc
    if options.compile != "off":
        _raise_recompile_limit()
        if options.compile == "unet":
            unet.compile(dynamic=False)
        else:
            try:
                unet.compile_repeated_blocks(dynamic=False)
            except (ValueError, AttributeError) as exc:
                raise SpeedError(
                    f"GENAUG_COMPILE=regional: the UNet ({type(unet).__name__}) declares no "
                    f"repeated blocks diffusers can compile ({exc}); set GENAUG_COMPILE=unet"
                ) from exc
    # A plain attribute on the pipeline object (not a registered component).
    object.__setattr__(pipeline, _APPLIED_ATTR, options)
    log.info("speed options applied: %s", options.label)
    return options


def _raise_recompile_limit() -> None:
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # renamed in torch 2.6
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(int(getattr(dynamo_config, name)), RECOMPILE_LIMIT))
            return


# -- warm-up shapes -------------------------------------------------------------------------


class WarmupShape(NamedTuple):
    """One ``HxW:batch`` entry of ``GENAUG_WARMUP_SHAPES``: generation size and batch size.

    Example::

        WarmupShape.parse("1024x1024:8")   # WarmupShape(height=1024, width=1024, batch=8)
        str(WarmupShape(768, 1024, 4))     # '768x1024:4'
    """

    height: int
    width: int
    batch: int

    def __str__(self) -> str:
        return f"{self.height}x{self.width}:{self.batch}"

    @classmethod
    def parse(cls, text: str) -> WarmupShape:
        match = _SHAPE.match(text)
        if match is None:
            raise ValueError(
                f"warm-up shape {text.strip()!r} is not HxW:batch; write e.g. 1024x1024:8 "
                "(several separated by commas)"
            )
        height, width, batch = (int(g) for g in match.groups())
        for name, value in (("height", height), ("width", width)):
            if value < 8 or value % 8:
                raise ValueError(
                    f"warm-up shape {text.strip()!r}: {name} {value} is not a positive "
                    "multiple of 8 (the VAE downsamples by 8); e.g. 1024x1024:8"
                )
        if batch < 1:
            raise ValueError(f"warm-up shape {text.strip()!r}: batch {batch} must be >= 1")
        return cls(height, width, batch)


def parse_warmup_shapes(value: object) -> tuple[WarmupShape, ...]:
    """``"1024x1024:8, 768x768:4"`` (or a list of such strings or shapes) -> shapes, in order,
    without duplicates. Raises ``ValueError`` naming the bad entry and the expected form."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts: Iterable[Any] = [p for p in value.split(",") if p.strip()]
    elif isinstance(value, Iterable):
        parts = value
    else:
        raise ValueError(f"warm-up shapes must be a string like '1024x1024:8', got {value!r}")
    out: list[WarmupShape] = []
    for part in parts:
        if isinstance(part, str):
            shape = WarmupShape.parse(part)
        elif isinstance(part, Sequence) and len(part) == 3:
            shape = WarmupShape.parse(f"{part[0]}x{part[1]}:{part[2]}")
        else:
            raise ValueError(f"warm-up shape {part!r} is not HxW:batch; write e.g. 1024x1024:8")
        if shape not in out:
            out.append(shape)
    return tuple(out)


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
    ``max_batch_images`` (what a saturated service runs), each for ``WARMUP_STEPS`` steps. A
    shape (size, batch, adapter) is never repeated.
    """
    size, steps, guidance = defaults
    full = settings.max_batch_images
    compiling = settings.compile != "off"
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
        add(WarmupStep(GroupKey(shape.height, shape.width, WARMUP_STEPS), shape.batch, guidance))
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
        add(WarmupStep(key, full, float(recipe.guidance), f"recipe {recipe.name}"))
    add(WarmupStep(GroupKey(size, size, WARMUP_STEPS), full, guidance, "default size"))
    return plan


# -- shape tracking -------------------------------------------------------------------------


def _shape_of(key: GroupKey, batch: int) -> Shape:
    # What makes torch.compile (static shapes) compile again: the latent size, the batch, and
    # a LoRA adapter with its scale (the active adapter and its scale are attributes of the
    # injected layers, which the compiled code is guarded on). Steps, scheduler, guidance
    # values, prompts and seeds do not.
    adapter = None if key.adapter is None else f"{key.adapter}@{key.adapter_scale:g}"
    return key.height, key.width, batch, adapter


def _shape_text(shape: Shape) -> str:
    height, width, batch, adapter = shape
    text = f"{height}x{width}:{batch}"
    return f"{text} (adapter {adapter})" if adapter is not None else text


class ShapeTracker:
    """Which batch shapes the compiled pipeline has seen; counts batches of new ones.

    A shape is (generation size, batch size, adapter). With compilation on, a batch of a
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
        writes them; an adapter is added in parentheses."""
        with self._lock:
            return [_shape_text(s) for s in self._shapes]


class TrackedWorker:
    """A :class:`Worker` that reports each batch's shape, then runs it.

    Example::

        worker = TrackedWorker(generator, tracker)
        worker.run(key, items)   # tracker.observe(key, len(items)); generator.run(key, items)
    """

    def __init__(self, inner: Worker, tracker: ShapeTracker) -> None:
        self.inner = inner
        self.tracker = tracker

    def run(self, key: GroupKey, items: Sequence[Item]) -> Outcome:
        self.tracker.observe(key, len(items))
        return self.inner.run(key, items)


# -- the lifespan's handle ------------------------------------------------------------------


@dataclass(frozen=True)
class WarmupRecord:
    """How long one warm-up batch took (compilation included)."""

    shape: str
    source: str
    seconds: float
    failed: int


class Speed:
    """The speed options applied to one loaded model, and its shape tracker.

    ``publish`` (optional) is called with :meth:`info` at set-up and whenever a shape is
    compiled (in the worker thread): the app merges it into the ``speed`` group that
    ``GET /v1/info`` reads, next to the scheduler its owner reports.

    Example::

        speed = Speed.setup(model, settings, metrics)   # applies the options (no-op when off)
        worker = speed.wrap(generator)
        records = speed.warm_up(generator, speed.plan(settings, [], defaults=(64, 4, 5.0)))
        speed.info()
        # {'compile': 'off', 'channels_last': False, 'fuse_qkv': False,
        #  'vae_slicing': False, 'vae_tiling': False, 'compiled_shapes': []}
    """

    def __init__(
        self,
        applied: SpeedOptions,
        tracker: ShapeTracker,
        publish: Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        self.applied = applied
        self.tracker = tracker
        self.warmup_records: list[WarmupRecord] = []
        self._publish_to = publish
        tracker.on_new_shape = self._publish
        self._publish()

    @classmethod
    def setup(
        cls,
        model: LoadedModel | Any,
        settings: Settings,
        metrics: Metrics | None = None,
        publish: Callable[[dict[str, Any]], object] | None = None,
    ) -> Speed:
        """Apply the settings' options to ``model`` (a ``LoadedModel`` or a bare pipeline).

        Raises :class:`SpeedError` (an option the model cannot take; fused projections with
        LoRA adapters, which they would bypass).
        """
        options = SpeedOptions.from_settings(settings)
        if options.fuse_qkv and getattr(settings, "loras", None):
            raise SpeedError(
                "GENAUG_FUSE_QKV cannot be combined with GENAUG_LORAS: the fused "
                "query/key/value projections would bypass the adapters' LoRA layers; set "
                "GENAUG_FUSE_QKV=false"
            )
        pipeline = getattr(model, "pipeline", model)
        applied = apply_speed(pipeline, options)
        on_recompile = metrics.recompiles.inc if metrics is not None else None
        tracker = ShapeTracker(active=applied.compile != "off", on_recompile=on_recompile)
        return cls(applied, tracker, publish)

    def _publish(self) -> None:
        if self._publish_to is not None:
            self._publish_to(self.info())

    def wrap(self, worker: Worker) -> Worker:
        """``worker`` reporting each batch's shape (only needed with compilation on)."""
        return TrackedWorker(worker, self.tracker) if self.tracker.active else worker

    @staticmethod
    def plan(
        settings: Settings, recipes: Iterable[Any] = (), *, defaults: tuple[int, int, float]
    ) -> list[WarmupStep]:
        """See :func:`warmup_plan`."""
        return warmup_plan(settings, recipes, defaults=defaults)

    def warm_up(self, worker: Worker, plan: Iterable[WarmupStep]) -> list[WarmupRecord]:
        """Run each planned batch on ``worker`` (the unwrapped generator) and record its shape
        as compiled. Call it in the worker thread (``batcher.run_in_worker``)."""
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
            outcome = worker.run(step.key, items)
            seconds = time.perf_counter() - started
            self.tracker.mark_compiled(step.key, step.batch)
            records.append(WarmupRecord(shape, step.source, seconds, len(outcome.errors)))
            log.info("warm-up %s (%s): %.2f s", shape, step.source, seconds)
            if outcome.errors:
                log.warning("warm-up %s: %d image(s) failed: %s", shape, len(outcome.errors),
                            next(iter(outcome.errors.values())))
        self.warmup_records.extend(records)
        return records

    def info(self) -> dict[str, Any]:
        """The ``speed`` group of ``/v1/info`` (the scheduler is reported by its owner)."""
        return {**self.applied.as_dict(), "compiled_shapes": self.tracker.compiled_shapes}
