"""Training step time with mixing and a live feeder vs. without mixing.

Same model, same data (the generated I/P/R demo set written as PNGs), same process and devices;
the genaug service (tiny pipeline, CPU) runs in a separate process with the wound-phase recipe.
Variant ``plain``: p=0, no feeder. Variant ``mixed``: p=0.5, reservoir mixed into every batch,
a feeder thread sampling the recipe's pool every ``--feeder-interval`` s. The variants alternate
for ``--rounds`` rounds (each a fresh ``fit`` of ``--epochs`` epochs) so that drift in the
machine's load hits both alike. Step and input-wait times come from the reference trainer's
:class:`~genaug.trainer.checks.instruments.StepTimer` (``next()`` on the distributed iterator, timed
in Python; the first step of each fit, which traces, is excluded).

    python -m bench.training.trainer_step                   # 1 replica (the CPU)
    python -m bench.training.trainer_step --cpu-replicas 2  # MirroredStrategy, 2 logical CPUs
    python -m bench.training.trainer_step --quick           # 1 round of 1 epoch, 64 per class

Goal: median(mixed) / median(plain) <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, main, make_parser

GOAL = 1.05
RECIPE = "wound-phases"
MARK = "GENAUG_BENCH "


def child(args: argparse.Namespace) -> None:
    """The TensorFlow side: both variants in one process, alternating."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    from genaug.trainer.reference.config import TrainConfig
    from genaug.trainer.reference.data import make_demo_dataset
    from genaug.trainer.reference.train import Trainer

    data = make_demo_dataset(Path(args.workdir) / "data", per_class=args.per_class, size=64)
    common: dict[str, Any] = dict(
        data=data,
        image_size=64,
        batch_size=args.batch_size,
        epochs=args.epochs,
        cpu_replicas=args.cpu_replicas,
        verbose=0,
        seed=0,
    )
    plain = Trainer(TrainConfig(**common, p=0.0))
    mixed = Trainer(
        TrainConfig(
            **common,
            service=args.url,
            recipe=RECIPE,
            p=0.5,
            slots_per_class=64,
            feeder_batch=32,
            feeder_interval_s=args.feeder_interval,
        )
    )
    # The mixing trainer first: it hides the service's GPU from TensorFlow, which only works
    # before TensorFlow has initialised (the plain one's prepare would do that).
    mixed.prepare()
    plain.prepare()
    mixed.fit()  # warm-up: fills the reservoir, and both steps are traced before timing
    plain.fit()
    rows: dict[str, dict[str, list[float]]] = {
        name: {"steps": [], "waits": []} for name in ("plain", "mixed")
    }
    fractions: list[float] = []
    for _ in range(args.rounds):
        for name, trainer in (("plain", plain), ("mixed", mixed)):
            start = len(trainer.timer.totals)
            if trainer.reservoir is not None:
                trainer.reservoir.reset_counters()
            trainer.fit()
            rows[name]["steps"] += trainer.timer.totals[start + 1 :]  # first step of a fit out
            rows[name]["waits"] += trainer.timer.waits[start + 1 :]
            if trainer.reservoir is not None:
                fractions.append(trainer.reservoir.mixed_fraction())
    out = {
        name: {
            "median_ms": 1000 * statistics.median(r["steps"]),
            "p90_ms": 1000 * statistics.quantiles(r["steps"], n=10)[-1],
            "wait_share": sum(r["waits"]) / sum(r["steps"]),
            "median_wait_ms": 1000 * statistics.median(r["waits"]),
            "steps": len(r["steps"]),
        }
        for name, r in rows.items()
    }
    out["mixed"]["mixed_fraction"] = statistics.mean(fractions)
    out["mixed"]["tracing"] = mixed.summary.tracing_counts
    out["plain"]["tracing"] = plain.summary.tracing_counts
    assert mixed.feeder is not None
    out["mixed"]["feeder_images"] = mixed.feeder.stats.images_received
    out["mixed"]["feeder_errors"] = mixed.feeder.stats.errors
    out["replicas"] = len(mixed.devices)
    mixed.close()
    plain.close()
    sys.stdout.write(MARK + json.dumps(out) + "\n")


