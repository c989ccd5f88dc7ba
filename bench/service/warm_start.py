"""Ready in seconds: a compiled start from the UNet's AOTInductor package, and one from the
compile cache only, vs. a cold one.

Each round runs ``genaug serve --warm-only`` (the service's own load, acceleration options and
warm-up, then exit) four times, interleaved: *cold*, with an empty compile cache folder (it
compiles, builds the UNet's package and saves both); *cold, no package*, another empty folder
with ``GENAUG_COMPILE_PACKAGE=false`` (compiles and saves inductor's artifacts only: a cold
start as it was before packages); *packaged*, with the folder the first cold start filled (it
loads the package: nothing traced); *cached*, that folder with ``GENAUG_COMPILE_PACKAGE=false``
(inductor's artifacts only: dynamo traces again). Each runs
in a fresh ``TMPDIR``, so torch's own caches are empty and only the entry travels. The figure
is the wall time of the whole command (process start, imports, model load, warm-up), as a
worker that starts pays it. Goals: packaged / cold <= 0.15 (issue 59; against either cold
start), cached / cold <= 0.25 (issue 47).

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
GOAL_PACKAGED = 0.15


def _start(cache: Path, work: Path, args: Any, name: str,
           package: bool = True) -> tuple[float, str]:
    """One ``genaug serve --warm-only``: its wall time and what it printed last."""
    fresh = Path(tempfile.mkdtemp(prefix=f"tmp-{name}-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENAUG_", "TORCH"))}
    env.update(TMPDIR=str(fresh), GENAUG_COMPILE=args.compile, GENAUG_COMPILE_CACHE=str(cache),
               GENAUG_TORCH_THREADS=str(args.threads), GENAUG_RECIPES=str(args.recipes),
               GENAUG_POOL_PATH=str(fresh / "pool.db"), GENAUG_WARMUP_SHAPES=args.shapes,
               GENAUG_LOG_LEVEL="warning", GENAUG_COMPILE_PACKAGE=str(package).lower())
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
    parser.add_argument("--rounds", type=int, default=2, help="cold/packaged/cached rounds")
    parser.add_argument("--compile", choices=("unet", "regional"), default="unet")
    parser.add_argument("--shapes", default="", help="GENAUG_WARMUP_SHAPES (default: none)")
    parser.add_argument("--recipes", type=Path, default=ROOT / "recipes" / "digits.yaml")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    starts: dict[str, list[float]] = {"cold": [], "cold_plain": [], "packaged": [],
                                      "cached": []}
    said: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="genaug-warm-start-") as tmp:
        work = Path(tmp)
        for i in range(rounds):
            for name in starts:
                cache = work / (f"plain-{i}" if name == "cold_plain" else f"cache-{i}")
                seconds, said[name] = _start(cache, work, args, name,
                                             package=name in ("cold", "packaged"))
                starts[name].append(seconds)
            print(f"round {i + 1}: " + ", ".join(f"{name} {values[-1]:.1f} s"
                                                 for name, values in starts.items()),
                  flush=True)
    cold, plain = median(starts["cold"]), median(starts["cold_plain"])
    ratio = median(starts["cached"]) / plain
    packaged = median(starts["packaged"]) / cold
    packaged_plain = median(starts["packaged"]) / plain
    rows = [[label, f"{median(starts[name]):.1f}", f"{min(starts[name]):.1f}",
             f"{max(starts[name]):.1f}"]
            for name, label in (("cold", "cold (empty cache: compiles, builds the package)"),
                                ("cold_plain", "cold, no package (GENAUG_COMPILE_PACKAGE=false)"),
                                ("packaged", "from the UNet's package"),
                                ("cached", "from the compile cache only"))]
    print(table(f"genaug serve --warm-only, GENAUG_COMPILE={args.compile}, {rounds} round(s)",
                ["start", "median s", "min s", "max s"],
                [*rows,
                 ["packaged / cold", f"{packaged:.3f}", "", f"goal <= {GOAL_PACKAGED}"],
                 ["packaged / cold, no package", f"{packaged_plain:.3f}", "",
                  f"goal <= {GOAL_PACKAGED}"],
                 ["cached / cold, no package", f"{ratio:.3f}", "", f"goal <= {GOAL}"]]))
    print("\n".join(f"{name} said: {text}" for name, text in said.items()))
    return finish({"benchmark": "warm_start", "compile": args.compile, "rounds": rounds,
                   "cold_s": starts["cold"], "cold_plain_s": starts["cold_plain"],
                   "packaged_s": starts["packaged"], "cached_s": starts["cached"],
                   "ratio": ratio, "packaged_ratio": packaged,
                   "packaged_plain_ratio": packaged_plain,
                   "met": ratio <= GOAL and packaged_plain <= GOAL_PACKAGED, "said": said},
                  args.json)


if __name__ == "__main__":
    main(run)
