"""Auto's first fill against the plain recipe's, then what auto's decision costs and buys.

Two child services through the real CLI (the embedded ``tiny-digits`` model), each with its
own pool, serve the shipped digits recipe (``recipes/digits.yaml``: 20 Euler steps, guidance
3) judged on 10 real digits per label of the fewshot split (``judge: {shots: fewshot}``
under ``GENAUG_DATA_ROOT``): ``quality``, the recipe as it is, and ``auto``, the same with
``speed: auto``; ``GENAUG_PREGENERATE=false``, so only what is asked is drawn, and a
capacity of 1000 per label (``--capacity``). Fills run one after the other, never at the
same time (the services share the machine's cores), each timed from the ``POST`` until the
job is seen ended; each figure carries the 1-minute load average (``os.getloadavg()``) as it
ended.

1. **First fill.** ``client.fill("digits", per_label=24)`` on both from empty (quality,
   then auto), ``job.wait()``: the end state, minutes, images made (accepted + rejected,
   from the job's labels) and the auto job's ``sampling`` line.
2. **Decision cost.** The auto pool is filled further, +64 per label a round, until its
   ``sampling.state`` is ``decided`` (or 30 minutes from its first fill, or the capacity
   minus the room phase 3 needs): images made per label (per sampler, read from the pool
   database) and minutes until the decision, and what it chose.
3. **Once decided** (or where phase 2 gave up: the tables say auto's state). A fill of 64
   more per label on each, one after the other, twice each in the order quality, auto,
   auto, quality: images and accepted images per second, auto over
   quality, and the share of each pool's new accepted images (what a sample serves) that an
   outside classifier (:func:`genaug.digits.fidelity`) reads as the digit asked, with their
   diversity against quality's (:func:`bench.service.turbo_speed._diversity`).

    python -m bench.pool.auto_first_fill [--quick] [--threads N] [--capacity N]
                                         [--bound-min M] [--json F]

``--quick``: 3 labels, 8 per label per fill, no decision phase (the path, for a test).

Goals (issue 56): auto's first fill ends as the plain one ends, in <= 1.3x its time and
<= 1.5x its images made; once decided, auto fills >= 3x faster (accepted images per second)
with a read >= 0.95.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import ROOT, finish, goal_text, main, make_parser, table
from bench.service.turbo_speed import _diversity
from bench.services import services

GOAL_FIRST_TIME = 1.3
GOAL_FIRST_MADE = 1.5
GOAL_CHEAPER = 3.0
GOAL_READ = 0.95
SHOTS = 10
BATCH = 16
CAPACITY = 1000
RECIPE = "digits"
ARMS = ("quality", "auto")
#: Phase 3's order: each arm twice, alternating (A B B A).
ORDER = ("quality", "auto", "auto", "quality")
#: Seconds between polls of a job (and of the recipe while auto decides).
POLL_S = 0.25


def _load() -> float:
    return round(os.getloadavg()[0], 2)


@dataclass
class Fill:
    """One measured fill: what the job ended with and the machine's load around it."""

    arm: str
    per_label: int
    state: str
    reason: str | None
    seconds: float
    made: int
    accepted: int
    labels: dict[str, dict[str, Any]]
    sampling: str | None
    started: float  # seconds since the epoch (the pool database's clock)
    ended: float
    load_start: float
    load: float  # 1-minute load average as the fill ended
    settled: float = 0.0  # seconds since the epoch: its last batch in flight had landed

    @property
    def images_s(self) -> float:
        return self.made / self.seconds

    @property
    def accepted_s(self) -> float:
        return self.accepted / self.seconds


@dataclass
class Decision:
    """The moment auto was first seen decided, and what the pool had made until then."""

    seconds: float  # since the auto pool's first fill was posted
    busy_seconds: float  # of which fills were running
    per_label: dict[str, dict[str, int]]
    sampling: dict[str, Any]
    load: float
    at: float = field(default=0.0)  # seconds since the epoch


def write_recipes(root: Path, labels: int | None) -> dict[str, Path]:
    """The shipped digits recipe (its first ``labels`` labels, all without) judged on
    :data:`SHOTS` real digits per label, as it is and with ``speed: auto``: one recipe file
    per arm, both naming the recipe ``digits``."""
    import yaml

    from genaug.digits import write_split_folders

    write_split_folders(root / "data", ["fewshot"], per_class=SHOTS, seed=0)
    spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
    spec["judge"] = {"shots": "fewshot"}
    if labels is not None:
        spec["labels"] = dict(list(spec["labels"].items())[:labels])
    out = {}
    for arm, extra in (("quality", {}), ("auto", {"speed": "auto"})):
        out[arm] = root / f"{arm}.yaml"
        out[arm].write_text(yaml.safe_dump({"recipes": [{**spec, **extra}]}))
    return out


