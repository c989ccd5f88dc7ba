"""Speed options for the loaded pipeline, and the lifespan's handle on them (:class:`Speed`).

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

The warm-up itself (its plan, running it, the compiled-shape bookkeeping) is
:mod:`~genaug.service.pipeline.warmup`; the hot-path wrapper that reports each batch's shape is
:mod:`~genaug.service.pipeline.tracked`. Everything that touches torch is imported inside
functions: the app imports this module before any model is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from ..batching.items import Worker
from .tracked import TrackedWorker
from .warmup import ShapeTracker, WarmupRecord, WarmupStep, run_warmup, warmup_plan

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..settings import Settings
    from .load import LoadedModel

__all__ = ["COMPILE_MODES", "Speed", "SpeedError", "SpeedOptions", "apply_speed"]

log = logging.getLogger(__name__)

CompileMode = Literal["off", "unet", "regional"]
COMPILE_MODES: tuple[CompileMode, ...] = ("off", "unet", "regional")

#: torch.compile recompiles a function for each new static shape up to this many times, then
#: silently runs it eagerly. Regional compilation shares one code object among all transformer
#: blocks, and SDXL's two block widths make two graphs per shape: raise torch's default of 8.
RECOMPILE_LIMIT = 64

# The attribute on a pipeline that records the options applied to it (see apply_speed).
_APPLIED_ATTR = "_genaug_speed"


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


# -- the lifespan's handle ------------------------------------------------------------------


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
        """See :func:`~genaug.service.pipeline.warmup.warmup_plan`."""
        return warmup_plan(settings, recipes, defaults=defaults)

    def warm_up(self, worker: Worker, plan: Iterable[WarmupStep]) -> list[WarmupRecord]:
        """Run each planned batch on ``worker`` (the unwrapped generator) and record its shape
        as compiled (:func:`~genaug.service.pipeline.warmup.run_warmup`). Call it in the worker
        thread (``batcher.run_in_worker``)."""
        records = run_warmup(worker, plan, self.tracker)
        self.warmup_records.extend(records)
        return records

    def info(self) -> dict[str, Any]:
        """The ``speed`` group of ``/v1/info`` (the scheduler is reported by its owner)."""
        return {**self.applied.as_dict(), "compiled_shapes": self.tracker.compiled_shapes}