def parent(args: argparse.Namespace) -> dict[str, Any]:
    """Start the service, run the TensorFlow child, print the table."""
    from genaug.experiments.demo import wait_for_pool
    from genaug.local_service import free_port, running_service

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        work = Path(tmp)
        # One torch thread: on a 2-core VM the service and the trainer share the CPU (with a
        # GPU the service has its own device). Capacity 96/label: pre-generation stops once
        # the pool is full, so what remains is the feeder's sampling traffic.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with running_service(
            port,
            extra_args=[
                "--recipes",
                str(ROOT / "recipes" / "wound_phases.yaml"),
                "--pool-path",
                str(work / "pool.db"),
                "--pool-capacity-per-label",
                "96",
            ],
            env=env,
            log_path=work / "service.log",
        ):
            from genaug.client import Client

            with Client(url) as client:
                client.wait_ready(timeout=180)
            t0 = time.monotonic()
            fill = wait_for_pool(url, RECIPE, 96, timeout=300)
            print(f"pool full ({fill}) after {time.monotonic() - t0:.0f} s; training ...")
            child_env = {
                **os.environ,
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "CUDA_VISIBLE_DEVICES": "",
                "TF_NUM_INTEROP_THREADS": "2",
                "TF_NUM_INTRAOP_THREADS": "2",
            }
            cmd = [
                sys.executable,
                "-m",
                "bench.training.trainer_step",
                "--child",
                "--url",
                url,
                "--workdir",
                str(work),
                "--rounds",
                str(args.rounds),
                "--epochs",
                str(args.epochs),
                "--per-class",
                str(args.per_class),
                "--batch-size",
                str(args.batch_size),
                "--feeder-interval",
                str(args.feeder_interval),
            ]
            if args.cpu_replicas:
                cmd += ["--cpu-replicas", str(args.cpu_replicas)]
            proc = subprocess.run(
                cmd, env=child_env, capture_output=True, text=True, timeout=900, cwd=ROOT
            )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise SystemExit(f"the training child failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    r = json.loads(lines[-1][len(MARK) :])
    p, m = r["plain"], r["mixed"]
    ratio = m["median_ms"] / p["median_ms"]
    print(
        f"\ntrainer step time, {r['replicas']} replica(s), global batch {args.batch_size}, "
        f"64x64, {platform.machine()} {os.cpu_count()} CPU(s), {time.strftime('%Y-%m-%d')}"
    )
    print(
        f"{'variant':<22}{'steps':>6}{'median ms':>11}{'p90 ms':>9}{'wait share':>12}"
        f"{'median wait ms':>16}"
    )
    for name, row in (("no mixing", p), ("mixing p=0.5 + feeder", m)):
        print(
            f"{name:<22}{row['steps']:>6}{row['median_ms']:>11.2f}{row['p90_ms']:>9.2f}"
            f"{100 * row['wait_share']:>11.1f}%{row['median_wait_ms']:>16.2f}"
        )
    print(f"ratio mixed/plain (median step): {ratio:.3f}  (goal <= {GOAL})")
    print(
        f"mixed fraction {m['mixed_fraction']:.3f}; feeder {m['feeder_images']} images, "
        f"{m['feeder_errors']} errors; tracing plain {p['tracing']} mixed {m['tracing']}"
    )
    return {"benchmark": "trainer_step", "replicas": r["replicas"],
            "batch_size": args.batch_size, "rounds": args.rounds, "epochs": args.epochs,
            "plain": p, "mixed": m, "ratio": ratio, "goal": GOAL, "met": ratio <= GOAL}


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--epochs", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--per-class", type=int, default=None, help="default 128 (quick 64)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cpu-replicas", type=int, default=None)
    parser.add_argument("--feeder-interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.per_class = args.per_class or (64 if args.quick else 128)
    if args.child:  # the TensorFlow side, in a process of its own: prints one MARK line
        child(args)
        return {}
    return finish(parent(args), args.json)


if __name__ == "__main__":
    main(run)