def fill(client: Any, arm: str, per_label: int, *,
         watch: Callable[[], None] | None = None) -> Fill:
    """``client.fill(RECIPE, per_label=...)`` until its job ended (``job.wait()``; with
    ``watch``, polled here and ``watch`` called after every poll), then :func:`settle`."""
    from genaug.job_states import ended

    load_start = _load()
    started_at = time.time()
    started = time.perf_counter()
    job = client.fill(RECIPE, per_label=per_label)
    if watch is None:
        final = job.wait(poll_s=POLL_S, progress=False)
    else:
        while True:
            final = job.status()
            watch()
            if ended(final):
                break
            time.sleep(POLL_S)
    seconds = time.perf_counter() - started
    labels = final["labels"]
    load = _load()
    settle(client)
    return Fill(arm=arm, per_label=per_label, state=final["state"], reason=final["reason"],
                seconds=seconds, made=sum(p["made"] for p in labels.values()),
                accepted=sum(p["accepted"] for p in labels.values()), labels=labels,
                sampling=final.get("sampling"), started=started_at, ended=time.time(),
                load_start=load_start, load=load, settled=time.time())


def settle(client: Any, timeout: float = 120.0) -> dict[str, Any]:
    """The recipe's detail once nothing is reserved and ``generated`` held still for a
    second: batches still in flight after a job ended land before the next fill is timed."""
    deadline = time.perf_counter() + timeout
    last, still = -1, 0.0
    while True:
        detail = client.recipe(RECIPE)
        generated = detail["totals"]["generated"]
        reserved = sum(c["reserved"] for c in detail["per_label"].values())
        if reserved == 0 and generated == last:
            still += POLL_S
            if still >= 1.0:
                return dict(detail)
        else:
            still = 0.0
        last = generated
        if time.perf_counter() > deadline:
            return dict(detail)
        time.sleep(POLL_S)


def decide(client: Any, first: Fill, *, step: int, bound_s: float,
           top: int) -> tuple[list[Fill], Decision | None]:
    """Fill the auto pool ``step`` more per label a round from ``first``'s target until its
    sampling is ``decided``, ``bound_s`` after ``first`` was posted, or the next target
    would pass ``top``; the rounds and the decision (None if not reached)."""
    rounds: list[Fill] = []
    seen: list[Decision] = []
    busy = first.seconds
    target = first.per_label
    round_started = [0.0]

    def watch() -> None:
        if seen:
            return
        detail = client.recipe(RECIPE)
        if detail["sampling"]["state"] == "decided":
            now = time.time()
            seen.append(Decision(
                seconds=now - first.started,
                busy_seconds=busy + (time.perf_counter() - round_started[0]),
                per_label={label: {k: c[k] for k in ("generated", "judged_total",
                                                     "accepted_total")}
                           for label, c in detail["per_label"].items()},
                sampling=detail["sampling"], load=_load(),
                at=float(detail["sampling"].get("since") or now)))

    while not seen and time.time() - first.started < bound_s and target + step <= top:
        target += step
        round_started[0] = time.perf_counter()
        done = fill(client, "auto", target, watch=watch)
        rounds.append(done)
        busy += done.seconds
        print(f"auto round to {target} per label: {done.state}, {done.made} made in "
              f"{done.seconds:.0f} s (load {done.load}); sampling: {done.sampling}", flush=True)
        if done.made == 0:
            break  # nothing is drawn any more (every label the job needs is stopped)
    if not seen:
        watch()
    return rounds, (seen[0] if seen else None)


def records(pool: Path, pool_id: str, capacity: int) -> list[Any]:
    """Every image of the pool, rejected ones too, with its provenance (the pool database,
    read after its service stopped)."""
    from genaug.service.pool.open import open_pool

    with open_pool(pool, capacity_per_label=capacity) as store:
        return list(store.reads.iter_records(pool_id, include_rejected=True))


