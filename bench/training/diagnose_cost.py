"""What ``genaug.trainer.diagnose`` costs, and its false alarms on a clean pipeline.

Runs the ``cost`` and ``clean`` scenarios of ``tests/trainer/checks/_diagnose_child.py`` (one
TensorFlow interpreter, 4 logical CPU devices, the reference trainer with mixing):

* cost: ``diagnose`` with 20 steps against the same 20 steps run as ``fit`` runs them
  (Keras's traced ``train_function`` on the distributed dataset), alternating, ``--rounds``
  times, and one extra trace of the train step. Goal: diagnose <= 1.1 x the 20 steps + one
  trace.
* clean: ``diagnose`` ``--clean-runs`` times on the clean pipeline. Goal: no problem in any
  run (run it beside a CPU hog, ``python3 -c 'while True: pass' &``, for the issue's figure).

    python -m bench.training.diagnose_cost [--quick] [--rounds N] [--clean-runs N] [--json FILE]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from bench.harness import ROOT, finish, goal_text, main, make_parser, table

CHILD = ROOT / "tests" / "trainer" / "checks" / "_diagnose_child.py"
MARK = "GENAUG_RESULT "


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False)
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (quick 3)")
    parser.add_argument("--clean-runs", type=int, default=None, help="default 20 (quick 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    clean_runs = args.clean_runs or (3 if args.quick else 20)
    env = {**os.environ, "GENAUG_DIAGNOSE_COST_ROUNDS": str(rounds),
           "GENAUG_DIAGNOSE_CLEAN_RUNS": str(clean_runs), "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "tensorflow",
           "TF_NUM_INTEROP_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "2"}
    with tempfile.TemporaryDirectory(prefix="genaug-diagnose-") as tmp:
        proc = subprocess.run([sys.executable, str(CHILD), tmp, "cost", "clean"],
                              capture_output=True, text=True, env=env, cwd=CHILD.parent,
                              check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the diagnose child failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-4000:]}")
    out = json.loads(lines[-1][len(MARK):])
    cost, clean = out["cost"], out["clean"]
    med = statistics.median
    plain, diag, trace = med(cost["plain_s"]), med(cost["diagnose_s"]), med(cost["trace_s"])
    budget = 1.1 * plain + trace
    alarms = [codes for codes in clean["runs"] if codes]
    table(f"diagnose (20 steps) against 20 plain steps: medians of {rounds} alternating "
          f"rounds; {clean_runs} clean runs",
          ["measure", "value", "goal"],
          [["20 plain steps, s", plain, ""],
           ["diagnose, 20 steps, s", diag, ""],
           ["one trace of the train step, s", trace, ""],
           ["diagnose / plain", diag / plain, ""],
           ["diagnose - (1.1 x plain + one trace), s", diag - budget,
            f"<= 0: {goal_text(diag <= budget)}"],
           ["clean runs with a problem", f"{len(alarms)} of {len(clean['runs'])}",
            f"0: {goal_text(not alarms)}"]])
    return finish({"benchmark": "diagnose_cost", "plain_s": plain, "diagnose_s": diag,
                   "trace_s": trace, "ratio": diag / plain, "budget_s": budget,
                   "clean_runs": len(clean["runs"]), "false_alarms": alarms,
                   "met": diag <= budget and not alarms}, args.json)


if __name__ == "__main__":
    main(run)
