"""Services for the benchmarks: child processes on free loopback ports, thread pinning, recipes.

Thread pinning. torch uses every core by default. A benchmark that compares the service with
an in-process pipeline pins both to the same intra-op thread count: the service child gets
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in its environment (read by torch at start-up), the
bench process calls ``torch.set_num_threads``. The default is 1 thread, which leaves the other
core of a 2-core machine to the client and the event loops.

A child runs the real CLI (``python -m genaug.service``) unless it needs what the CLI has no
flag for (a truly batched tiny pipeline, a wrapped worker): then :mod:`bench.serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.harness import ROOT

T = TypeVar("T")

# -- torch ----------------------------------------------------------------------------------


def pin_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def child_env(threads: int) -> dict[str, str]:
    env = os.environ.copy()
    env.update(
        {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "GENAUG_LOG_LEVEL": "warning",
        }
    )
    # The child imports genaug (and bench, for bench.serve) from this checkout, wherever it
    # was started from and whether or not the package is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def tiny_model(*, batch_invariant: bool = True) -> Any:
    """The tiny model as the service loads it (torch threads untouched: see
    :func:`pin_threads`); ``batch_invariant=False`` swaps in a truly batched build of the same
    weights (load_model has no switch for it)."""
    import dataclasses

    from genaug.service.testing import load_tiny

    model = load_tiny(threads=None)
    if batch_invariant:
        return model
    from genaug.service.pipeline.tiny import build_tiny_pipeline

    pipeline = build_tiny_pipeline(batch_invariant=False)
    pipeline.set_progress_bar_config(disable=True)
    return dataclasses.replace(model, pipeline=pipeline)


# -- services -------------------------------------------------------------------------------


def settings_args(settings: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in settings.items():
        out += [
            "--" + name.replace("_", "-"),
            str(value).lower() if isinstance(value, bool) else str(value),
        ]
    return out


@contextlib.contextmanager
def start_child(
    *,
    threads: int,
    batch_invariant: bool = True,
    wrap: str | None = None,
    settings: dict[str, Any],
    log_path: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start one service child on a free loopback port (not yet ready); yield URL and process.

    The default pipeline runs through the real CLI (``python -m genaug.service``);
    ``batch_invariant=False`` (a truly batched tiny pipeline) or ``wrap`` (``"module:name"``,
    a function that wraps the worker) runs :mod:`bench.serve` instead: the same app.
    """
    from genaug.local_service import free_port, running_service

    port = free_port()
    entry: tuple[str, ...] = ("-m", "genaug.service")
    args = settings_args(settings)
    if not batch_invariant or wrap is not None:
        entry = ("-m", "bench.serve")
        args = ["--batch-invariant", str(batch_invariant).lower(), *args]
        if wrap is not None:
            args = ["--wrap", wrap, *args]
    with running_service(
        port, extra_args=args, env=child_env(threads), log_path=log_path, entry=entry
    ) as proc:
        yield f"http://127.0.0.1:{port}", proc


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the child at ``url`` answers ``/readyz`` (180 s; fails at once if it exits)."""
    from genaug.service.testing import wait_ready

    wait_ready(url, timeout=180.0, alive=lambda: proc.poll() is None, poll_s=0.1)


@contextlib.contextmanager
def service(
    *,
    threads: int,
    batch_invariant: bool = True,
    log_path: Path | None = None,
    **settings: Any,
) -> Iterator[str]:
    """A genaug service in a child process on a free loopback port; yields its URL once ready.

    ``batch_invariant=False`` serves a truly batched tiny pipeline (see :mod:`bench.serve`).
    """
    with start_child(
        threads=threads, batch_invariant=batch_invariant, settings=settings, log_path=log_path
    ) as (url, proc):
        wait_ready(url, proc)
        yield url


@contextlib.contextmanager
def services(specs: dict[str, dict[str, Any]], *, threads: int) -> Iterator[dict[str, str]]:
    """Several services at once (started in parallel); yields name -> URL. A spec holds
    settings, and optionally ``batch_invariant`` and ``wrap`` (see :func:`start_child`)."""
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        for name, spec in specs.items():
            spec = dict(spec)
            batch_invariant = spec.pop("batch_invariant", True)
            wrap = spec.pop("wrap", None)
            started[name] = stack.enter_context(
                start_child(
                    threads=threads, batch_invariant=batch_invariant, wrap=wrap, settings=spec
                )
            )
        # Every child is loading by now; wait for them together.
        for url, proc in started.values():
            wait_ready(url, proc)
        yield {name: url for name, (url, _) in started.items()}


# -- recipes -------------------------------------------------------------------------------


def write_recipe(
    folder: Path,
    *,
    name: str = "bench",
    labels: Sequence[str] = ("A", "B"),
    size: int = 64,
    steps: int = 4,
) -> Path:
    """A one-recipe file (JSON) with ``labels``, no negative prompt, ``size`` px output."""
    recipe = {
        "name": name,
        "description": "benchmark recipe",
        "height": size,
        "width": size,
        "output_height": size,
        "output_width": size,
        "steps": steps,
        "guidance": 5.0,
        "base_seed": 0,
        "labels": {
            label: {"prompts": [f"depth image of a wound, class {label}"]} for label in labels
        },
    }
    path = folder / "recipes.json"
    path.write_text(json.dumps({"recipes": [recipe]}))
    return path


def wait_generated(
    http: Any,
    url: str,
    name: str,
    total: int,
    timeout: float = 300.0,
    poll_s: float = 0.01,
    quiet_s: float = 0.0,
) -> tuple[float, dict[str, Any]]:
    """Poll ``GET /v1/recipes/{name}`` until ``totals.generated >= total``; return the
    ``perf_counter`` time it was first seen and the detail.

    ``quiet_s``: sleep that long before polling. Each poll costs the service some GIL time,
    which slows a CPU pipeline; sleeping through most of the expected duration and then
    polling often keeps both the disturbance and the timing error small.
    """
    from genaug.experiments.fewshot import poll_pool

    time.sleep(quiet_s)
    # per_label None: any label the judge stopped raises, it is generated no more
    detail = poll_pool(lambda: dict(http.get(f"{url}/v1/recipes/{name}").json()),
                       per_label=None, timeout=max(0.0, timeout - quiet_s), poll_s=poll_s,
                       filled=lambda detail: detail["totals"]["generated"] >= total)
    return time.perf_counter(), detail


# -- clients --------------------------------------------------------------------------------


async def saturate(
    client: Any, *, concurrency: int, requests: int, n: int, **options: Any
) -> float:
    """Send ``requests`` generate calls of ``n`` images from ``concurrency`` coroutines;
    return images per second from the first send to the last answer."""
    todo = list(range(requests))

    async def worker() -> None:
        while todo:
            i = todo.pop()
            result = await client.generate("depth image of a wound", n=n, seed=1000 * i, **options)
            assert len(result) == n

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests * n / (time.perf_counter() - started)


class Clients:
    """One :class:`~genaug.client.AsyncClient` per service and the event loop they run on, for
    a benchmark whose phases are plain functions (:func:`bench.harness.interleave` calls
    them); leaving the ``with`` block closes the clients, then the loop::

        with Clients(urls, timeout=120) as clients:
            rate = clients.saturate("a", concurrency=4, requests=12, n=8)
            clients.run(clients["b"].generate("a prompt"))
    """

    def __init__(self, urls: Mapping[str, str], **options: Any) -> None:
        from genaug.client import AsyncClient

        self.loop = asyncio.new_event_loop()
        self.clients = {name: AsyncClient(url, **options) for name, url in urls.items()}

    def __getitem__(self, name: str) -> Any:
        return self.clients[name]

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run to its end on the clients' loop."""
        return self.loop.run_until_complete(work)

    def saturate(self, name: str, **options: Any) -> float:
        """:func:`saturate` with the client of service ``name``: images per second."""
        return self.run(saturate(self.clients[name], **options))

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for client in self.clients.values():
                self.loop.run_until_complete(client.aclose())
        finally:
            self.loop.close()