def by_sampler(found: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Images made per sampler and label."""
    out: dict[str, Counter[str]] = {}
    for r in found:
        out.setdefault(str(r.provenance.sampler), Counter())[r.label] += 1
    return {name: dict(sorted(c.items())) for name, c in out.items()}


def read_of(found: Sequence[Any]) -> dict[str, Any]:
    """The outside classifier's read of ``found``'s accepted images (what a sample serves)
    and of all of them, their diversity, and the judge's acceptance."""
    from genaug.digits import fidelity

    kept = [r for r in found if r.accepted]
    out: dict[str, Any] = {"made": len(found), "accepted": len(kept),
                           "acceptance": len(kept) / len(found) if found else float("nan"),
                           "samplers": by_sampler(found)}
    for key, group in (("read", kept), ("read_all", found)):
        if group:
            images = np.stack([r.image for r in group])
            out[key] = fidelity(images, [int(r.label) for r in group])
        else:
            out[key] = float("nan")
    if kept:
        out["diversity"] = _diversity(np.stack([r.image for r in kept]),
                                      np.array([int(r.label) for r in kept]))
    return out


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", quick="3 labels, 8 per label per fill, no decision "
                                              "phase: the path, for a test")
    parser.add_argument("--capacity", type=int, default=CAPACITY,
                        help="GENAUG_POOL_CAPACITY_PER_LABEL of both services; auto's decision "
                             "phase stops where phase 3's fills would pass it "
                             "(default %(default)s)")
    parser.add_argument("--bound-min", type=float, default=30.0,
                        help="give up waiting for auto's decision this many minutes after its "
                             "first fill (default %(default)s)")
    args = parser.parse_args(argv)
    from genaug.client import Client

    labels = 3 if args.quick else None
    first_per_label = 8 if args.quick else 24
    step = 8 if args.quick else 64
    result: dict[str, Any] = {"benchmark": "auto_first_fill", "quick": args.quick,
                              "threads": args.threads, "shots": SHOTS,
                              "capacity": args.capacity,
                              "first_per_label": first_per_label, "step": step}
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        root = Path(tmp)
        recipe_files = write_recipes(root, labels)
        specs = {arm: {"model": "tiny-digits", "recipes": recipe_files[arm],
                       "pool_path": root / f"{arm}.db", "data_root": root / "data",
                       "pool_capacity_per_label": args.capacity, "pregenerate": False,
                       "max_batch_images": BATCH} for arm in ARMS}
        third: list[Fill] = []
        with services(specs, threads=args.threads) as urls, \
                Client(urls["quality"], timeout=120) as quality, \
                Client(urls["auto"], timeout=120) as auto:
            clients = {"quality": quality, "auto": auto}
            pool_ids = {arm: c.recipe(RECIPE)["pool_id"] for arm, c in clients.items()}
            # 1. The first fill, from empty: quality, then auto (which phase 2 continues).
            first = {}
            for arm in ARMS:
                first[arm] = fill(clients[arm], arm, first_per_label)
            # 2. Auto's decision.
            rounds: list[Fill] = []
            decision = None
            if not args.quick:
                rounds, decision = decide(auto, first["auto"], step=step,
                                          bound_s=args.bound_min * 60,
                                          top=args.capacity - 2 * step)
            sampling_now = auto.recipe(RECIPE)["sampling"]
            # 3. Once decided: 64 more per label, one fill at a time, A B B A.
            for arm in ORDER:
                target = max(clients[arm].recipe(RECIPE)["fill"].values()) + step
                done = fill(clients[arm], arm, target)
                third.append(done)
            sampling_end = auto.recipe(RECIPE)["sampling"]
        found = {arm: records(root / f"{arm}.db", pool_ids[arm], args.capacity) for arm in ARMS}

    # -- 1. the first fill --------------------------------------------------------------------
    q, a = first["quality"], first["auto"]
    first_made = {arm: by_sampler([r for r in found[arm] if r.created <= first[arm].settled])
                  for arm in ARMS}
    table(f"First fill from empty, {first_per_label} per label "
          f"({len(q.labels)} labels, one fill at a time)",
          ["recipe", "end state", "minutes", "images made", "accepted", "load (1 min)",
           "sampling"],
          [[arm, f.state, f"{f.seconds / 60:.2f}", f.made, f.accepted, f.load,
            f.sampling or "-"] for arm, f in first.items()])
    time_ratio, made_ratio = a.seconds / q.seconds, a.made / max(1, q.made)
    table("First fill, auto / quality", ["measure", "auto / quality", "goal"],
          [["time", f"{time_ratio:.2f}", f"<= {GOAL_FIRST_TIME}"],
           ["images made", f"{made_ratio:.2f}", f"<= {GOAL_FIRST_MADE}"],
           ["end state", f"{a.state} / {q.state}", "equal"]])
    result["first_fill"] = {arm: {**asdict(f), "samplers": first_made[arm]}
                            for arm, f in first.items()}
    result["first_ratios"] = {"time": time_ratio, "made": made_ratio}
    goals: dict[str, bool] = {
        "first_state": a.state == q.state,
        "first_time": time_ratio <= GOAL_FIRST_TIME,
        "first_made": made_ratio <= GOAL_FIRST_MADE,
    }

    # -- 2. the decision --------------------------------------------------------------------
    result["rounds"] = [asdict(f) for f in rounds]
    result["sampling"] = sampling_now
    if not args.quick:
        rows = [[f.per_label, f.state, f"{f.seconds / 60:.2f}", f.made, f.accepted, f.load,
                 f.sampling or "-"] for f in [a, *rounds]]
        table("Auto's fills until it decided", ["per_label", "end state", "minutes", "made",
                                                "accepted", "load (1 min)", "sampling"], rows)
        until = decision.at if decision is not None else max(f.settled for f in [a, *rounds])
        made = by_sampler([r for r in found["auto"] if r.created <= until])
        names = sorted(made, key=lambda n: -sum(made[n].values()))
        label_names = sorted(q.labels)
        rows = [[label, *(made[n].get(label, 0) for n in names),
                 sum(made[n].get(label, 0) for n in names)] for label in label_names]
        totals = [sum(made[n].values()) for n in names]
        rows.append(["all", *totals, sum(totals)])
        state = "decided" if decision is not None else "NOT decided"
        minutes = (f"{decision.seconds / 60:.1f} min ({decision.busy_seconds / 60:.1f} filling)"
                   if decision is not None else "-")
        table(f"Images made per label until auto {state} ({minutes}), per sampler",
              ["label", *names, "all"], rows)
        result["decision"] = None if decision is None else asdict(decision)
        result["decision_made"] = made
        cands = sampling_now.get("candidates", [])
        table(f"What auto tried (sampling: {sampling_now['state']}: {sampling_now['reason']})",
              ["candidate", "result"], [[c["name"], c["result"]] for c in cands
                                        if c["result"] != "untried"])
        goals["decided"] = decision is not None

    # -- 3. once decided --------------------------------------------------------------------
    rates = {arm: [f for f in third if f.arm == arm] for arm in ARMS}
    table(f"{step} more per label, one fill at a time (order {' '.join(ORDER)}; auto: "
          f"{sampling_now['state']}"
          + (f", {sampling_now['sampler']['name']})" if sampling_now.get("sampler") else ")"),
          ["recipe", "end state", "seconds", "made", "accepted", "images/s", "accepted/s",
           "load (1 min)"],
          [[f.arm, f.state, f"{f.seconds:.1f}", f.made, f.accepted, f"{f.images_s:.2f}",
            f"{f.accepted_s:.2f}", f.load] for f in third])
    mean = {arm: {"images_s": float(np.mean([f.images_s for f in fs])),
                  "accepted_s": float(np.mean([f.accepted_s for f in fs]))}
            for arm, fs in rates.items()}
    new = {arm: read_of([r for r in found[arm]
                         if r.created >= min(f.started for f in rates[arm])]) for arm in ARMS}
    speedup = mean["auto"]["accepted_s"] / mean["quality"]["accepted_s"]
    table("Once decided: auto / quality, and the new images' read",
          ["recipe", "images/s", "accepted/s", "vs quality (accepted/s)", "judge acceptance",
           "read (accepted)", "read (all made)", "diversity vs quality", "samplers"],
          [[arm, f"{mean[arm]['images_s']:.2f}", f"{mean[arm]['accepted_s']:.2f}",
            f"{mean[arm]['accepted_s'] / mean['quality']['accepted_s']:.2f}x",
            f"{new[arm]['acceptance']:.3f}", f"{new[arm]['read']:.3f}",
            f"{new[arm]['read_all']:.3f}",
            f"{new[arm].get('diversity', float('nan')) / new['quality']['diversity']:.2f}",
            ", ".join(new[arm]["samplers"])] for arm in ARMS])
    print(f"auto's sampling after them: {sampling_end['state']}: {sampling_end['reason']}")
    result["sampling_end"] = sampling_end
    result["third"] = [asdict(f) for f in third]
    result["rates"] = mean
    result["speedup"] = speedup
    result["speedup_made"] = mean["auto"]["images_s"] / mean["quality"]["images_s"]
    result["new_images"] = new
    goals["cheaper"] = speedup >= GOAL_CHEAPER
    goals["read"] = new["auto"]["read"] >= GOAL_READ
    for goal, met in goals.items():
        print(f"goal {goal}: {goal_text(met)}")
    result["goals"] = goals
    result["load_end"] = list(os.getloadavg())
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
