"""Ready in seconds: a compiled start with GENAUG_COMPILE_CACHE filled vs. a cold one.

Each round runs ``genaug serve --warm-only`` (the service's own load, acceleration options and
warm-up, then exit) twice, interleaved: *cold*, with an empty compile cache folder, and
*cached*, with the folder a cold start of the same round filled; each in a fresh ``TMPDIR``,
so torch's own caches are empty and only the entry travels. The figure is the wall time of
the whole command (process start, imports, model load, warm-up), as a replica that starts
pays it; the ratio cached/cold is the goal (<= 0.25 on the CPU, issue 47).

    python -m bench.service.warm_start                # the default model, GENAUG_COMPILE=unet
    python -m bench.service.warm_start --rounds 3 --compile regional
    python -m bench.service.warm_start --quick        # one round (CI-size)

The service runs the default model (tiny-digits) with the default warm-up plan of
``recipes/digits.yaml`` (its size at ``GENAUG_MAX_BATCH_IMAGES``) unless ``--shapes`` lists
``GENAUG_WARMUP_SHAPES``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, main, make_parser, median, table

GOAL = 0.25


def _start(cache: Path, work: Path, args: Any, name: str) -> tuple[float, str]:
    """One ``genaug serve --warm-only``: its wall time and what it printed last."""
    fresh = Path(tempfile.mkdtemp(prefix=f"tmp-{name}-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENAUG_", "TORCH"))}
    env.update(TMPDIR=str(fresh), GENAUG_COMPILE=args.compile, GENAUG_COMPILE_CACHE=str(cache),
               GENAUG_TORCH_THREADS=str(args.threads), GENAUG_RECIPES=str(args.recipes),
               GENAUG_POOL_PATH=str(fresh / "pool.db"), GENAUG_WARMUP_SHAPES=args.shapes,
               GENAUG_LOG_LEVEL="warning")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "genaug.cli", "serve", "--warm-only"],
                          env=env, capture_output=True, text=True, timeout=1800, cwd=fresh)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"warm_start: {name} start failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    shutil.rmtree(fresh, ignore_errors=True)
    return seconds, done.stdout.strip().splitlines()[-1]


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser((__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="cold/cached pairs")
    parser.add_argument("--compile", choices=("unet", "regional"), default="unet")
    parser.add_argument("--shapes", default="", help="GENAUG_WARMUP_SHAPES (default: none)")
    parser.add_argument("--recipes", type=Path, default=ROOT / "recipes" / "digits.yaml")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    cold: list[float] = []
    cached: list[float] = []
    said: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="genaug-warm-start-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            cache = work / f"cache-{i}"
            seconds, said["cold"] = _start(cache, work, args, "cold")
            cold.append(seconds)
            seconds, said["cached"] = _start(cache, work, args, "cached")
            cached.append(seconds)
            print(f"round {i + 1}: cold {cold[-1]:.1f} s, from the cache {cached[-1]:.1f} s",
                  flush=True)
    ratio = median(cached) / median(cold)
    print(table(f"genaug serve --warm-only, GENAUG_COMPILE={args.compile}, {rounds} round(s)",
                ["start", "median s", "min s", "max s"],
                [["cold (empty cache)", f"{median(cold):.1f}", f"{min(cold):.1f}",
                  f"{max(cold):.1f}"],
                 ["from the cache", f"{median(cached):.1f}", f"{min(cached):.1f}",
                  f"{max(cached):.1f}"],
                 ["cached / cold", f"{ratio:.3f}", "", f"goal <= {GOAL}"]]))
    print(f"cold said: {said['cold']}\ncached said: {said['cached']}")
    return finish({"benchmark": "warm_start", "compile": args.compile, "rounds": rounds,
                   "cold_s": cold, "cached_s": cached, "ratio": ratio,
                   "met": ratio <= GOAL, "said": said}, args.json)


if __name__ == "__main__":
    main(run)
