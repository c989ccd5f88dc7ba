"""The full loop on the tiny model: service, grid, pool, training, stop.

``genaug demo``: the whole round trip on the embedded default, no GPU, no download. ``--out``
names the labelled grid PNG, ``--port`` the service's port (0: a free one), and ``--no-train``
stops after the grid and the pool (no TensorFlow needed: it waits for the recipe pool to fill
instead). ``--trainer torch`` trains the two runs in a PyTorch process instead
(:mod:`genaug.experiments.fewshot_torch`: the same network and settings, mixing through
:class:`genaug.torch.MixedDataset` in a ``DataLoader`` of 2 workers; no TensorFlow). Ctrl-C
stops the service and the training process, then ends in one line (exit status 130).

:func:`full_demo` starts ``genaug serve`` (the embedded ``tiny-digits`` generator on the
CPU) with ``recipes/digits.yaml`` and a throw-away pool, writes a labelled grid of generated
digits through the client, and lets the pool fill (to a fixed size: the mixing run starts
from the full pool, so its figure does not depend on how fast the pool filled) while a
*separate* TensorFlow process
(torch is never imported there) trains a small CNN twice on a 5-shot subset of scikit-learn's
digits (5 real images per class, :mod:`genaug.digits`): once on the real images alone, once
mixing pool images in through :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir` fed by a
:class:`~genaug.trainer.feeding.feeder.ReservoirFeeder`. It prints both test accuracies on the 500
held-out test digits and stops everything. About two minutes on 2 CPU cores.

The few-shot runs live in :mod:`genaug.experiments.fewshot`. The verdict under the two
accuracies (:func:`verdict`) sets this one run beside what ``genaug gain`` measured on these
digits over seeds, with its interval (:func:`measured`: the committed report
``docs/gain/digits/gain.json``). What mixing gains comes from the generator: it was trained on
the 997 images of the ``generator`` split, which the few-shot classifier never sees (as SDXL
saw far more images than any user's data set holds).

This module imports neither TensorFlow nor torch at import time (both live in the child
processes), nor numpy (``genaug demo --help`` stays light).

Example::

    from genaug.experiments.demo import full_demo
    raise SystemExit(full_demo(trainer="torch"))   # the default, "tensorflow": make demo's
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genaug.experiments.fewshot import TRAINERS, FewShotRun, PoolStoppedError, run_fewshot

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "GAIN_REPORT",
    "DEMO_RECIPE",
    "add_arguments",
    "default_recipes_path",
    "full_demo",
    "interrupted",
    "interrupted_note",
    "labelled_grid",
    "measured",
    "run",
    "verdict",
    "wait_for_pool",
    "write_digit_grid",
]

log = logging.getLogger(__name__)

DEMO_RECIPE = "digits"
"""The recipe in ``recipes/digits.yaml``; its labels ``0``..``9`` are the digit classes."""

PROTOCOL_LINE = (
    "protocol: today's, not the unseen-class one: the generator learned all 10 digit classes "
    "from 997 other real digits; genaug gain measures both with intervals (docs/gain.md)"
)
"""The one line the demo prints about what its two accuracies show."""

#: ``genaug gain``'s report on these digits (the README's example, committed): the
#: measurement the demo's one run is shown beside.
GAIN_REPORT = Path(__file__).resolve().parents[2] / "docs" / "gain" / "digits" / "gain.json"


def measured(k: int = 5, arm: str = "pool", report: Path = GAIN_REPORT) -> str:
    """What ``genaug gain`` measured for the demo's setting (``arm`` at ``k`` shots), as a
    clause with its interval; a plain note when the report is not there (an installed
    package without the docs)."""
    import json

    try:
        rows = json.loads(report.read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return "genaug gain measures it on your own images (docs/gain.md)"
    row = next((r for r in rows if r["arm"] == arm and r["k"] == k), None)
    if row is None:
        return "genaug gain measures it on your own images (docs/gain.md)"
    return (f"genaug gain measured {arm} {row['mean']:+.1f} points [{row['low']:+.1f}, "
            f"{row['high']:+.1f}] at k={k} over {row['seeds']} seeds on these digits: "
            f"{row['verdict']} (docs/gain/digits/gain.md)")


def verdict(real: float, mixed: float, *, pool_per_label: int, seed: int) -> str:
    """A plain sentence on this run's two accuracies, beside what ``genaug gain`` measured
    for the same setting, with its interval."""
    gain = 100 * (mixed - real)
    said = (f"mixing gained {gain:+.1f} points in this run" if gain > 0 else
            f"mixing did not beat real only in this run ({gain:+.1f} points)")
    return (f"{said} (one seed, {seed}; a fixed pool of {pool_per_label} images per digit); "
            f"{measured()}")


def default_recipes_path() -> Path:
    """``recipes/digits.yaml`` of the source checkout (beside ``genaug/``, two folders up)."""
    return Path(__file__).resolve().parents[2] / "recipes" / "digits.yaml"


def wait_for_pool(
    url: str, recipe: str, per_label: int, *, timeout: float = 120.0
) -> dict[str, int]:
    """Wait until every label of ``recipe``'s pool at ``url`` holds ``per_label`` images;
    return the fill per label. The demo's client around
    :func:`~genaug.experiments.fewshot.poll_pool`, which raises ``TimeoutError`` naming the
    fill after ``timeout`` s and :class:`~genaug.experiments.fewshot.PoolStoppedError` (with
    the judge's reason and fix) as soon as the judge stopped a label short of ``per_label``.
    """
    from genaug.client import Client
    from genaug.experiments.fewshot import poll_pool

    with Client(url, client_id="genaug-demo", timeout=10.0) as client:
        detail = poll_pool(lambda: client.recipe(recipe), per_label=per_label, timeout=timeout)
    return {label: int(detail["fill"].get(label, 0)) for label in detail["labels"]}


# ----------------------------------------------------------------------------- the demo


def labelled_grid(
    rows: dict[str, np.ndarray], *, columns: Sequence[str] | None = None, scale: int = 2
) -> bytes:
    """A PNG of one labelled rectangle: one row per entry of ``rows`` (its name on the left,
    then its images, uint8 ``[n, h, w, 3]``, shown ``scale`` times larger; a shorter row ends
    in blank cells), and ``columns`` (one name per column) above the columns.

    Raises ``ValueError`` when ``columns`` does not name every column.
    """
    from PIL import Image, ImageDraw

    cols = max(len(images) for images in rows.values())
    if columns is not None and len(columns) != cols:
        raise ValueError(f"columns names {len(columns)} columns; the rows have {cols}")
    first = next(iter(rows.values()))
    h, w = first.shape[1] * scale, first.shape[2] * scale
    margin, header = 72, 18 if columns is not None else 0
    canvas = Image.new("RGB", (margin + cols * (w + 4), header + len(rows) * (h + 4)), "white")
    draw = ImageDraw.Draw(canvas)
    for c, name in enumerate(columns or ()):
        draw.text((margin + c * (w + 4) + w // 2 - 3, 2), name, fill="black")
    for r, (label, images) in enumerate(rows.items()):
        y = header + r * (h + 4)
        draw.text((6, y + h // 2 - 6), label, fill="black")
        for c, image in enumerate(images):
            tile = Image.fromarray(image).resize((w, h), Image.Resampling.NEAREST)
            canvas.paste(tile, (margin + c * (w + 4), y))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return buf.getvalue()


def write_digit_grid(client: Any, out: Path, *, per_label: int = 4) -> None:
    """Save one labelled grid, a column per digit: ``per_label`` rows of images generated
    through ``client`` (the recipe's prompts, the service's default steps and guidance), then
    a row of real few-shot digits (one per class) and a row of an img2img variant of each
    (strength 0.5).

    All 20 calls go out at once from a thread pool (the sync client is thread-safe): the
    service batches them, and pool pre-generation, which only runs while nothing waits, does
    not slip in between one row and the next.
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from genaug.digits import PROMPTS, load_split, subset

    t0 = time.monotonic()
    images, labels = load_split("fewshot")
    real = images[subset(labels, 1, seed=0)]
    with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
        made = {label: pool.submit(client.generate, prompt, n=per_label, seed=1000 * int(label))
                for label, prompt in PROMPTS.items()}
        variants_made = [pool.submit(client.variants, real[d], PROMPTS[str(d)], strength=0.5,
                                     n_per_image=1, seed=d) for d in range(10)]
        generated = {label: f.result().images for label, f in made.items()}
        rows: dict[str, np.ndarray] = {
            f"generated {k + 1}": np.stack([generated[label][k] for label in PROMPTS])
            for k in range(per_label)
        }
        rows["real"] = real
        rows["variant"] = np.stack([f.result().images[0] for f in variants_made])
    out.write_bytes(labelled_grid(rows, columns=list(PROMPTS)))
    print(f"      wrote {out}: {len(PROMPTS)} digits x {per_label} images + a row of real "
          f"digits and their img2img variants in {time.monotonic() - t0:.1f} s")


def full_demo(
    *,
    port: int = 0,
    steps: int = 300,
    pool_per_label: int = 16,
    cpu_replicas: int = 2,
    p: float | None = None,
    seed: int = 0,
    recipes: Path | None = None,
    workdir: Path | None = None,
    train_timeout_s: float = 420.0,
    grid_out: Path | None = None,
    train: bool = True,
    trainer: str = "tensorflow",
) -> int:
    """Service + grid + pool + few-shot training with and without mixing; returns an exit
    code (0 ok).

    Args:
        port: service port (0: a free one).
        steps: training steps of each of the two few-shot runs (global batch 32).
        pool_per_label: pool images per digit, and the pool's capacity: the mixing run
            waits until every digit holds that many (and holds them all in its reservoir),
            so it always starts from the same full pool, however fast the pool filled.
        cpu_replicas: logical CPU devices for ``MirroredStrategy`` in the trainer process
            (TensorFlow; the PyTorch process trains the same global batch in one process).
        p: replacement probability of the mixing run (None: the mixing's default for 5
            real images per class, :func:`genaug.mixing.default_share`).
        seed: which 5-shot subset and initialisation.
        recipes: recipe file (default: the checkout's ``recipes/digits.yaml``).
        workdir: where the pool database and the service log go (default: a temporary
            folder, removed afterwards).
        train_timeout_s: the trainer process is killed after this long.
        grid_out: also write a labelled grid PNG, generated through the client, here.
        train: False stops after the grid and the pool (no TensorFlow needed).
        trainer: who trains the two runs: ``"tensorflow"`` or ``"torch"``
            (:attr:`~genaug.experiments.fewshot.FewShotRun.trainer`).
    """
    from genaug.client import Client, GenaugError
    from genaug.local_service import free_port, running_service
    from genaug.mixing import default_share

    p = round(default_share(5), 3) if p is None else p

    recipes = recipes or default_recipes_path()
    if not recipes.is_file():
        print(f"genaug demo: recipe file {recipes} not found; pass recipes=PATH", file=sys.stderr)
        return 2
    try:
        import sklearn  # noqa: F401  (the digits ship inside scikit-learn)
    except ImportError:
        print("genaug demo: needs scikit-learn for its real data (the handwritten digits "
              "that ship inside it): pip install scikit-learn, or 'genaug[dev]'",
              file=sys.stderr)
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
    service_env.pop("GENAUG_MODEL", None)  # the demo is about the embedded default
    started = time.monotonic()
    try:
        print(f"[1/4] starting the genaug service (tiny-digits generator, CPU) at {url}, "
              f"recipes {recipes.name}, pool {work / 'pool.db'}")
        with running_service(
            port,
            extra_args=["--recipes", str(recipes), "--pool-path", str(work / "pool.db"),
                        "--pool-capacity-per-label", str(pool_per_label)],
            env=service_env,
            log_path=service_log,
        ) as proc:
            try:
                with Client(url, client_id="genaug-demo") as client:
                    client.wait_ready(timeout=180)
                    if grid_out is not None:
                        print(f"[2/4] ready after {time.monotonic() - started:.1f} s; "
                              "generating a column of images per digit through the client")
                        write_digit_grid(client, grid_out)
                if not train:
                    fill = wait_for_pool(url, DEMO_RECIPE, pool_per_label, timeout=300)
                    print(f"[3/4] after {time.monotonic() - started:.1f} s the pool of "
                          f"{DEMO_RECIPE!r} holds {fill} (filled while the service was idle)")
                    return 0
            except PoolStoppedError as exc:  # the judge stopped a label: no wait fills it
                print(f"genaug demo: {exc}", file=sys.stderr)
                return 1
            except (GenaugError, TimeoutError) as exc:
                print(f"genaug demo: the service did not get ready: {exc} (log: {service_log})",
                      file=sys.stderr)
                return 1
            where = (f"{cpu_replicas} logical CPUs under MirroredStrategy, in a separate "
                     "TensorFlow process" if trainer == "tensorflow" else
                     "in a separate PyTorch process (genaug.torch's MixedDataset in a "
                     "DataLoader of 2 workers)")
            print(f"[3/4] training a small CNN on 5 real digits per class (few-shot split), "
                  f"{where}; the mixing run starts once the pool holds its fixed "
                  f"{pool_per_label} images per digit")
            base = FewShotRun(arm="real only", seed=seed, steps=steps,
                              cpu_replicas=cpu_replicas, trainer=trainer)
            mixed = FewShotRun(arm=f"with genaug p={p}", seed=seed, steps=steps,
                               cpu_replicas=cpu_replicas, service=url, recipe=DEMO_RECIPE, p=p,
                               slots_per_class=pool_per_label,
                               prefill_per_class=pool_per_label,
                               pool_per_label=pool_per_label, trainer=trainer)
            try:
                real, gen = run_fewshot([base, mixed], timeout_s=train_timeout_s)
            except RuntimeError as exc:
                print(f"genaug demo: {exc}", file=sys.stderr)
                return 1
        said = verdict(real["test_accuracy"], gen["test_accuracy"], seed=seed,
                       pool_per_label=pool_per_label)
        print(f"[4/4] test accuracy on the 500 held-out test digits:\n"
              f"      real only (5 per class, shifts/rotations)   {real['test_accuracy']:.3f}\n"
              f"      + genaug mixing (p={p}, pool of recipe {DEMO_RECIPE!r})  "
              f"{gen['test_accuracy']:.3f}   ({100 * gen['mixed_fraction']:.0f}% of "
              f"examples synthetic, {gen['feeder']} images fed)\n"
              f"      {said}\n"
              f"      {PROTOCOL_LINE}")
        print(f"service stopped (exit code {proc.returncode}); whole demo "
              f"{time.monotonic() - started:.1f} s")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from genaug.cli import port

    parser.add_argument("--out", default="genaug-demo.png", help="where to write the grid PNG")
    parser.add_argument("--port", type=port, default=0, help="port (0: a free one)")
    parser.add_argument("--no-train", action="store_true",
                        help="stop after the grid and the pool (no TensorFlow needed)")
    parser.add_argument("--trainer", choices=TRAINERS, default="tensorflow",
                        help="who trains the two few-shot runs: tensorflow (MirroredStrategy, "
                        "the default) or torch (genaug.torch, no TensorFlow)")


def run(args: argparse.Namespace) -> int:
    """``genaug demo``: :func:`full_demo` with the grid written to ``--out``."""
    return full_demo(port=args.port, grid_out=Path(args.out), train=not args.no_train,
                     trainer=args.trainer)


def interrupted(args: argparse.Namespace) -> str:
    return interrupted_note(Path(args.out))


def interrupted_note(grid_out: Path | None = None) -> str:
    """What an interrupted demo leaves, and what to run: the rest of its one line."""
    grid = f" ({grid_out} kept if it was written)" if grid_out is not None else ""
    return (f"its service and training processes are stopped, its temporary pool removed{grid}; "
            "run genaug demo again to start over")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.experiments.demo``: the demo (the same as ``genaug demo --out
    genaug-demo.png`` without the grid); Ctrl-C ends it in one line, exit status 130."""
    argparse.ArgumentParser(prog="python -m genaug.experiments.demo").parse_args(argv)
    try:
        return full_demo()
    except KeyboardInterrupt:  # full_demo's blocks stopped the children on the way out
        print(f"genaug demo: interrupted; {interrupted_note()}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
