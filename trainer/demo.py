"""The full loop on the tiny default: service, pool, reservoir, MirroredStrategy training.

:func:`run_full_demo` starts ``genaug serve`` (the embedded tiny SDXL pipeline on the CPU) with
``recipes/wound_phases.yaml`` and a throw-away pool, waits until the pool holds a few images
per label, then runs ``genaug train`` in a *separate* process (TensorFlow only; torch is never
imported there) on a generated demo set of the same three classes, mixing synthetic images in
through the reservoir with a feeder sampling the recipe's pool. It prints the trainer's summary
and stops everything. About a minute on 2 CPU cores.

This module imports neither TensorFlow nor torch: both live in the child processes.

Example::

    from genaug.trainer.demo import run_full_demo
    raise SystemExit(run_full_demo(epochs=3))
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["DEMO_RECIPE", "default_recipes_path", "run_full_demo", "wait_for_pool"]

log = logging.getLogger(__name__)

DEMO_RECIPE = "wound-phases"
"""The recipe in ``recipes/wound_phases.yaml``; its labels I/P/R are the demo set's classes."""


def default_recipes_path() -> Path:
    """``recipes/wound_phases.yaml`` of the source checkout (next to ``trainer/``)."""
    return Path(__file__).resolve().parents[1] / "recipes" / "wound_phases.yaml"


def wait_for_pool(
    url: str, recipe: str, per_label: int, *, timeout: float = 120.0
) -> dict[str, int]:
    """Poll ``GET /v1/recipes/{recipe}`` until every label's pool fill reaches ``per_label``.

    Returns the last fill seen. Raises ``TimeoutError`` naming the fill after ``timeout`` s.
    """
    from genaug.client import Client
    from genaug.trainer.labels import recipe_description

    deadline = time.monotonic() + timeout
    fill: dict[str, int] = {}
    with Client(url, client_id="genaug-demo", timeout=10.0) as client:
        while True:
            labels, fill, _ = recipe_description(client.recipe(recipe))
            fill = {label: fill.get(label, 0) for label in labels}
            if labels and min(fill.values()) >= per_label:
                return fill
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"pool of recipe {recipe!r} at {url} holds {fill} after {timeout:.0f} s; "
                    f"wanted {per_label} per label (is pre-generation on? GENAUG_PREGENERATE)"
                )
            time.sleep(0.5)


def run_full_demo(
    *,
    port: int = 0,
    epochs: int = 8,
    per_class: int = 96,
    pool_per_label: int = 16,
    cpu_replicas: int = 2,
    p: float = 0.5,
    recipes: Path | None = None,
    workdir: Path | None = None,
    train_timeout_s: float = 300.0,
    grid_out: Path | None = None,
    train: bool = True,
) -> int:
    """Service + pool + training with mixing, then a summary; returns an exit code (0 ok).

    Args:
        port: service port (0: a free one).
        epochs: training epochs over ``3 * per_class`` generated images (global batch 32).
        per_class: demo images per class (``I``, ``P``, ``R``).
        pool_per_label: pool fill per label to wait for before training starts.
        cpu_replicas: logical CPU devices for ``MirroredStrategy`` in the trainer process.
        p: replacement probability.
        recipes: recipe file (default: the checkout's ``recipes/wound_phases.yaml``).
        workdir: where the pool database and the service log go (default: a temporary folder,
            removed afterwards).
        train_timeout_s: the trainer process is killed after this long.
        grid_out: also write a labelled grid PNG, generated through the client, here.
        train: False stops after the grid and the pool (no TensorFlow needed).
    """
    from genaug.client import Client, GenaugError
    from genaug.demo import free_port, running_service, write_grid

    recipes = recipes or default_recipes_path()
    if not recipes.is_file():
        print(f"genaug demo: recipe file {recipes} not found; pass recipes=PATH", file=sys.stderr)  # noqa: T201
        return 2
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.TemporaryDirectory(prefix="genaug-full-demo-") if workdir is None else None
    work = Path(tmp.name) if tmp is not None else Path(workdir or ".")
    work.mkdir(parents=True, exist_ok=True)
    service_log = work / "service.log"
    # On a small CPU the service and the trainer share cores: one thread for torch leaves the
    # rest to TensorFlow (a GPU deployment gives the service its own device instead).
    service_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    train_env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "KERAS_BACKEND": "tensorflow",
        "TF_NUM_INTEROP_THREADS": "2",
        "TF_NUM_INTRAOP_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    started = time.monotonic()
    try:
        print(f"[1/4] starting the genaug service (tiny SDXL pipeline, CPU) at {url}, recipes "  # noqa: T201
              f"{recipes.name}, pool {work / 'pool.db'}")
        with running_service(
            port,
            extra_args=["--recipes", str(recipes), "--pool-path", str(work / "pool.db"),
                        "--pool-capacity-per-label", str(max(4 * pool_per_label, 64))],
            env=service_env,
            log_path=service_log,
        ) as proc:
            try:
                with Client(url, client_id="genaug-demo") as client:
                    client.wait_ready(timeout=180)
                    if grid_out is not None:
                        print(f"[2/4] ready after {time.monotonic() - started:.1f} s; "  # noqa: T201
                              "generating a labelled grid through the client")
                        write_grid(client, grid_out)
                fill = wait_for_pool(url, DEMO_RECIPE, pool_per_label, timeout=180)
            except (GenaugError, TimeoutError) as exc:
                print(f"genaug demo: the service did not get ready: {exc} (log: {service_log})",  # noqa: T201
                      file=sys.stderr)
                return 1
            print(f"[3/4] after {time.monotonic() - started:.1f} s the pool of "  # noqa: T201
                  f"{DEMO_RECIPE!r} holds {fill} (filled while the service was idle)")
            if not train:
                return 0
            cmd = [
                sys.executable, "-m", "genaug.trainer.train",
                "--service", url, "--recipe", DEMO_RECIPE, "--p", str(p),
                "--epochs", str(epochs), "--demo-per-class", str(per_class),
                "--cpu-replicas", str(cpu_replicas), "--verbose", "2",
            ]
            print(f"[4/4] training in a separate TensorFlow process: {' '.join(cmd[1:])}")  # noqa: T201
            try:
                code = subprocess.run(cmd, env=train_env, timeout=train_timeout_s).returncode
            except subprocess.TimeoutExpired:
                print(f"genaug demo: training did not finish within {train_timeout_s:.0f} s",  # noqa: T201
                      file=sys.stderr)
                code = 1
        print(f"service stopped (exit code {proc.returncode}); whole demo "  # noqa: T201
              f"{time.monotonic() - started:.1f} s")
        return code
    finally:
        if tmp is not None:
            tmp.cleanup()
