"""Applying the acceleration options to a loaded pipeline, and the lifespan's handle on them
(:class:`Acceleration`).

What each option does, and how options are written and refused, is
:mod:`~genaug.service.pipeline.acceleration_options` (:class:`AccelerationOptions`); this module
applies them to a loaded pipeline (:func:`apply_acceleration`) and holds the lifespan's handle;
compiling the UNet once for every batch size is :mod:`~genaug.service.pipeline.compiling`.

Life cycle (the app's lifespan is the one caller)::

    acceleration = Acceleration.setup(model, settings, metrics)  # after load, before the worker
    worker = acceleration.wrap(generator)     # counts batches of shapes not compiled
    ...                                       # start the batcher
    plan = acceleration.plan(settings, recipes.values(), defaults=(size, steps, guidance))
    await batcher.run_in_worker(lambda: acceleration.warm_up(generator, plan))  # before /readyz
    acceleration.info()  # {"compile": "regional", ..., "compiled_shapes": ["1024x1024:8"]}

Start-up checks the options that depend on the device before anything loads
(:func:`check_acceleration_settings`: FP8 on a device without it, torchao missing, a CUDA-only
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..batching.items import Worker
from .acceleration_options import AccelerationOptions
from .compile_cache import CompileCache, cache_fields, default_cache_dir
from .compiling import compile_counts, compile_unet, raise_recompile_limit
from .errors import AccelerationError
from .tracked import PaddedWorker, TrackedWorker
from .unet_package import Recorder, build_packages, load_packages, packaging_refusal
from .warmup import (
    ShapeTracker,
    WarmupProgress,
    WarmupRecord,
    WarmupStep,
    batch_sizes,
    run_warmup,
    warmup_plan,
)

if TYPE_CHECKING:
    import threading

    import torch

    from ..metrics import Metrics
    from ..settings import Settings
    from .load import LoadedModel

__all__ = [
    "Acceleration",
    "AccelerationError",
    "apply_acceleration",
    "check_acceleration_settings",
]

log = logging.getLogger(__name__)


def apply_acceleration(model: LoadedModel, options: AccelerationOptions) -> AccelerationOptions:
    """Apply ``options`` to a loaded model's pipeline (and its turbo UNet) in place; return
    what was applied, recorded in ``model.state`` with what it did.

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
        AccelerationError: an option this pipeline does not support, or different options already
            applied.
    """
    from .attention import apply_attention, choose_attention

    state = model.state
    pipeline: Any = model.pipeline  # diffusers' components are dynamic attributes
    device = _device_of(pipeline.unet)
    choice = choose_attention(options.attention, device)
    # What changes the pipeline's modules themselves, and is recorded in the model's state.
    structural = replace(options, attention="default")
    previous = state.acceleration
    if previous is not None and previous != structural:
        raise AccelerationError(
            f"this pipeline already has the acceleration options {previous.label} applied and "
            f"cannot take {structural.label} as well (fused weights, FP8 layers and compiled "
            "modules cannot be undone); load a fresh model"
        )
    apply_attention(choice)
    state.attention_backend = choice.backend
    if previous is not None or not structural.enabled:
        return options
    _apply_structural(model, structural, device)
    return options


def _apply_structural(model: LoadedModel, options: AccelerationOptions,
                      device: torch.device) -> None:
    import torch

    pipeline: Any = model.pipeline
    unet = pipeline.unet
    vae = pipeline.vae
    # The turbo UNet (GENAUG_TURBO_LORA: plain fused weights) takes every option the first does.
    unets = [u for u in (unet, model.state.turbo_unet) if u is not None]
    if options.fuse_qkv:
        for name, module in (*(("unet", u) for u in unets), ("vae", vae)):
            try:
                module.fuse_qkv_projections()
            except (ValueError, AttributeError, NotImplementedError) as exc:
                raise AccelerationError(
                    f"GENAUG_FUSE_QKV: the {name} ({type(module).__name__}) cannot fuse its "
                    f"attention projections: {exc}; set GENAUG_FUSE_QKV=false"
                ) from exc
    if options.channels_last:
        for module in (*unets, vae):
            module.to(memory_format=torch.channels_last)
    for flag, method, setting in (
        (options.vae_slicing, "enable_slicing", "GENAUG_VAE_SLICING"),
        (options.vae_tiling, "enable_tiling", "GENAUG_VAE_TILING"),
    ):
        if flag:
            try:
                getattr(vae, method)()
            except (AttributeError, NotImplementedError) as exc:
                raise AccelerationError(
                    f"{setting}: the VAE ({type(vae).__name__}) does not support it: {exc}; "
                    f"set {setting}=false"
                ) from exc
    if options.quantize != "none":
        from .quantize import check_fp8, quantize_fp8

        check_fp8(device)
        model.state.quantized_layers = len(
            quantize_fp8(unet, convs=options.quantize == "fp8-conv"))
        for other in unets[1:]:
            quantize_fp8(other, convs=options.quantize == "fp8-conv")
    if options.compile != "off":
        raise_recompile_limit()
        for module in unets:
            compile_unet(module, options)
    model.state.acceleration = options
    log.info("acceleration options applied: %s", options.label)


def applied_report(model: LoadedModel | None) -> dict[str, Any]:
    """What :func:`apply_acceleration` did to ``model`` (None: nothing): ``attention_backend``
    (the kernel chosen; ``default`` is torch's own order) and ``quantized_layers`` (FP8), as
    ``/v1/info`` shows."""
    from .load import ModelState  # torch: imported when a report is asked for

    state = model.state if model is not None else ModelState()
    return {"attention_backend": state.attention_backend,
            "quantized_layers": state.quantized_layers}


def _device_of(module: Any) -> torch.device:
    import torch

    for parameter in getattr(module, "parameters", list)():
        device: torch.device = parameter.device
        return device
    return torch.device("cpu")


def check_acceleration_settings(settings: Settings, device: torch.device) -> None:
    """Refuse, before anything loads, the options ``device`` cannot run: FP8 without compute
    capability 8.9 (or without torchao installed), an attention kernel it does not have.

    ``device`` is where the model will be loaded (``GENAUG_DEVICE``). A model handed in
    already loaded may live elsewhere: :func:`apply_acceleration` checks it on its UNet's own device
    (:func:`_device_of`, its parameters'), and the app skips this check for it.

    Raises :class:`AccelerationError` (one line naming the device and the fix).
    """
    from .attention import choose_attention

    if settings.quantize != "none":
        from .quantize import check_fp8

        check_fp8(device)
    choose_attention(settings.attention, device)


# -- the lifespan's handle ------------------------------------------------------------------


class Acceleration:
    """The acceleration options applied to one loaded model, its shape tracker, its compile cache
    and its warm-up.

    ``publish`` (optional) is called with :meth:`info` at set-up, as the warm-up goes, and
    whenever a shape is first run (in the worker thread): the app merges it into the
    ``acceleration`` group that ``GET /v1/info`` reads, next to the scheduler its owner reports.

    Example::

        acceleration = Acceleration.setup(model, settings, metrics)  # no-op when all are off
        worker = acceleration.wrap(generator)
        plan = acceleration.plan(settings, [], defaults=(64, 4, 5.0))
        records = acceleration.warm_up(generator, plan)
        acceleration.info()["warmup"]["text"]   # 'warmed up: 1 shape(s) in 0 s'
        acceleration.close()                    # at shutdown: the compile cache's folder
    """

    def __init__(
        self,
        applied: AccelerationOptions,
        tracker: ShapeTracker,
        publish: Callable[[dict[str, Any]], object] | None = None,
        *,
        report: dict[str, Any] | None = None,
        batch_sizes: tuple[int, ...] = (),
        cache_root: Path | None = None,
        weights_hash: str = "",
        device: Any = None,
        metrics: Metrics | None = None,
        packaged: Any = None,
        latent_scale: int = 8,
    ) -> None:
        self.applied = applied
        self.tracker = tracker
        self.report = report or applied_report(None)
        self.batch_sizes = batch_sizes
        self.warmup_records: list[WarmupRecord] = []
        self.progress: WarmupProgress | None = None
        self.cache: CompileCache | None = None
        self._cache_root = cache_root
        self._weights_hash = weights_hash
        self._device = device
        self._metrics = metrics
        self._publish_to = publish
        #: The UNet kept as AOTInductor packages in the compile cache (None: not packaged), and
        #: what became of its packages (``/v1/info``'s ``unet_package``).
        self._packaged = packaged
        self._latent_scale = latent_scale
        self.package_state = "not used" if packaged is None else "not loaded yet"
        tracker.on_new_shape = self._publish
        self._publish()

    @classmethod
    def setup(
        cls,
        model: LoadedModel,
        settings: Settings,
        metrics: Metrics | None = None,
        publish: Callable[[dict[str, Any]], object] | None = None,
    ) -> Acceleration:
        """Apply the settings' options to ``model``.

        Raises :class:`AccelerationError` (an option the model cannot take; fused projections or FP8
        with LoRA adapters, which they would bypass or break).
        """
        options = AccelerationOptions.from_settings(settings)
        if options.fuse_qkv and settings.loras:
            raise AccelerationError(
                "GENAUG_FUSE_QKV cannot be combined with GENAUG_LORAS: the fused "
                "query/key/value projections would bypass the adapters' LoRA layers; set "
                "GENAUG_FUSE_QKV=false"
            )
        if options.quantize != "none" and settings.loras:
            raise AccelerationError(
                f"GENAUG_QUANTIZE={options.quantize} cannot be combined with GENAUG_LORAS: LoRA "
                "layers cannot wrap float8 layers; set GENAUG_QUANTIZE=none"
            )
        applied = apply_acceleration(model, options)
        compiling = applied.compile != "off"
        tracker = ShapeTracker(
            active=compiling, graphs=lambda: compile_counts().graphs,
            on_recompile=metrics.recompiles.inc if metrics is not None else None)
        sizes = batch_sizes(settings.max_batch_images) if applied.cuda_graphs else ()
        root = compile_cache_root(settings.compile_cache) if compiling else None
        pipeline: Any = model.pipeline
        refusal = packaging_refusal(applied, adapters=bool(settings.loras),
                                    turbo=model.state.turbo_unet is not None)
        packaged = (pipeline.unet if settings.compile_package and root is not None
                    and refusal is None else None)
        acceleration = cls(applied, tracker, publish, report=applied_report(model),
                           batch_sizes=sizes, cache_root=root, weights_hash=model.weights_hash,
                           device=_device_of(pipeline.unet), metrics=metrics, packaged=packaged,
                           latent_scale=int(getattr(pipeline, "vae_scale_factor", 8)))
        if compiling and root is not None and settings.compile_package and refusal is not None:
            acceleration.package_state = f"not used: {refusal}"
        return acceleration

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

    def warm_up(self, worker: Worker, plan: Iterable[WarmupStep],
                stop: threading.Event | None = None) -> list[WarmupRecord]:
        """Run each planned batch on ``worker`` (the unwrapped generator), watchably
        (:attr:`progress`; see :func:`~genaug.service.pipeline.warmup.run_warmup`), with
        compilation on through the compile cache: its entry for this model, options, plan
        and device loaded first, and saved after a warm-up that compiled and was not stopped.
        Call it in the worker thread (``batcher.run_in_worker``)."""
        steps = list(plan)
        compiling = self.tracker.active
        if compiling and self._cache_root is not None and self.cache is None:
            self.cache = CompileCache(self._cache_root, cache_fields(
                weights_hash=self._weights_hash, options=self.applied.label,
                shapes=[f"{s.key.height}x{s.key.width}:{s.batch}" for s in steps],
                device=self._device))
            self.cache.open()
        recorder = self._open_packages(steps)
        before = compile_counts() if compiling else None
        records = run_warmup(
            worker, steps, self.tracker, counts=compile_counts if compiling else None,
            cached=self.cache is not None and self.cache.state == "hit",
            packaged=self.package_state.startswith("loaded"), progress=self._progressed,
            stop=stop)
        self.warmup_records.extend(records)
        if recorder is not None:
            recorder.remove()
        if before is not None:
            compiled = compile_counts().graphs - before.graphs
            if self._metrics is not None and compiled > 0:
                self._metrics.compiles.inc(compiled)
            stopped = stop is not None and stop.is_set()
            if recorder is not None and not stopped and self.cache is not None:
                assert self.cache.workdir is not None
                built = build_packages(self._packaged, recorder, self.cache.workdir)
                self.package_state = f"built {len(built)} for the next start"
            if self.cache is not None and not stopped:
                try:
                    self.cache.save()
                except OSError as exc:  # a full or read-only volume: serve, say it once
                    log.warning("compile cache %s: could not save (%s); the next start "
                                "compiles again", self.cache.entry, exc)
            self.tracker.settle()
        self._publish()
        return records

    def _open_packages(self, steps: list[WarmupStep]) -> Recorder | None:
        """Before the warm-up: the UNet served from the compile cache's packages when the
        entry holds one for each latent size of ``steps``; else a recorder of the calls to
        build them from (:mod:`~genaug.service.pipeline.unet_package`)."""
        cache = self.cache
        if self._packaged is None or cache is None or cache.workdir is None:
            return None
        scale = self._latent_scale
        sizes = [(s.key.height // scale, s.key.width // scale) for s in steps]
        if cache.state == "hit":
            self.package_state = load_packages(self._packaged, cache.workdir, sizes)
            log.info("UNet packages: %s", self.package_state)
            if self.package_state.startswith("loaded"):
                return None
        return Recorder.install(self._packaged)

    def _progressed(self, progress: WarmupProgress) -> None:
        self.progress = progress
        self._publish()

    def close(self) -> None:
        """Undo :meth:`warm_up`'s working folder (the compile cache's); the entry stays."""
        if self.cache is not None:
            self.cache.close()

    def info(self) -> dict[str, Any]:
        """The ``acceleration`` group of ``/v1/info`` (the scheduler is reported by its owner)."""
        return {
            **self.applied.as_dict(),
            **self.report,
            "batch_sizes": list(self.batch_sizes),
            "compiled_shapes": self.tracker.compiled_shapes,
            "warmup": None if self.progress is None else self.progress.as_dict(),
            "compile_cache": None if self.cache is None else self.cache.describe(),
            "unet_package": self.package_state,
            "recompiles": self.tracker.recompiles,
        }


def compile_cache_root(setting: str) -> Path | None:
    """``GENAUG_COMPILE_CACHE`` as a folder: empty is the user's cache folder, ``off`` none."""
    text = setting.strip()
    if text.lower() in ("off", "none", "false", "0"):
        return None
    return Path(text).expanduser() if text else default_cache_dir()
