"""Applying the speed options to a loaded pipeline, and the lifespan's handle on them
(:class:`Speed`).

What each option does, and how options are written and refused, is
:mod:`~genaug.service.pipeline.speed_options` (:class:`SpeedOptions`); this module applies
them to a loaded pipeline (:func:`apply_speed`) and holds the lifespan's handle.

Life cycle (the app's lifespan is the one caller)::

    speed = Speed.setup(model, settings, metrics)   # after load, before the worker starts
    worker = speed.wrap(generator)                  # counts batches of shapes not compiled
    ...                                             # start the batcher
    plan = speed.plan(settings, recipes.values(), defaults=(size, steps, guidance))
    await batcher.run_in_worker(lambda: speed.warm_up(generator, plan))  # before /readyz 200
    speed.info()  # {"compile": "regional", ..., "compiled_shapes": ["1024x1024:8"]}

Start-up checks the options that depend on the device before anything loads
(:func:`check_speed_settings`: FP8 on a device without it, torchao missing, a CUDA-only
attention kernel on the CPU), each refused in one line.

The warm-up itself (its plan, running it, the compiled-shape bookkeeping) is
:mod:`~genaug.service.pipeline.warmup`; the hot-path wrapper that reports each batch's shape is
:mod:`~genaug.service.pipeline.tracked`. Everything that touches torch is imported inside
functions: the app imports this module before any model is loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..batching.items import Worker
from .errors import SpeedError
from .speed_options import SpeedOptions
from .tracked import PaddedWorker, TrackedWorker
from .warmup import (
    ShapeTracker,
    WarmupRecord,
    WarmupStep,
    batch_sizes,
    run_warmup,
    warmup_plan,
)

if TYPE_CHECKING:
    import torch

    from ..metrics import Metrics
    from ..settings import Settings
    from .load import LoadedModel

__all__ = [
    "Speed",
    "SpeedError",
    "StepMarked",
    "apply_speed",
    "check_speed_settings",
]

log = logging.getLogger(__name__)

#: torch.compile recompiles a function for each new static shape up to this many times, then
#: silently runs it eagerly. Regional compilation shares one code object among all transformer
#: blocks, and SDXL's two block widths make two graphs per shape: raise torch's default of 8.
RECOMPILE_LIMIT = 64

# The attributes on a pipeline that record the options applied to it and what they did
# (the attention kernel chosen, the layers quantized; see apply_speed).
_APPLIED_ATTR = "_genaug_speed"
_REPORT_ATTR = "_genaug_speed_report"


def apply_speed(pipeline: Any, options: SpeedOptions) -> SpeedOptions:
    """Apply ``options`` to a loaded SDXL pipeline in place; return what was applied.

    Call it after loading and before the worker's first batch. Order: fused QKV (new weights),
    then channels_last (their layout), then the VAE switches, then FP8 (it quantizes the fused
    weights), then the attention kernel (process-wide), then compile (which traces what the
    others made). Compilation itself happens lazily, on the first call of each shape: that is
    what the warm-up is for. What the options did (the attention kernel chosen, the layers
    quantized) is :func:`applied_report`.

    Applying the same options again is a no-op that returns them (the app's lifespan may run
    after a benchmark prepared the model); other options on an already changed pipeline are
    refused, since fusing, quantizing or compiling cannot be undone. The attention kernel is
    not part of the pipeline (torch's choice is process-wide): it is chosen and set on every
    call, whatever was applied before.

    Raises:
        SpeedError: an option this pipeline does not support, or different options already
            applied.
    """
    from .attention import apply_attention, choose_attention

    unet = pipeline.unet
    device = _device_of(unet)
    choice = choose_attention(options.attention, device)
    # What changes the pipeline itself, and is recorded on it.
    structural = replace(options, attention="default")
    previous: SpeedOptions | None = getattr(pipeline, _APPLIED_ATTR, None)
    report: dict[str, Any] = dict(getattr(pipeline, _REPORT_ATTR, {}))
    if previous is not None and previous != structural:
        raise SpeedError(
            f"this pipeline already has the speed options {previous.label} applied and "
            f"cannot take {structural.label} as well (fused weights, FP8 layers and compiled "
            "modules cannot be undone); load a fresh model"
        )
    apply_attention(choice)
    report["attention_backend"] = choice.backend
    object.__setattr__(pipeline, _REPORT_ATTR, report)
    if previous is not None or not structural.enabled:
        return options
    _apply_structural(pipeline, structural, device, report)
    return options


def _apply_structural(
    pipeline: Any, options: SpeedOptions, device: torch.device, report: dict[str, Any]
) -> None:
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
    if options.quantize == "fp8":
        from .quantize import check_fp8, quantize_fp8

        check_fp8(device)
        report["quantized_layers"] = len(quantize_fp8(unet))
    if options.compile != "off":
        _raise_recompile_limit()
        # mode=None is torch's default; reduce-overhead and max-autotune record CUDA graphs.
        mode = None if options.compile_mode == "default" else options.compile_mode
        if options.compile == "unet" and options.cuda_graphs:
            # The compiled forward inside a wrapper that marks each call a new CUDA-graph step
            # and clones what it returns (StepMarked): the wrapper runs eagerly, outside the
            # compiled frame (unet.compile() would trace it).
            unet.forward = StepMarked(torch.compile(unet.forward, dynamic=False, mode=mode))
        elif options.compile == "unet":
            unet.compile(dynamic=False, mode=mode)
        else:
            try:
                unet.compile_repeated_blocks(dynamic=False, mode=mode)
            except (ValueError, AttributeError) as exc:
                raise SpeedError(
                    f"GENAUG_COMPILE=regional: the UNet ({type(unet).__name__}) declares no "
                    f"repeated blocks diffusers can compile ({exc}); set GENAUG_COMPILE=unet"
                ) from exc
    # Plain attributes on the pipeline object (not registered components).
    object.__setattr__(pipeline, _APPLIED_ATTR, options)
    log.info("speed options applied: %s", options.label)


class StepMarked:
    """A compiled UNet forward that replays CUDA graphs, called as one denoising step each.

    Each call first marks the beginning of a step (``torch.compiler.
    cudagraph_mark_step_begin()``: the graph may reuse its output memory from here on), then
    returns a copy of what the graph returned, so nothing of one replay is read after the next
    (a scheduler that kept a step's model output, or a view of it, would otherwise read the
    next step's). The copy is one latent-sized tensor per step. Without CUDA graphs (the CPU)
    the mark is a counter and the copy is all it costs.

    Example::

        unet.forward = StepMarked(torch.compile(unet.forward, mode="reduce-overhead"))
        unet(sample, t, encoder_hidden_states=embeds)   # marked, replayed, copied
        unet.forward.calls                              # 1
    """

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_map_only

        torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        self.calls += 1
        out = self.compiled(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: t.clone(), out)


def applied_report(pipeline: Any) -> dict[str, Any]:
    """What :func:`apply_speed` did to ``pipeline``: ``attention_backend`` (the kernel chosen;
    ``default`` is torch's own order) and ``quantized_layers`` (FP8), as ``/v1/info`` shows."""
    report: dict[str, Any] = getattr(pipeline, _REPORT_ATTR, {})
    return {
        "attention_backend": report.get("attention_backend", "default"),
        "quantized_layers": report.get("quantized_layers", 0),
    }


def _device_of(module: Any) -> torch.device:
    import torch

    for parameter in getattr(module, "parameters", list)():
        device: torch.device = parameter.device
        return device
    return torch.device("cpu")


def check_speed_settings(settings: Settings, device: torch.device) -> None:
    """Refuse, before anything loads, the options ``device`` cannot run: FP8 without compute
    capability 8.9 (or without torchao installed), an attention kernel it does not have.

    ``device`` is where the model will be loaded (``GENAUG_DEVICE``). A model handed in
    already loaded may live elsewhere: :func:`apply_speed` checks it on its UNet's own device
    (:func:`_device_of`, its parameters'), and the app skips this check for it.

    Raises :class:`SpeedError` (one line naming the device and the fix).
    """
    from .attention import choose_attention

    if settings.quantize == "fp8":
        from .quantize import check_fp8

        check_fp8(device)
    choose_attention(settings.attention, device)


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
        # {'compile': 'off', 'compile_mode': 'default', 'quantize': 'none',
        #  'attention': 'auto', 'channels_last': False, 'fuse_qkv': False,
        #  'vae_slicing': False, 'vae_tiling': False, 'attention_backend': 'default',
        #  'quantized_layers': 0, 'batch_sizes': [], 'compiled_shapes': []}
    """

    def __init__(
        self,
        applied: SpeedOptions,
        tracker: ShapeTracker,
        publish: Callable[[dict[str, Any]], object] | None = None,
        *,
        report: dict[str, Any] | None = None,
        batch_sizes: tuple[int, ...] = (),
    ) -> None:
        self.applied = applied
        self.tracker = tracker
        self.report = report or applied_report(None)
        self.batch_sizes = batch_sizes
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

        Raises :class:`SpeedError` (an option the model cannot take; fused projections or FP8
        with LoRA adapters, which they would bypass or break).
        """
        options = SpeedOptions.from_settings(settings)
        if options.fuse_qkv and settings.loras:
            raise SpeedError(
                "GENAUG_FUSE_QKV cannot be combined with GENAUG_LORAS: the fused "
                "query/key/value projections would bypass the adapters' LoRA layers; set "
                "GENAUG_FUSE_QKV=false"
            )
        if options.quantize != "none" and settings.loras:
            raise SpeedError(
                "GENAUG_QUANTIZE=fp8 cannot be combined with GENAUG_LORAS: LoRA layers cannot "
                "wrap torchao's float8 linear layers; set GENAUG_QUANTIZE=none"
            )
        pipeline = getattr(model, "pipeline", model)
        applied = apply_speed(pipeline, options)
        on_recompile = metrics.recompiles.inc if metrics is not None else None
        tracker = ShapeTracker(active=applied.compile != "off", on_recompile=on_recompile)
        sizes = batch_sizes(settings.max_batch_images) if applied.cuda_graphs else ()
        return cls(applied, tracker, publish, report=applied_report(pipeline), batch_sizes=sizes)

    def _publish(self) -> None:
        if self._publish_to is not None:
            self._publish_to(self.info())

    def wrap(self, worker: Worker) -> Worker:
        """``worker`` reporting each batch's shape (only needed with compilation on), and
        with CUDA graphs padding each batch to the next of :attr:`batch_sizes` (outermost, so
        the tracker sees the padded batch)."""
        if self.tracker.active:
            worker = TrackedWorker(worker, self.tracker)
        if self.batch_sizes:
            worker = PaddedWorker(worker, self.batch_sizes)
        return worker

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
        return {
            **self.applied.as_dict(),
            **self.report,
            "batch_sizes": list(self.batch_sizes),
            "compiled_shapes": self.tracker.compiled_shapes,
        }
