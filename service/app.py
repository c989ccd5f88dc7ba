"""The app factory and its lifespan: the one place that starts and stops things.

Start-up, in order:

1. ``create_app`` reads the recipes and builds the request models from the settings (their
   bounds are what ``/openapi.json`` serves). Nothing heavy is imported or loaded.
2. The lifespan checks what must fail loudly (the device exists, the dtype suits it, the model
   paths exist), opens the pool store, and the server answers: ``/healthz`` is 200,
   ``/readyz`` is 503.
3. In the background: load the model, start the batcher (its worker thread owns the
   pipeline), run one warm-up batch, then ``/readyz`` turns 200.

Shutdown reverses it: stop the batcher (pending requests get 503), close the store, release
the model. torch is imported only by step 3 (and by the device check of step 2), never by the
routes.

Example::

    app = create_app(Settings(device="cpu"))
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from genaug import __version__

from .api.fastpath import DirectSample
from .api.guard import GuardMiddleware
from .api.handlers import EXCEPTION_HANDLERS
from .api.openapi import build_openapi
from .api.router import router
from .api.state import AppState, ModelLoader, Startup, WorkerWrapper
from .batching.batcher import Batcher
from .batching.items import Worker
from .intake.schemas import build_api_models
from .jobs.fill_jobs import FillJobs
from .jobs.loop import JobLoop
from .jobs.webhooks import WebhookSender
from .metrics import Metrics
from .pipeline.acceleration import Acceleration, AccelerationError, check_acceleration_settings
from .pool.open import open_pool_store, replica_info
from .pool.pending import pending_by_recipe
from .pool.planner import PoolPlanner, pool_model_hash
from .pool.serving import PoolServing
from .pool.types import PoolError
from .recipes.load import check_recipes, load_recipes, long_prompts
from .settings import Settings
from .settings.notify_url import allowed_hosts

if TYPE_CHECKING:
    from .pipeline.load import LoadedModel
    from .pool.identity import PoolIdentity

log = logging.getLogger(__name__)

# Routes whose bodies are uploads (images), with their own size limit; JSON routes keep
# GENAUG_MAX_BODY_BYTES.
UPLOAD_ROUTES = ("/v1/variants",)


def create_app(
    settings: Settings | None = None,
    *,
    loader: ModelLoader | None = None,
    wrap_worker: WorkerWrapper | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """Build the service app. The model loads when the lifespan runs.

    ``loader`` replaces model loading (tests share one tiny model between apps);
    ``wrap_worker`` wraps the pipeline worker (tests inject faults); ``on_fatal`` is called
    when background loading fails (the CLI exits the process). Raises
    :class:`~genaug.service.recipes.spec.RecipeError` for an invalid recipes file.
    """
    from .pipeline.turbo_unet import served_turbo  # torch-free

    settings = settings or Settings()
    recipes = load_recipes(settings.recipes) if settings.recipes is not None else {}
    # The one turbo mode of this service: /v1/generate's, the pools' and auto's.
    turbo = served_turbo(settings)
    check_recipes(recipes, adapters=set(settings.loras), data_root=settings.data_root,
                  path=settings.recipes, turbo=turbo is not None)
    api = build_api_models(
        settings,
        recipes=recipes,
        adapters=tuple(settings.loras),
        defaults=settings.request_defaults(),
        turbo=turbo,
    )
    state = AppState(
        settings=settings,
        metrics=Metrics(),
        api=api,
        startup=Startup(loader=loader, wrap_worker=wrap_worker, on_fatal=on_fatal),
        recipes=recipes,
    )
    app = FastAPIOffline(
        title="genaug",
        version=__version__,
        description="Out-of-process generative augmentation: SDXL batches for training.",
        lifespan=lifespan,
    )
    state.webhook_hosts = allowed_hosts(settings.webhook_hosts)
    app.state.genaug = state
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
    # Our routes go first and directly into the app's table, not through include_router:
    # FastAPI matches an included router in an extra pass behind the docs routes, which costs
    # a pool sample a measurable share of its time. The hot routes lead (api/router.py).
    app.router.routes[:0] = router.routes
    app.add_middleware(DirectSample)  # added first: runs inside the guard
    app.add_middleware(
        GuardMiddleware,
        keys=[key.get_secret_value() for key in settings.api_keys],
        max_body_bytes=settings.max_body_bytes,
        upload_routes={path: settings.max_upload_bytes for path in UPLOAD_ROUTES},
        on_reject=lambda reason: state.metrics.rejections.labels(reason).inc(),
    )
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "X-Client-Id", "Content-Type"],
        )
    app.openapi = lambda: build_openapi(app, state)  # type: ignore[method-assign]
    return app


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, AppState]]:
    """Open what requests need, load the model in the background, and undo it all at exit."""
    state: AppState = app.state.genaug
    settings = state.settings
    # A model handed in by a loader (tests, the GPU bench) lives where it was built, maybe
    # not on GENAUG_DEVICE: Acceleration.setup checks the acceleration options on its UNet's device.
    state.device_info = check_startup(settings, acceleration=state.startup.loader is None)
    state.replica_info = replica_info(settings)
    if state.recipes:
        state.store = await asyncio.to_thread(open_pool_store, settings)
    _sample_device_memory(state)
    opening = _open_api(state) if settings.role == "api" else _load_and_warm(state)
    loading = asyncio.create_task(opening, name="genaug-load")
    watching = (asyncio.create_task(_watch_workers(state), name="genaug-workers")
                if state.store is not None else None)
    try:
        yield {"genaug": state}
    finally:
        state.ready = False
        state.stopping.set()  # a warm-up under way ends before its next shape
        for task in (loading, watching):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if state.forwarder is not None:
            await state.forwarder.close()
            state.forwarder = None
        if state.job_loop is not None:
            await state.job_loop.stop()
            state.job_loop = None
        if state.batcher is not None:
            await state.batcher.stop()
            state.batcher = None
        if state.store is not None:
            state.store.close()
            state.store = None
        if state.acceleration is not None:
            state.acceleration.close()
            state.acceleration = None
        state.pools = None
        state.fill_jobs = None
        state.model = None


def check_startup(settings: Settings, *, acceleration: bool = True) -> dict[str, str]:
    """Fail fast, before the server listens, on settings that can never work; return the
    device's name, type and dtype (nothing for the api role, which has no device and never
    imports torch). ``acceleration=False`` leaves the acceleration options to
    :meth:`Acceleration.setup`, which reads the loaded model's device.

    Raises :class:`~genaug.service.pipeline.load.ModelLoadError`.
    """
    if settings.role == "api":
        return {}
    from .pipeline.device import ModelLoadError, resolve_device, resolve_dtype

    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    try:  # FP8 and attention kernels the device lacks, torchao missing: one line each
        if acceleration:
            check_acceleration_settings(settings, device)
    except AccelerationError as exc:
        raise ModelLoadError(str(exc)) from exc
    for name, path in (
        ("GENAUG_MODEL", settings.model_path),
        ("GENAUG_UNET_WEIGHTS", settings.unet_weights),
        ("GENAUG_SINGLE_FILE_CONFIG", settings.single_file_config),
    ):
        if path is not None and not path.exists():
            raise ModelLoadError(f"{name}={path} does not exist; point it at a local path")
    return {"name": str(device), "type": device.type, "dtype": str(dtype).removeprefix("torch.")}


def default_loader(settings: Settings) -> LoadedModel:
    from .pipeline.load import load_model

    return load_model(
        source=settings.model,
        unet_weights=settings.unet_weights,
        device=settings.device,
        dtype=settings.dtype,
        single_file_config=settings.single_file_config,
    )


async def _load_and_warm(state: AppState) -> None:
    """Load the model, start the batcher and warm up; then report ready. Runs as a task."""
    from .pipeline import device as devices
    from .pipeline.turbo_unet import attach_turbo
    from .pipeline.worker import PipelineWorker

    settings = state.settings
    startup = state.startup
    load = startup.loader or default_loader
    try:
        model = await asyncio.to_thread(load, settings)
        threads = await asyncio.to_thread(
            devices.configure_threads, settings.torch_threads, model.device
        )
        state.device_info = {
            **devices.identity(model.device),
            "dtype": str(model.dtype).removeprefix("torch."),
            "torch_threads": threads,
        }
        state.model = model
        await asyncio.to_thread(_report_long_prompts, state, model)
        # Before the acceleration options: they compile and quantize the turbo UNet too.
        turbo = state.api.turbo
        await asyncio.to_thread(attach_turbo, model, turbo)
        acceleration = await asyncio.to_thread(Acceleration.setup, model, settings, state.metrics,
                                        lambda info: state.acceleration_info.update(info))
        state.acceleration = acceleration
        pipeline_worker = await asyncio.to_thread(  # loads GENAUG_LORAS: file reads
            PipelineWorker.from_settings, model, settings, state.metrics, turbo
        )
        worker: Worker = acceleration.wrap(
            startup.wrap_worker(pipeline_worker) if startup.wrap_worker else pipeline_worker
        )
        state.adapters_info = pipeline_worker.adapters.info()
        state.acceleration_info.update(scheduler=pipeline_worker.schedulers.describe(),
                                **pipeline_worker.adapters.swap_info())
        state.turbo_info = turbo.describe() if turbo is not None else None
        if state.store is not None:
            store = state.store
            # In a thread: it reads the recipes' label image folders and the judges' shots
            # (GENAUG_DATA_ROOT); the judges run on the generator's device.
            from .judge import build_judges

            state.pools = await asyncio.to_thread(
                lambda: PoolServing(PoolPlanner(
                    state.recipes,
                    store,
                    model_hash=pool_model_hash(model),
                    pregenerate=settings.pregenerate,
                    data_root=settings.data_root,
                    need_half_life_s=settings.need_half_life_s,
                    judges=build_judges(state.recipes, settings.data_root, model.device),
                    adapter_hashes={a["name"]: a["hash"] for a in state.adapters_info},
                    turbo=turbo,
                ))
            )
            state.fill_jobs = FillJobs(state.pools.planner)
            _sample_pending(state)
        batcher = Batcher(
            worker,
            max_batch_images=settings.max_batch_images,
            max_wait_ms=settings.max_wait_ms,
            max_queue_images=settings.max_queue_images,
            metrics=state.metrics,
            slice_ms=settings.slice_ms,
        )
        await batcher.start()
        state.batcher = batcher
        if settings.warmup:
            plan = acceleration.plan(settings, state.recipes.values(), defaults=state.defaults())
            started = time.monotonic()
            await batcher.run_in_worker(
                lambda: acceleration.warm_up(pipeline_worker, plan, stop=state.stopping))
            log.info("warm-up done in %.2f s", time.monotonic() - started)
        if state.pools is not None:
            # Only now: a pool batch before the warm-up would run an uncompiled shape first.
            # The planner wakes the batcher through this callback; it never holds it.
            state.pools.attach(wake=batcher.poke)
            batcher.idle_source = state.pools.planner
            batcher.poke()
            assert state.fill_jobs is not None  # made with the pools
            state.job_loop = _job_loop(state, state.fill_jobs)
        state.ready = True
        if state.pools is not None:
            await asyncio.to_thread(_announce, state, state.pools.planner.identity)
        log.info(
            "ready: %s model %s (weights %s) on %s as %s, %s torch threads",
            model.kind,
            model.source,
            model.weights_hash,
            model.device,
            state.device_info["dtype"],
            threads,
        )
    except Exception as exc:  # surfaced on /readyz and to on_fatal
        state.load_error = f"{type(exc).__name__}: {exc}"
        if is_refusal(exc):
            # A refusal's message says what is wrong and the fix: one line, no traceback;
            # `genaug serve` (on_fatal) says it itself.
            if startup.on_fatal is None:
                log.error("start-up refused: %s", exc)
        else:
            log.exception("loading the model failed")
        if startup.on_fatal is not None:
            startup.on_fatal(exc)


async def _open_api(state: AppState) -> None:
    """The api role: no model, no device, no torch. Ready at once (generation goes to the
    workers: :mod:`~genaug.service.api.forward`); the pools open as the newest worker that
    announced itself on the shared pool names them (:mod:`~genaug.service.pool.identity`),
    waited for while none has. Runs as a task."""
    from .api.forward import Forwarder
    from .pool.identity import PoolIdentity

    settings = state.settings
    state.forwarder = Forwarder(read_timeout_s=settings.max_timeout_s + 30.0)
    state.ready = True
    store = state.store
    assert store is not None  # the settings refuse the api role without recipes
    waited = False
    while True:
        try:
            row = await asyncio.to_thread(store.workers.newest)
        except PoolError as exc:
            log.warning("api: the pool database is unreachable (%s); trying again", exc)
            row = None
        if row is not None:
            break
        if not waited:
            log.info("api: no worker has announced itself on the pool yet; the recipes' "
                     "routes answer 503 until one does")
            waited = True
        await asyncio.sleep(_WORKERS_POLL_S)
    identity = PoolIdentity.from_dict(row.identity)
    served = {name: r for name, r in state.recipes.items() if name in identity.pool_ids}
    for name in sorted(set(state.recipes) - set(served)):
        log.warning("api: recipe %r is not one of worker %s's: it is not served here (give "
                    "the api and its workers the same GENAUG_RECIPES)", name, row.id)
    pools = PoolServing(PoolPlanner(
        served, store, model_hash=identity.model_hash, pregenerate=False,
        need_half_life_s=settings.need_half_life_s, turbo=state.api.turbo, identity=identity))
    pools.attach(wake=lambda: None)  # nothing to wake: the workers generate
    fill_jobs = FillJobs(pools.planner)
    fill_jobs.waiting = lambda: NO_WORKER_FILL if state.workers_alive == 0 else None
    state.pools, state.fill_jobs = pools, fill_jobs
    _sample_pending(state)
    state.job_loop = _job_loop(state, fill_jobs)
    log.info("api: serving the pools of worker %s (model %s): %s", row.id,
             identity.model_hash, ", ".join(sorted(served)) or "none")


#: What a queued fill job says while no worker runs (the api role).
NO_WORKER_FILL = ("no worker is running: the fill starts when one does (genaug serve --role "
                  "worker, or scale the workers up)")
#: How often the workers alive are read (the api's forwarding, genaug_workers_alive).
_WORKERS_POLL_S = 1.0


async def _watch_workers(state: AppState) -> None:
    """Read the workers alive on the pool every second: ``genaug_workers_alive``, a queued
    job's ``waiting``, and where the api forwards generation. Runs as a task."""
    store = state.store
    assert store is not None
    while True:
        try:
            alive = await asyncio.to_thread(store.workers.alive)
        except PoolError:  # an outage: the last figures stand; the pool says the rest
            alive = None
        if alive is not None:
            state.workers_alive = len(alive)
            state.metrics.workers_alive.set(len(alive))
            if state.forwarder is not None:
                state.forwarder.alive = alive
        await asyncio.sleep(_WORKERS_POLL_S)


