"""Feedback steers the pool: how much faster a needed label fills than the others.

One service in this process (:func:`genaug.service.testing.start_service`, the tiny
random-weight pipeline on the CPU, uvicorn on 127.0.0.1), ``pregenerate=false`` so a pool
grows only when asked. For each of two recipes (``shapes``: 3 labels; ``digits``: 10 labels;
32x32, 2 steps, batches of 8) and each arm, a fresh pool is filled to ``per_label`` images
per label with ``POST /v1/recipes/{name}/fill``, the real planner choosing the label of each
idle batch:

- ``need``: first, a trainer (``X-Client-Id: trainer-a``) posts
  ``{"need": {"<first label>": 1.0}}`` to ``POST /v1/recipes/{name}/feedback``;
- ``none``: no feedback (control).

The pipeline's calls are timed in the service (a wrapper around the worker), so the fill of
each label over time is exact and independent of polling. Reported, at the moment the needed
label holds ``per_label`` images: its fill rate (images/s) over the mean rate of the other
labels (= its fill over theirs), and how much sooner it was full than in the control.

    python -m bench.pool.need_fill_rate [--quick]

Goal: fill-rate ratio >= 3 ("a trainer that reports need for one label sees that label
filled at least 3 times faster than the others while the pool fills").
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, main, median, parse_args, table

GOAL = 3.0
BATCH = 8
RECIPES = {"shapes": ["circle", "square", "triangle"], "digits": [str(d) for d in range(10)]}


class TimedWorker:
    """Wraps the pipeline worker: records (end time, prompt, images) for every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[float, str, int]] = []
        self._lock = threading.Lock()

    def run(self, key: Any, items: Sequence[Any], flight: Any = None) -> Any:
        # No flight: each call runs to its end (this bench measures need, not preemption).
        outcome = self.inner.run(key, items)
        with self._lock:
            self.calls.append((time.perf_counter(), items[0].prompt, len(items)))
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def since(self, start: int) -> list[tuple[float, str, int]]:
        with self._lock:
            return list(self.calls[start:])


def prompt(name: str, arm: str, r: int, label: str) -> str:
    """The one prompt of a label: unique per recipe, so each call is attributed exactly."""
    return f"{label} of {name}-{arm}-{r}"


