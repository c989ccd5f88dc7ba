"""Run a genaug service inside your process, for tests and benchmarks.

:func:`start_service` serves ``create_app`` under uvicorn in a daemon thread on 127.0.0.1
and returns once ``/readyz`` says 200. Every service started this way can share one model
(:func:`load_tiny` builds the embedded tiny pipeline on the CPU, no download), and the real
generator is wrapped in a :class:`GateWorker` that records each pipeline call and can hold
the next one, which is how a test fills the queue deterministically::

    from genaug.service.testing import load_tiny, start_service

    model = load_tiny()
    with start_service(model, max_batch_images=8) as live:
        live.worker.gate.clear()  # the next pipeline call waits here
        ...  # send requests; they queue behind the held call
        live.worker.gate.set()
        assert live.metric("genaug_queue_images") == 0

The deployed shape is a child process (``python -m genaug.service``, see
:func:`genaug.local_service.running_service`); :func:`wait_ready` waits for either kind. The service
itself never imports this module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .batching.items import Flight, Paused

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from .api.state import AppState
    from .batching.items import GroupKey, Item, Outcome, Worker
    from .pipeline.load import LoadedModel
    from .pipeline.worker import PipelineWorker
    from .settings import Settings

LOOPBACK = "127.0.0.1"


def load_tiny(threads: int | None = 1) -> LoadedModel:
    """The tiny SDXL pipeline with random weights (``tiny-random``) on the CPU.

    Fast and deterministic, with no learned behaviour for a test to depend on (the service's
    default, ``tiny-digits``, is the same architecture with trained weights).

    ``threads`` sets torch's intra-op thread count (one by default: tests share the machine
    with the client and the event loops); ``None`` leaves it alone.
    """
    import torch

    from .pipeline.load import load_model

    if threads is not None:
        torch.set_num_threads(threads)
    return load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")


class GateWorker:
    """Wraps the worker: records every pipeline call; clear ``gate`` to hold the next one.

    ``gate`` is set (open) by default. ``entered`` is set as soon as a call reaches the gate,
    so a test can clear the gate, send one request, wait on ``entered`` and know the worker
    is held; ``gate_timeout_s`` bounds the hold so a forgotten gate cannot hang a run::

        worker = live.worker
        worker.gate.clear()
        ...  # send a request, then:
        assert worker.entered.wait(10)
        worker.gate.set()
        assert worker.prompts == ["a prompt"]

    **Stepping on command.** With ``stepping`` on, the worker waits at every denoising step
    boundary (where it reads the batcher's :class:`~genaug.service.batching.items.Flight`)
    until the test allows it. Boundaries are counted over all calls, from one:
    :meth:`hold_at` lets the worker run until the given boundary, :meth:`step` lets it pass
    ``n`` more, :meth:`wait_boundary` waits until it has reached one, :meth:`stop_stepping`
    lets it run free. ``events`` records each call (``"run <first prompt> x<n>"``), pause
    (``"paused at <step>"``) and resume (``"resume <first prompt> x<n>"``)::

        worker.stepping = True
        ...  # send a bulk request
        worker.hold_at(3)
        worker.wait_boundary(3)   # two steps run, held before the third
        ...  # send an interactive one: the batcher asks a pause
        worker.stop_stepping()    # the bulk batch pauses there, the interactive one runs
    """

    def __init__(self, inner: Worker, *, gate_timeout_s: float = 60.0) -> None:
        self.inner = inner
        self.calls: list[tuple[GroupKey, list[Item]]] = []
        self.events: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.gate_timeout_s = gate_timeout_s
        self.stepping = False  # (set it off through stop_stepping() while the worker waits)
        self._allowed = 0  # step boundaries the worker may pass (counted from the first)
        self._boundaries = 0
        self._steps = threading.Condition()
        self._flight: Flight | None = None
        self._lock = threading.Lock()

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        self.entered.set()
        self.gate.wait(timeout=self.gate_timeout_s)
        with self._lock:
            self.calls.append((key, list(items)))
            self.events.append(f"run {items[0].prompt if items else ''} x{len(items)}")
        return self._watch(self.inner.run(key, items, self._stepped(flight)))

    @property
    def prompts(self) -> list[str]:
        """The prompt of every image the pipeline was called for, in call order."""
        with self._lock:
            return [item.prompt for _, items in self.calls for item in items]

    @property
    def boundaries(self) -> int:
        """Step boundaries the worker has reached so far, over all calls."""
        with self._steps:
            return self._boundaries

    def dropped(self) -> frozenset[int]:
        """Rows the batcher has dropped from the batch in flight (last flight seen)."""
        flight = self._flight
        return frozenset() if flight is None else flight.poll()[0]

    def step(self, n: int = 1) -> None:
        """Let the worker pass ``n`` more step boundaries (with ``stepping`` on)."""
        with self._steps:
            self._allowed += n
            self._steps.notify_all()

    def hold_at(self, count: int) -> None:
        """Let the worker pass boundaries until it reaches the ``count``-th in total (from
        the first call), and hold it there."""
        with self._steps:
            self._allowed = count - 1
            self._steps.notify_all()

    def stop_stepping(self) -> None:
        """Turn ``stepping`` off and release a worker waiting at a boundary."""
        with self._steps:
            self.stepping = False
            self._steps.notify_all()

    def wait_boundary(self, count: int, timeout: float = 30.0) -> None:
        """Wait until the worker has reached ``count`` step boundaries in total."""
        with self._steps:
            if not self._steps.wait_for(lambda: self._boundaries >= count, timeout):
                raise TimeoutError(
                    f"the worker reached {self._boundaries} step boundaries, not {count}"
                )

    def _boundary(self) -> None:
        with self._steps:
            self._boundaries += 1
            self._steps.notify_all()
            passes = lambda: not self.stepping or self._boundaries <= self._allowed  # noqa: E731
            if not self._steps.wait_for(passes, self.gate_timeout_s):
                raise TimeoutError("the test did not step the worker on")

    def _stepped(self, flight: Flight | None) -> Flight | None:
        if flight is None:
            return None
        self._flight = flight
        return _SteppedFlight(flight, self._boundary)

    def _watch(self, result: Outcome | Paused) -> Outcome | Paused:
        if isinstance(result, Paused):
            with self._lock:
                self.events.append(f"paused at {result.step}")
            resume = result.resume

            def resumed(flight: Flight | None) -> Outcome | Paused:
                with self._lock:
                    self.events.append(f"resume {result.items[0].prompt} x{len(result.items)}")
                return self._watch(resume(self._stepped(flight)))

            result.resume = resumed
        return result


class _SteppedFlight(Flight):
    """The batcher's flight, with the gate's step boundary before each read."""

    def __init__(self, outer: Flight, boundary: Callable[[], None]) -> None:
        super().__init__()
        self.outer = outer
        self.boundary = boundary

    def poll(self) -> tuple[frozenset[int], bool]:
        self.boundary()
        return self.outer.poll()


def wait_ready(
    url: str,
    *,
    timeout: float = 60.0,
    alive: Callable[[], bool] | None = None,
    poll_s: float = 0.05,
) -> None:
    """Poll ``url/readyz`` until it answers 200.

    ``alive`` says whether the server can still become ready (its thread runs, its process
    has not exited); when it turns false the wait ends at once. Raises ``RuntimeError``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"service at {url} stopped before it became ready")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"service at {url} did not become ready within {timeout:g} s")


