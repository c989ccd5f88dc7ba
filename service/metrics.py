"""Prometheus metrics, one registry per app (no process-global collectors)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The service's counters, gauges and histograms.

    Example::

        metrics = Metrics()
        metrics.images_generated.inc(8)
        text = metrics.render()
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_images = Gauge(
            "genaug_queue_images", "Images waiting for the pipeline", registry=r
        )
        self.queue_requests = Gauge(
            "genaug_queue_requests", "Requests with images waiting", registry=r
        )
        self.batch_images = Histogram(
            "genaug_batch_images",
            "Images per pipeline call",
            ["source"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.images_generated = Counter(
            "genaug_images_generated", "Images generated", ["source"], registry=r
        )
        self.batch_seconds = Histogram(
            "genaug_batch_seconds", "Pipeline time per batch", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "genaug_queue_wait_seconds",
            "Time from admission to the start of the request's first batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_latency = Histogram(
            "genaug_request_latency_seconds",
            "Request latency by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "genaug_rejections", "Requests turned away, by reason", ["reason"], registry=r
        )
        self.dropped = Counter(
            "genaug_dropped_before_pipeline",
            "Requests dropped before any of their images reached the pipeline, by reason",
            ["reason"],
            registry=r,
        )
        self.dropped_in_pipeline = Counter(
            "genaug_dropped_in_pipeline",
            "Images cut from a batch in flight because their request was gone, by reason",
            ["reason"],
            registry=r,
        )
        self.steps_saved = Counter(
            "genaug_steps_saved",
            "Denoising steps not run, per image, because the image's request was gone",
            ["reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "genaug_preemptions",
            "Batches paused at a denoising step boundary for other work (interactive work "
            "over bulk, or a less-served client once the time slice was used)",
            registry=r,
        )
        self.paused_batches = Gauge(
            "genaug_paused_batches",
            "Batches paused at a denoising step boundary now, waiting to resume",
            registry=r,
        )
        self.batch_failures = Counter(
            "genaug_batch_failures", "Pipeline calls that failed", ["reason"], registry=r
        )
        self.nonfinite_images = Counter(
            "genaug_nonfinite_images", "Images with NaN/Inf caught before serving", registry=r
        )
        self.device_memory = Gauge(
            "genaug_device_memory_bytes",
            "CUDA memory of the pipeline's device",
            ["kind"],
            registry=r,
        )
        self.compiles = Counter(
            "genaug_compiles", "Graphs torch.compile compiled (or loaded from "
            "GENAUG_COMPILE_CACHE) during the warm-up", registry=r)
        self.recompiles = Counter(
            "genaug_recompiles", "Graphs torch.compile compiled after the warm-up (keep at 0: "
            "GENAUG_WARMUP_SHAPES warms a size before the service reports ready)", registry=r)
        # Read from the one pool every replica shares, so each reports the same figure:
        # aggregate across replicas with max, not sum (KEDA reads it in the database:
        # genaug.service.pool.pending).
        self.pool_pending_images = Gauge(
            "genaug_pool_pending_images",
            "Images a recipe's pool still owes what was asked (fill targets and jobs, in "
            "accepted images, labels the judge stopped left out), as the planner last read "
            "it; the same on every replica: aggregate with max",
            ["recipe"],
            registry=r,
        )
        self.workers_alive = Gauge(
            "genaug_workers_alive",
            "Workers alive on the shared pool (each process that loads the model announces "
            "itself; a lease without renewal ends it), as last read; the same on every "
            "replica: aggregate with max",
            registry=r,
        )
        self.webhooks = Gauge(
            "genaug_webhooks",
            "This replica's job webhooks: delivered, failed and retries since start, pending "
            "and in_flight now",
            ["what"],
            registry=r,
        )
        self._before_render: list[Callable[[], None]] = []

    def on_render(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` before each scrape (to sample gauges such as device memory)."""
        self._before_render.append(hook)

    def render(self) -> bytes:
        for hook in self._before_render:
            hook()
        return generate_latest(self.registry)
