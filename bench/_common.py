"""Shared pieces of the benchmarks: argument parsing, interleaved rounds, tables, services.

Every benchmark compares two or more things *in the same run, interleaved* (A, B, A, B, ...)
and reports ratios: the machine may be shared, so absolute times drift between runs while
the ratio of neighbouring measurements stays meaningful.

Thread pinning. torch uses every core by default. A benchmark that compares the service with
an in-process pipeline pins both to the same intra-op thread count: the service child gets
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in its environment (read by torch at start-up), the
bench process calls ``torch.set_num_threads``. The default is 1 thread, which leaves the other
core of a 2-core machine to the client and the event loops.

Run as a script, this module is also a service entry point for settings the CLI has no flag
for (``--batch-invariant false`` builds the tiny pipeline with true batching)::

    python bench/_common.py --port 8123 --batch-invariant false --max-batch-images 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_THREADS = 1


# -- arguments -----------------------------------------------------------------------------


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="CI-size run (< ~20 s)")
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="torch intra-op threads, service and in-process alike",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    return parser.parse_args(argv)


def finish(result: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=float))
    return result


# -- statistics and tables -------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return float(ordered[rank - 1])


def interleave(rounds: int, phases: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each phase once per round, alternating the order every round (A B, B A, A B...)
    so neither side always runs first after a pause; return each phase's values."""
    names = list(phases)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            out[name].append(phases[name]())
    return out


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (prints well in a terminal and pastes into the docs)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = [
        f"\n### {title}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def goal_text(met: bool) -> str:
    return "met" if met else "MISSED"


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
    # The bench may run from a checkout without the package on sys.path of the child.
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
def _child(
    *,
    threads: int,
    batch_invariant: bool,
    settings: dict[str, Any],
    log_path: Path | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start one service child on a free loopback port (not yet ready); yield URL and process.

    The default pipeline runs through the real CLI (``python -m genaug.service``);
    ``batch_invariant=False`` runs this module as the entry point instead (same app, a truly
    batched tiny pipeline).
    """
    from genaug.local_service import free_port, running_service

    port = free_port()
    entry: tuple[str, ...] = ("-m", "genaug.service")
    args = settings_args(settings)
    if not batch_invariant:
        entry = (str(Path(__file__).resolve()),)
        args = ["--batch-invariant", "false", *args]
    with running_service(
        port, extra_args=args, env=child_env(threads), log_path=log_path, entry=entry
    ) as proc:
        yield f"http://127.0.0.1:{port}", proc


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
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

    ``batch_invariant=False`` serves a truly batched tiny pipeline (see :func:`_serve_main`).
    """
    with _child(
        threads=threads, batch_invariant=batch_invariant, settings=settings, log_path=log_path
    ) as (url, proc):
        _wait_ready(url, proc)
        yield url


@contextlib.contextmanager
def services(specs: dict[str, dict[str, Any]], *, threads: int) -> Iterator[dict[str, str]]:
    """Several services at once (started in parallel); yields name -> URL."""
    with contextlib.ExitStack() as stack:
        started: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
        for name, spec in specs.items():
            spec = dict(spec)
            batch_invariant = spec.pop("batch_invariant", True)
            started[name] = stack.enter_context(
                _child(threads=threads, batch_invariant=batch_invariant, settings=spec)
            )
        # Every child is loading by now; wait for them together.
        for url, proc in started.values():
            _wait_ready(url, proc)
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
    deadline = time.monotonic() + timeout
    time.sleep(quiet_s)
    while True:
        detail = http.get(f"{url}/v1/recipes/{name}").json()
        if detail["totals"]["generated"] >= total:
            return time.perf_counter(), detail
        if time.monotonic() > deadline:
            raise RuntimeError(f"pool {name} reached {detail['totals']} of {total} in time")
        time.sleep(poll_s)


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


# -- entry point for services the CLI cannot configure --------------------------------------


def _serve_main(argv: Sequence[str]) -> int:
    """Serve in this process until SIGTERM or SIGINT (the parent's :func:`service` stops it)."""
    import threading

    from genaug.service.commands.serve import configure_logging
    from genaug.service.settings import Settings
    from genaug.service.testing import start_service

    parser = argparse.ArgumentParser(description="genaug service with a bench-only pipeline")
    parser.add_argument("--batch-invariant", choices=["true", "false"], default="true")
    known, rest = parser.parse_known_args(argv)
    overrides: dict[str, Any] = {}
    it = iter(rest)
    for flag in it:
        overrides[flag.removeprefix("--").replace("-", "_")] = next(it)
    settings = Settings(**overrides)
    configure_logging(settings.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    model = tiny_model(batch_invariant=known.batch_invariant == "true")
    with start_service(model, record=False, settings=settings, ready_timeout=180.0):
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(_serve_main(sys.argv[1:]))