def _announce(state: AppState, identity: PoolIdentity) -> None:
    """Announce this process on the pool as a worker: where it listens, its pools' names
    (an outage now is logged; the api then serves the newest worker it knows)."""
    settings = state.settings
    assert state.store is not None
    url = settings.advertise_url or advertised_url(settings.host, settings.port)
    worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        state.store.workers.announce(worker_id, url, settings.role, identity.as_dict())
    except PoolError as exc:
        log.warning("could not announce this worker on the pool (%s); an api sends it no "
                    "generation until the next start", exc)


def advertised_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` an api reaches this process at: this machine's name for a bind
    to every address (0.0.0.0, ::)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _report_long_prompts(state: AppState, model: LoadedModel) -> None:
    """Once, at start-up: each recipe prompt the text encoders would cut, with the fix."""
    from .pipeline.sampler import prompt_tokens

    if not state.recipes:
        return
    count, limit = prompt_tokens(model.pipeline)
    for line in long_prompts(state.recipes, count, limit, path=state.settings.recipes):
        log.warning("%s", line)


def is_refusal(exc: BaseException) -> bool:
    """True for the start-up errors whose one-line message names the fix (a model, an
    adapter, a turbo LoRA or a device that cannot be served); anything else is a bug worth a
    traceback."""
    from .pipeline.adapters import AdapterLoadError
    from .pipeline.device import ModelLoadError
    from .pipeline.turbo_lora import TurboLoraError

    return isinstance(exc, ModelLoadError | AdapterLoadError | AccelerationError | TurboLoraError)


def _job_loop(state: AppState, jobs: FillJobs) -> JobLoop:
    """Start following the pools' jobs; webhooks only where GENAUG_WEBHOOK_HOSTS allows some
    (the settings refused hosts without a secret)."""
    secret = state.settings.webhook_secret
    sender = (WebhookSender(secret.get_secret_value())
              if state.webhook_hosts and secret is not None else None)
    loop = JobLoop(jobs, sender)
    loop.start()
    if sender is not None:
        def sample() -> None:
            for what in ("delivered", "failed", "retries", "pending", "in_flight"):
                state.metrics.webhooks.labels(what).set(getattr(sender, what))

        state.metrics.on_render(sample)
    return loop


def _sample_pending(state: AppState) -> None:
    """At each scrape, every recipe's pending images (genaug.service.pool.pending) from the
    planner's last counts: no pool query on the scrape."""

    def sample() -> None:
        if state.pools is not None:
            planner = state.pools.planner
            # cached: the scrape is on the event loop, it never waits for the database
            stopped = lambda name: planner.stopped(name, cached=True)  # noqa: E731
            for name, pending in pending_by_recipe(planner.last_stats, stopped).items():
                state.metrics.pool_pending_images.labels(name).set(pending)

    state.metrics.on_render(sample)


def _sample_device_memory(state: AppState) -> None:
    if state.device_info.get("type") != "cuda":
        return
    import torch

    device = torch.device(state.device_info["name"])

    def sample() -> None:
        state.metrics.device_memory.labels("allocated").set(torch.cuda.memory_allocated(device))
        state.metrics.device_memory.labels("reserved").set(torch.cuda.memory_reserved(device))

    state.metrics.on_render(sample)
