"""The app factory and its lifespan: the one place that starts and stops things.

Start-up, in order:

1. Checks that are cheap and must fail start-up loudly: the device exists, the dtype suits
   it, the model paths exist. A wrong ``GENAUG_DEVICE`` stops the process with the reason;
   nothing falls back silently.
2. The server starts answering: ``/healthz`` is 200, ``/readyz`` is 503.
3. In the background: load the model, start the batcher (its worker thread owns the
   pipeline), run one warm-up batch, then ``/readyz`` turns 200.

Shutdown reverses it: stop the batcher (pending requests get 503), release the model.

Example::

    app = create_app(Settings(device="cpu"))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from genaug import __version__

from .batcher import Batcher
from .errors import NotReadyError
from .metrics import Metrics
from .model import LoadedModel, ModelLoadError, load_model, resolve_device, resolve_dtype
from .pool import PoolStore, open_pool_store
from .pregen import PoolManager, pool_model_hash
from .recipes import Recipe, load_recipes
from .settings import Settings
from .work import GroupKey, Worker

if TYPE_CHECKING:
    from .generator import PipelineWorker

log = logging.getLogger(__name__)

ModelLoader = Callable[[Settings], LoadedModel]
WorkerWrapper = Callable[["PipelineWorker"], Worker]  # tests wrap the generator to inject faults


def default_loader(settings: Settings) -> LoadedModel:
    return load_model(
        source=settings.model,
        unet_weights=settings.unet_weights,
        device=settings.device,
        dtype=settings.dtype,
        single_file_config=settings.single_file_config,
    )


@dataclass
class AppState:
    """What the routes see: settings, metrics, and, once ready, the model and batcher."""

    settings: Settings
    metrics: Metrics
    device: str = ""
    dtype: str = ""
    model: LoadedModel | None = None
    batcher: Batcher | None = None
    recipes: dict[str, Recipe] = field(default_factory=dict)
    store: PoolStore | None = None
    pools: PoolManager | None = None
    ready: bool = False
    load_error: str | None = None
    started_at: float = field(default_factory=time.time)

    @property
    def tiny(self) -> bool:
        return self.settings.model is None

    def defaults(self) -> tuple[int, int, float]:
        return self.settings.request_defaults(tiny=self.tiny)

    def require_batcher(self) -> Batcher:
        if self.load_error is not None:
            raise NotReadyError(f"the model failed to load: {self.load_error}")
        if not self.ready or self.batcher is None:
            raise NotReadyError(
                "the model is loading or warming up; retry shortly (GET /readyz turns 200 "
                "when ready)",
                headers={"Retry-After": "2"},
            )
        return self.batcher

    def require_pools(self) -> PoolManager:
        self.require_batcher()
        if self.pools is None:
            raise NotReadyError("the recipe pools are not open yet; retry shortly")
        return self.pools


def _check_startup(settings: Settings) -> tuple[str, str]:
    """Fail fast, before the server listens, on settings that can never work.

    Raises :class:`ModelLoadError` or :class:`~genaug.service.recipes.RecipeError`.
    """
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    for name, path in (
        ("GENAUG_MODEL", settings.model),
        ("GENAUG_UNET_WEIGHTS", settings.unet_weights),
        ("GENAUG_SINGLE_FILE_CONFIG", settings.single_file_config),
    ):
        if path is not None and not path.exists():
            raise ModelLoadError(f"{name}={path} does not exist; point it at a local path")
    return str(device), str(dtype).removeprefix("torch.")


def create_app(
    settings: Settings | None = None,
    *,
    loader: ModelLoader | None = None,
    wrap_worker: WorkerWrapper | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """Build the service app. Nothing is loaded until the lifespan runs.

    ``loader`` replaces model loading (tests share one tiny model between apps);
    ``wrap_worker`` wraps the real generator (tests inject faults); ``on_fatal`` is called
    when background loading fails (the CLI exits the process).
    """
    settings = settings or Settings()
    state = AppState(settings=settings, metrics=Metrics())
    load = loader or default_loader

    async def load_and_warm() -> None:
        from .generator import PipelineWorker

        try:
            model = await asyncio.to_thread(load, settings)
            state.model = model
            generator = PipelineWorker(model, state.metrics)
            worker: Worker = wrap_worker(generator) if wrap_worker else generator
            if state.store is not None:
                # In a thread: it reads the recipes' label image folders (GENAUG_DATA_ROOT).
                state.pools = await asyncio.to_thread(
                    lambda: PoolManager(
                        state.recipes,
                        state.store,  # type: ignore[arg-type]
                        model_hash=pool_model_hash(model),
                        pregenerate=settings.pregenerate,
                        data_root=settings.data_root,
                    )
                )
            batcher = Batcher(
                worker,
                max_batch_images=settings.max_batch_images,
                max_wait_ms=settings.max_wait_ms,
                max_queue_images=settings.max_queue_images,
                metrics=state.metrics,
                idle_source=state.pools,
            )
            if state.pools is not None:
                state.pools.attach(batcher)
            await batcher.start()
            state.batcher = batcher
            if settings.warmup:
                size, steps, guidance = state.defaults()
                key = GroupKey(height=size, width=size, steps=steps)
                started = time.monotonic()
                await batcher.run_in_worker(lambda: generator.warmup(key, guidance))
                log.info("warm-up done in %.2f s", time.monotonic() - started)
            state.ready = True
            log.info(
                "ready: %s model %s (weights %s) on %s/%s",
                model.kind,
                model.source,
                model.weights_hash,
                state.device,
                state.dtype,
            )
        except Exception as exc:  # surfaced on /readyz and to on_fatal
            state.load_error = f"{type(exc).__name__}: {exc}"
            log.exception("loading the model failed")
            if on_fatal is not None:
                on_fatal(exc)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, AppState]]:
        state.device, state.dtype = _check_startup(settings)
        if settings.recipes is not None:
            state.recipes = load_recipes(settings.recipes)
            state.store = await asyncio.to_thread(open_pool_store, settings)
        _sample_device_memory(state)
        loading = asyncio.create_task(load_and_warm(), name="genaug-load")
        try:
            yield {"genaug": state}
        finally:
            state.ready = False
            loading.cancel()
            try:
                await loading
            except asyncio.CancelledError:
                pass
            if state.batcher is not None:
                await state.batcher.stop()
                state.batcher = None
            if state.store is not None:
                state.store.close()
                state.store = None
            state.pools = None
            state.model = None

    app = FastAPIOffline(
        title="genaug",
        version=__version__,
        description="Out-of-process generative augmentation: SDXL batches for training.",
        lifespan=lifespan,
    )
    from .api import install

    install(app, state)
    return app


def _sample_device_memory(state: AppState) -> None:
    if not state.device.startswith("cuda"):
        return
    import torch

    device = torch.device(state.device)

    def sample() -> None:
        state.metrics.device_memory.labels("allocated").set(torch.cuda.memory_allocated(device))
        state.metrics.device_memory.labels("reserved").set(torch.cuda.memory_reserved(device))

    state.metrics.on_render(sample)