def read_metric(
    url: str,
    name: str,
    labels: str = "",
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> float:
    """One sample from ``url/metrics``, e.g. ``read_metric(url,
    "genaug_dropped_before_pipeline_total", 'reason="disconnected"')``; 0 when absent."""
    text = httpx.get(url + "/metrics", headers=headers or {}, timeout=timeout).text
    target = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(target + " "):
            return float(line.split()[-1])
    return 0.0


@dataclass
class LiveService:
    """A service running in a thread of this process; made by :func:`start_service`.

    ``worker`` is the :class:`GateWorker` around the generator (``None`` with
    ``record=False``); ``state`` is the app's ``AppState`` (batcher, pools) for white-box
    assertions. ``stop()`` (or leaving the ``with`` block) shuts uvicorn down gracefully::

        with start_service(model, api_keys=["k"]) as live:
            httpx.get(live.url + "/v1/recipes", headers=live.headers())
    """

    url: str
    app: FastAPI
    worker: GateWorker | None
    settings: Settings
    state: AppState
    server: uvicorn.Server = field(repr=False)
    thread: threading.Thread = field(repr=False)

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header for the first configured API key; ``{}`` without keys."""
        keys = self.settings.api_keys
        return {"Authorization": f"Bearer {keys[0].get_secret_value()}"} if keys else {}

    def metric(self, name: str, labels: str = "") -> float:
        """One sample from ``/metrics`` (see :func:`read_metric`); 0 when absent."""
        return read_metric(self.url, name, labels, headers=self.headers())

    def clients(self) -> dict[str, dict[str, Any]]:
        """``GET /v1/clients`` by client identity: requests admitted, images queued ..."""
        r = httpx.get(self.url + "/v1/clients", headers=self.headers(), timeout=10)
        r.raise_for_status()
        return {c["client"]: c for c in r.json()["clients"]}

    def wait_until(
        self, condition: Callable[[], bool], *, timeout: float = 30.0, what: str = "condition"
    ) -> None:
        """Poll ``condition`` until it holds; ``TimeoutError`` naming ``what`` after
        ``timeout`` s. For tests that must wait for the service's state, never for a clock::

            live.wait_until(lambda: live.queued("b") == 4, what="b's images queued")
        """
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not happen within {timeout:g} s")
            time.sleep(0.01)

    def recipe(self, name: str = "shapes") -> dict[str, Any]:
        """``GET /v1/recipes/{name}``: its pool's fill, targets, totals, stops and jobs."""
        r = httpx.get(f"{self.url}/v1/recipes/{name}", headers=self.headers(), timeout=30)
        if r.status_code != 200:
            raise RuntimeError(f"GET /v1/recipes/{name} answered {r.status_code}: {r.text}")
        return dict(r.json())

    def wait_recipe(
        self, done: Callable[[dict[str, Any]], bool], *, name: str = "shapes",
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Poll :meth:`recipe` until ``done(detail)`` holds and return that detail;
        ``TimeoutError`` with the last one after ``timeout`` s. For a pool that fills (or
        stops) in the background::

            live.wait_recipe(lambda d: all(v >= 4 for v in d["fill"].values()))
        """
        deadline = time.monotonic() + timeout
        while not done(detail := self.recipe(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"recipe {name} did not get there within {timeout:g} s: "
                                   f"{detail}")
            time.sleep(0.1)  # each poll is a request the service answers beside its work
        return detail

    def queued(self, client: str | None = None) -> int:
        """Images waiting in the queue, for ``client`` or in all."""
        reports = self.clients()
        if client is not None:
            return int(reports.get(client, {}).get("queued_images", 0))
        return sum(int(c["queued_images"]) for c in reports.values())

    def admitted(self, client: str | None = None) -> int:
        """Requests admitted so far, by ``client`` or by all."""
        reports = self.clients()
        if client is not None:
            return int(reports.get(client, {}).get("requests", 0))
        return sum(int(c["requests"]) for c in reports.values())

    def stop(self) -> None:
        """Ask uvicorn to shut down (lifespan included) and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> LiveService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_service(
    model: LoadedModel,
    *,
    wrap: Callable[[PipelineWorker], Worker] | None = None,
    record: bool = True,
    settings: Settings | None = None,
    log_level: str = "warning",
    ready_timeout: float = 60.0,
    **settings_kwargs: Any,
) -> LiveService:
    """Serve ``create_app(Settings(**settings_kwargs))`` with ``model`` on 127.0.0.1.

    The port is a free one unless ``port=`` is given. ``wrap`` wraps the real generator
    (fault injection); with ``record`` a :class:`GateWorker` wraps the result. ``settings``
    replaces ``settings_kwargs`` when a test built its own (from the environment, say).
    ``log_level`` is uvicorn's. Returns once ``/readyz`` is 200; raises ``RuntimeError``
    (with the server stopped) when it is not within ``ready_timeout`` seconds.
    """
    import uvicorn

    from genaug.local_service import free_port

    from .app import create_app
    from .settings import Settings

    if settings is None:
        settings_kwargs.setdefault("port", free_port())
        # Request defaults follow the configured model: say which one ``model`` is.
        settings_kwargs.setdefault("model", model.source)
        settings = Settings(**settings_kwargs)
    elif settings_kwargs:
        raise TypeError(f"pass settings or settings fields, not both: {sorted(settings_kwargs)}")
    gate: list[GateWorker] = []

    def wrap_worker(generator: PipelineWorker) -> Worker:
        inner: Worker = wrap(generator) if wrap else generator
        if not record:
            return inner
        gate.append(GateWorker(inner))
        return gate[0]

    app = create_app(settings, loader=lambda _s: model, wrap_worker=wrap_worker)
    config = uvicorn.Config(
        app, host=LOOPBACK, port=settings.port, log_level=log_level, access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{settings.port}", daemon=True)
    thread.start()
    url = f"http://{LOOPBACK}:{settings.port}"
    try:
        wait_ready(url, timeout=ready_timeout, alive=thread.is_alive)
    except BaseException:
        server.should_exit = True
        thread.join(timeout=30)
        raise
    state: AppState = app.state.genaug
    return LiveService(url, app, gate[0] if gate else None, settings, state, server, thread)


def make_lora(folder: Path, name: str, seed: int, *, rank: int = 4) -> Path:
    """Write ``folder/name.safetensors``: a LoRA (diffusers format) for the tiny UNet's
    attention projections, with random non-zero weights from ``seed``."""
    import torch
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils import convert_state_dict_to_diffusers  # type: ignore[attr-defined]
    from peft import LoraConfig, get_peft_model_state_dict

    from .pipeline.tiny import build_tiny_pipeline

    unet: Any = build_tiny_pipeline(batch_invariant=False).unet  # type: ignore[attr-defined]
    unet.add_adapter(LoraConfig(r=rank, lora_alpha=rank,
                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param_name, param in unet.named_parameters():
            if "lora_B" in param_name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    layers = convert_state_dict_to_diffusers(  # type: ignore[no-untyped-call]
        get_peft_model_state_dict(unet)
    )
    StableDiffusionXLPipeline.save_lora_weights(
        str(folder), unet_lora_layers=layers, weight_name=f"{name}.safetensors"
    )
    return folder / f"{name}.safetensors"
