"""What the routes see: one :class:`AppState` per app, made by ``create_app``, filled by the
lifespan, read by every handler through ``request.state.genaug``.

A leaf of the service's import graph: the model, the pipeline worker and everything that
imports torch appear here only as types, so importing the routes never imports torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NotReadyError
from ..intake.schemas import ApiModels
from ..metrics import Metrics
from ..settings import Settings

if TYPE_CHECKING:
    from ..batching.batcher import Batcher
    from ..batching.items import Worker
    from ..jobs.fill_jobs import FillJobs
    from ..jobs.loop import JobLoop
    from ..pipeline.acceleration import Acceleration
    from ..pipeline.load import LoadedModel
    from ..pipeline.worker import PipelineWorker
    from ..pool.serving import PoolServing
    from ..pool.store import PoolStore
    from ..recipes.spec import Recipe
    from .forward import Forwarder

ModelLoader = Callable[[Settings], "LoadedModel"]
WorkerWrapper = Callable[["PipelineWorker"], "Worker"]  # tests wrap the worker to inject faults


@dataclass
class Startup:
    """How ``create_app`` was asked to start: hooks the lifespan uses (tests replace them)."""

    loader: ModelLoader | None = None
    wrap_worker: WorkerWrapper | None = None
    on_fatal: Callable[[BaseException], None] | None = None


@dataclass
class AppState:
    """Settings, metrics, request models and, once ready, the model, batcher and pools.

    The ``*_info`` dicts are what ``GET /v1/info`` reports for the device, the acceleration options,
    the LoRA adapters and the replica; each is filled by the part that knows it.
    """

    settings: Settings
    metrics: Metrics
    api: ApiModels
    startup: Startup = field(default_factory=Startup)
    recipes: dict[str, Recipe] = field(default_factory=dict)
    model: LoadedModel | None = None
    batcher: Batcher | None = None
    store: PoolStore | None = None
    pools: PoolServing | None = None
    device_info: dict[str, Any] = field(default_factory=dict)
    acceleration_info: dict[str, Any] = field(default_factory=dict)
    adapters_info: list[dict[str, Any]] = field(default_factory=list)
    replica_info: dict[str, Any] = field(default_factory=dict)
    #: ``speed: turbo``'s sampler as the worker serves it (None: no turbo here).
    turbo_info: dict[str, Any] | None = None
    ready: bool = False
    load_error: str | None = None
    #: The acceleration options applied, their warm-up (its progress) and compile cache.
    acceleration: Acceleration | None = None
    #: Set when the service stops: a warm-up under way ends before its next shape.
    stopping: threading.Event = field(default_factory=threading.Event)
    started_at: float = field(default_factory=time.time)
    #: GENAUG_WEBHOOK_HOSTS, parsed: the hosts a fill's notify_url may name.
    webhook_hosts: tuple[str, ...] = ()
    #: The pools' fill jobs: started, followed, cancelled (the routes) and moved on (the loop).
    fill_jobs: FillJobs | None = None
    #: Follows the pools' jobs and delivers their webhooks, once the pools are open.
    job_loop: JobLoop | None = None
    #: The api role's way to the workers (None in the roles that load the model).
    forwarder: Forwarder | None = None
    #: The workers alive in the shared pool, as last read (the app reads them every second).
    workers_alive: int | None = None

    def wake_jobs(self) -> None:
        """Look at the jobs soon (a fill started one, images were stored)."""
        if self.job_loop is not None:
            self.job_loop.poke()

    def defaults(self) -> tuple[int, int, float]:
        """(size, steps, guidance) used when a request leaves them out."""
        return self.api.defaults

    def require_batcher(self) -> Batcher:
        if self.load_error is not None:
            raise NotReadyError(f"the model failed to load: {self.load_error}")
        if not self.ready or self.batcher is None:
            raise NotReadyError(
                f"the service is {self.starting()}; retry shortly (GET /readyz turns 200 "
                "when ready)",
                retry_after_s=2,
            )
        return self.batcher

    def starting(self) -> str:
        """What a start is doing, for ``/readyz`` and the answers before it is ready:
        ``loading``, then ``warming 3 of 8: 1024x1024 batch 4 (41 s, compiling)``."""
        progress = (self.acceleration.progress if self.acceleration is not None
                    else None)
        if progress is not None and not progress.finished:
            return progress.text()
        return "loading"

    def require_pools(self) -> PoolServing:
        if self.settings.role != "api":
            self.require_batcher()
        if self.pools is None:
            if self.settings.role == "api":
                raise NotReadyError(
                    "no worker has opened the recipe pools yet: this api serves the pools of "
                    "the newest worker on GENAUG_POOL_URL; start one (genaug serve --role "
                    "worker)", retry_after_s=15)
            raise NotReadyError(
                "the recipe pools are not open yet; retry shortly", retry_after_s=2
            )
        return self.pools

    def require_fill_jobs(self) -> FillJobs:
        """The fill jobs of the pools (:class:`~genaug.service.jobs.fill_jobs.FillJobs`), once
        the pools are open (503 until then)."""
        self.require_pools()
        assert self.fill_jobs is not None  # made with the pools
        return self.fill_jobs