def recipe_file(folder: Path, rounds: int) -> Path:
    """One recipe per recipe kind, arm and round (``shapes-need-0`` ...), each its own pool
    (a distinct base seed), so every fill starts empty."""
    lines = ["recipes:"]
    seed = 0
    for r in range(rounds):
        for arm in ("need", "none"):
            for name, labels in RECIPES.items():
                seed += 1
                lines += [f"  - name: {name}-{arm}-{r}", "    height: 32", "    width: 32",
                          "    steps: 2", "    guidance: 3.0", f"    base_seed: {seed}",
                          "    labels:"]
                lines += [f'      "{label}": {{prompts: ["{prompt(name, arm, r, label)}"]}}'
                          for label in labels]
    path = folder / "recipes.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def fill_once(url: str, worker: TimedWorker, recipe: str, labels: list[str], per_label: int,
              need: bool) -> dict[str, Any]:
    """Fill ``recipe`` to ``per_label``; per label, images made by the time the first label
    was full, and that time."""
    import httpx

    from genaug.experiments.fewshot import poll_pool

    needed = labels[0]
    with httpx.Client(base_url=url, timeout=60, headers={"X-Client-Id": "trainer-a"}) as http:
        if need:
            http.post(f"/v1/recipes/{recipe}/feedback",
                      json={"need": {needed: 1.0}}).raise_for_status()
        start = len(worker.calls)
        started = time.perf_counter()
        http.post(f"/v1/recipes/{recipe}/fill", json={"per_label": per_label}).raise_for_status()
        deadline = time.monotonic() + 600

        def detail() -> dict[str, Any]:
            return dict(http.get(f"/v1/recipes/{recipe}").json())

        poll_pool(detail, per_label=per_label, labels=[needed], timeout=600, poll_s=0.05)
        if need:  # leave the next arm a service without this need
            http.post(f"/v1/recipes/{recipe}/feedback", json={"need": {}}).raise_for_status()
        # the rest of the pool fills before the next arm starts: arms never overlap
        poll_pool(detail, per_label=per_label, poll_s=0.1,
                  timeout=max(0.0, deadline - time.monotonic()))
    made = dict.fromkeys(labels, 0)
    owner = {f"{label} of {recipe}": label for label in labels}
    at = started
    for ended, text, count in worker.since(start):
        if text not in owner:
            continue
        made[owner[text]] += count
        at = ended
        if made[needed] >= per_label:
            break
    seconds = at - started
    others = sum(made[k] for k in labels[1:]) / (len(labels) - 1)
    return {
        "made": made,
        "seconds": seconds,
        "needed_rate": made[needed] / seconds,
        "others_rate": others / seconds,
        "ratio": made[needed] / others if others else float("inf"),
    }


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    from genaug.service.testing import load_tiny, start_service

    per_label = 24 if args.quick else 96
    rounds = 1 if args.quick else 3
    model = load_tiny(threads=args.threads)
    holder: list[TimedWorker] = []

    def wrap(inner: Any) -> Any:
        holder.append(TimedWorker(inner))
        return holder[0]

    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"need": [], "none": []} for name in RECIPES}
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        folder = Path(tmp)
        with start_service(model, wrap=wrap, record=False, pregenerate=False,
                           recipes=recipe_file(folder, rounds), pool_path=folder / "pool.db",
                           pool_capacity_per_label=100_000, max_batch_images=BATCH,
                           max_wait_ms=5) as live:
            worker = holder[0]
            for r in range(rounds):
                for name, labels in RECIPES.items():
                    for arm in (("need", "none") if r % 2 == 0 else ("none", "need")):
                        results[name][arm].append(fill_once(
                            live.url, worker, f"{name}-{arm}-{r}", labels, per_label,
                            need=arm == "need"))
    rows = []
    summary: dict[str, Any] = {}
    for name, labels in RECIPES.items():
        need = [x["ratio"] for x in results[name]["need"]]
        none = [x["ratio"] for x in results[name]["none"]]
        secs_need = median([x["seconds"] for x in results[name]["need"]])
        secs_none = median([x["seconds"] for x in results[name]["none"]])
        ratio = median(need)
        summary[name] = {"ratio_need": ratio, "ratio_none": median(none),
                         "seconds_need": secs_need, "seconds_none": secs_none,
                         "needed_rate": median([x["needed_rate"] for x in results[name]["need"]]),
                         "others_rate": median([x["others_rate"] for x in results[name]["need"]])}
        rows.append([f"{name} ({len(labels)} labels)", median(none), ratio,
                     summary[name]["needed_rate"], summary[name]["others_rate"],
                     f"{secs_none:.1f} -> {secs_need:.1f}",
                     f">= {GOAL:g} {goal_text(ratio >= GOAL)}"])
    table(
        f"Need-steered fill: one label needed by one trainer; batch {BATCH}, 32x32, 2 steps, "
        f"{per_label} images per label per fill, {rounds} round(s), {args.threads} torch "
        "thread(s)",
        ["recipe", "ratio without need", "ratio with need", "needed label img/s",
         "other labels img/s", "s until needed label full (none -> need)", "goal"],
        rows,
    )
    met = all(s["ratio_need"] >= GOAL for s in summary.values())
    return finish({"benchmark": "need_fill_rate", "per_label": per_label, "rounds": rounds,
                   "batch": BATCH, "threads": args.threads, "summary": summary,
                   "runs": results, "goal": GOAL, "met": met}, args.json)


if __name__ == "__main__":
    main(run)
