"""Run every service and pool benchmark in turn and print one summary table.

    python -m bench all                # = python -m bench.run_all: default sizes, minutes
    python -m bench all --quick        # CI-size runs
    python -m bench all --only pool_latency --json results.json

``make bench`` runs the first form. The others (TensorFlow, a revision to compare against,
a GPU) run alone: ``python -m bench --help`` lists them.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence
from typing import Any

from bench.harness import find, finish, main, make_parser, table

BENCHMARKS = (
    "service_throughput",
    "dynamic_batching",
    "mixed_guidance",
    "wire_overhead",
    "pool_latency",
    "pool_fill_rate",
    "need_fill_rate",
    "fair_share",
    "webhook_overhead",
)


def summary_row(name: str, result: dict[str, Any]) -> list[Any]:
    if name == "service_throughput":
        return [name, f"service/direct = {result['ratio']:.3f}", ">= 0.95", result["met"]]
    if name == "dynamic_batching":
        return [
            name,
            f"gain 16/1: per-image {result['gain_per-image']:.2f}, batched "
            f"{result['gain_batched']:.2f}",
            "(report)",
            "-",
        ]
    if name == "mixed_guidance":
        return [name, f"mixed/per-guidance = {result['ratio']:.2f}", ">= 1.5", result["met"]]
    if name == "wire_overhead":
        return [
            name,
            f"(body - header)/raw worst {result['worst_ratio']:.5f}",
            "<= 1.01",
            result["met"],
        ]
    if name == "pool_latency":
        return [
            name,
            f"p50 {result['http_p50_ms']:.2f} ms, p99 {result['http_p99_ms']:.2f} ms",
            "p50 < 5 ms, p99 < 20 ms",
            result["met"],
        ]
    if name == "pool_fill_rate":
        return [name, f"fill/direct = {result['ratio']:.3f}", ">= 0.95", result["met"]]
    if name == "need_fill_rate":
        ratios = ", ".join(f"{k} {v['ratio_need']:.1f}" for k, v in result["summary"].items())
        return [name, f"needed/others fill rate: {ratios}", ">= 3", result["met"]]
    if name == "fair_share":
        heavy = result["cost_shares"]["heavy"]
        return [
            name,
            f"heavy/light share {heavy:.2f}/{1 - heavy:.2f}, 10 ids/1 id {result['id_ratio']:.2f}",
            "0.4-0.6 each; 0.8-1.25",
            result["cost_goal_met"] and result["id_goal_met"],
        ]
    if name == "webhook_overhead":
        return [
            name,
            f"hanging webhooks/none = {result['ratio_shipped']:.3f} (stress "
            f"{result['ratio_stress']:.3f})",
            ">= 0.95",
            result["met"],
        ]
    return [name, "", "", ""]


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None)
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    results: dict[str, Any] = {}
    rows = []
    for name in names:
        print(f"\n== {name} ==", flush=True)
        started = time.monotonic()
        module = importlib.import_module(find(name).module)
        bench_argv = ["--threads", str(args.threads)] + (["--quick"] if args.quick else [])
        result = module.run(bench_argv)
        result["seconds"] = round(time.monotonic() - started, 1)
        results[name] = result
        rows.append([*summary_row(name, result), result["seconds"]])
    table("Summary", ["benchmark", "result", "goal", "met", "seconds"], rows)
    return finish(results, args.json)


if __name__ == "__main__":
    main(run)
