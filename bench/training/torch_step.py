"""PyTorch training step time with mixing through genaug.torch vs. without mixing.

The demo's network and optimiser (:mod:`genaug.experiments.fewshot_torch`: the few-shot CNN,
its shifts and rotations, Adam) on the CPU in this process, global batch 32 of 64x64 digits;
the real images are the ``fewshot`` split's 300. Two ``DataLoader`` s of 2 persistent workers
over them: *plain* (the real images alone) and *mixed* (:class:`genaug.torch.MixedDataset`,
p=0.5, a :class:`genaug.torch.PoolDataset` of recipe ``digits``: each worker its own stream,
its feeder asking for 32 pool images every ``--feeder-interval`` s). The genaug service (the
``tiny-digits`` generator, 1 torch thread) runs in a separate process; its pool is filled (32
per digit) and every mixed worker's reservoir holds 16 images per digit before timing, so
what runs beside the steps is the streams' sampling. Both loaders start once and keep their
workers; the variants alternate for ``--rounds`` rounds (plain, mixed, mixed, plain, ...) of
``--steps`` steps, the first step of each round out. A step is the wait for its batch
(``next()`` on the loader) plus the train step on it; one model and optimiser serve both.

    python -m bench.training.torch_step            # 6 rounds of 100 steps (~1 min)
    python -m bench.training.torch_step --quick    # 2 rounds of 20 steps
    python -m bench.training.torch_step --feeder-interval 30   # the streams all but idle

Goal: median(mixed) / median(plain) <= 1.05.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import platform
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, interleave, main, make_parser, median, percentile, table

GOAL = 1.05
RECIPE = "digits"
P = 0.5
WORKERS = 2
BATCH = 32
POOL = 32  # images per digit in the pool
PREFILL = 16  # images per digit in every worker's reservoir before timing


def measure(url: str, args: Any) -> dict[str, Any]:
    """Both loaders, their rounds interleaved; per variant the step and wait times."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from genaug.digits import load_split
    from genaug.experiments.fewshot_torch import (
        Shots,
        build_cnn,
        make_optimizer,
        prefill_worker,
        to_tensor,
        train_step,
    )
    from genaug.torch import MixedDataset, PoolDataset

    images, labels = load_split("fewshot")
    length = (args.steps + 16) * BATCH * WORKERS  # a round never reaches the end
    shots = Shots(to_tensor(images), labels, seed=0, length=length)
    pool = PoolDataset(url, RECIPE, seed=0, trainer_id="bench-torch-step", batch=32,
                       interval_s=args.feeder_interval)
    mixed = MixedDataset(shots, pool, p=P, shuffle=False, seed=0)
    fills = multiprocessing.RawArray("i", WORKERS * 10)
    prefill = functools.partial(prefill_worker, want=PREFILL,
                                deadline=time.monotonic() + 120, classes=10, fills=fills)
    loaders = {
        "plain": DataLoader(shots, batch_size=BATCH, num_workers=WORKERS,
                            persistent_workers=True, drop_last=True),
        "mixed": DataLoader(mixed, batch_size=BATCH, num_workers=WORKERS,
                            persistent_workers=True, drop_last=True, worker_init_fn=prefill),
    }
    model = build_cnn(0)
    optimizer = make_optimizer(model, 2e-3)
    steps: dict[str, list[float]] = {name: [] for name in loaders}
    waits: dict[str, list[float]] = {name: [] for name in loaders}

    def one_round(name: str, count: int) -> float:
        """``count`` timed steps of one variant; the round's median step."""
        iterator = iter(loaders[name])
        times = []
        for i in range(count + 1):
            t0 = time.perf_counter()
            images, targets = next(iterator)
            t1 = time.perf_counter()
            train_step(model, optimizer, images, targets)
            if i:  # the first step of a round waits for the workers to resume
                waits[name].append(t1 - t0)
                times.append(time.perf_counter() - t0)
        steps[name] += times
        return median(times)

    one_round("plain", 10)  # warm-up: workers started, streams prefilled, nothing kept
    one_round("mixed", 10)
    least = np.asarray(fills[:]).reshape(WORKERS, 10).min(axis=0)
    for name in loaders:
        steps[name].clear()
        waits[name].clear()
    before = pool.stats()
    rounds = interleave(args.rounds, {name: functools.partial(one_round, name, args.steps)
                                      for name in loaders})
    after = pool.stats()
    delta = {k: after[k] - before[k] for k in after}
    out: dict[str, Any] = {
        name: {"median_ms": 1000 * median(steps[name]),
               "p90_ms": 1000 * percentile(steps[name], 90),
               "wait_share": sum(waits[name]) / sum(steps[name]),
               "median_wait_ms": 1000 * median(waits[name]), "steps": len(steps[name])}
        for name in ("plain", "mixed")
    }
    handed = delta["synthetic"] + delta["real"]
    out["mixed"].update(mixed_fraction=delta["synthetic"] / handed if handed else 0.0,
                        images_received=delta["received"], failures=delta["failures"],
                        prefilled_per_digit=int(least.min()))
    out["threads"] = torch.get_num_threads()
    # each round's ratio to its neighbour of the other variant (the order flips every round)
    out["round_ratios"] = [m / p for m, p in zip(rounds["mixed"], rounds["plain"], strict=True)]
    return out


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", quick="2 rounds of 20 steps")
    parser.add_argument("--rounds", type=int, default=None, help="default 6 (quick 2)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per round, default 100 (quick 20)")
    parser.add_argument("--feeder-interval", type=float, default=0.25,
                        help="pause between a stream's requests of 32 pool images, s (default "
                        "0.25, PoolDataset's own)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 6)
    args.steps = args.steps or (20 if args.quick else 100)

    from bench.services import pin_threads, service
    from genaug.experiments.demo import wait_for_pool

    pin_threads(args.threads)  # the trainer's intra-op threads, as the torch child's
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp, service(
            threads=args.threads, log_path=Path(tmp) / "service.log",
            recipes=ROOT / "recipes" / "digits.yaml", pool_path=Path(tmp) / "pool.db",
            pool_capacity_per_label=POOL) as url:
        t0 = time.monotonic()
        fill = wait_for_pool(url, RECIPE, POOL, timeout=600)
        print(f"pool full ({min(fill.values())}+ per digit) after {time.monotonic() - t0:.0f} s; "
              "training ...", flush=True)
        r = measure(url, args)
    p, m = r["plain"], r["mixed"]
    ratio = m["median_ms"] / p["median_ms"]
    table(f"PyTorch step time, the demo's CNN, batch {BATCH}, 64x64, DataLoader of {WORKERS} "
          f"workers, {r['threads']} torch thread(s), {platform.machine()} {os.cpu_count()} "
          f"CPU(s), {time.strftime('%Y-%m-%d')}",
          ["variant", "steps", "median ms", "p90 ms", "wait share", "median wait ms"],
          [[name, row["steps"], row["median_ms"], row["p90_ms"],
            f"{100 * row['wait_share']:.1f} %", row["median_wait_ms"]]
           for name, row in (("no mixing", p), (f"MixedDataset p={P} + live streams", m))])
    print(f"ratio mixed/plain (median step): {ratio:.3f}  (goal <= {GOAL}); per round "
          f"{' '.join(f'{x:.3f}' for x in r['round_ratios'])}")
    print(f"mixed fraction {m['mixed_fraction']:.3f}; {m['images_received']:.0f} pool images "
          f"received, {m['failures']:.0f} failed requests; every worker prefilled with "
          f"{m['prefilled_per_digit']}+ per digit")
    return finish({"benchmark": "torch_step", "rounds": args.rounds, "steps": args.steps,
                   "batch_size": BATCH, "workers": WORKERS, "p": P, **r, "ratio": ratio,
                   "goal": GOAL, "met": ratio <= GOAL,
                   "load_average": list(os.getloadavg())}, args.json)


if __name__ == "__main__":
    main(run)
