"""Fill a recipe's pool, with progress bars.

``--per-label N`` fills every label to ``N`` images (resumable; Ctrl-C keeps every finished
batch); ``--images B --url URL`` spends ``B`` more images by the trainers' need. Without
``--url`` it generates in this process.

``pregenerate --url URL`` asks a running service to fill the pool (``POST
/v1/recipes/{name}/fill``: ``--per-label N`` fills every label to N, ``--images B`` spends B
more images split over the labels by the trainers' need and recent demand), which the service
runs as a job (``GET /v1/jobs/{id}``), and follows that job, a bar per label, until it ends;
its exit status is the job's state: 0 done, 3 stopped, 1 failed or cancelled (by someone
else: ``genaug jobs show ID`` says by whom and why). Ctrl-C stops following, never the job:
the line it ends with names the job and ``genaug jobs cancel ID``. Without ``--url`` it loads
the model in this process and fills the pool the service would use
(``--pool-path``/``GENAUG_POOL_PATH`` or ``--pool-url``/``GENAUG_POOL_URL``; a shared
PostgreSQL pool may be filled beside running replicas, a SQLite file is best filled with the
service stopped). Both resume from what exists. Ctrl-C in process: the batch being made is
finished and stored, then the command exits 130 ("every finished batch is kept"); a second
Ctrl-C stops at once.

A label the recipe's judge stopped (it accepted under 10 % of the label's images: the
planner's low-acceptance stop, ``stopped`` in ``GET /v1/recipes/{name}``) gets no more
images, so no wait would fill it: the command fills every other label, then exits
:data:`STOPPED_EXIT` (3), naming each stopped label with the judge's reason and fix, instead
of waiting for ever. (With ``--url`` the job ends at the first such label; the command still
waits for the other labels of a ``--per-label`` fill, on the recipe's fill, and names those
of an ``--images`` fill the service is still filling.) Exit statuses: 0 filled, 1 the service
refused or failed (or its job failed or was cancelled), 2 bad arguments, recipe file or pool,
3 a label the judge stopped, 130 Ctrl-C (also in ``--help``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genaug.job_states import DONE, STOPPED

from ._pool_args import checked_settings, open_store, pool_arguments

if TYPE_CHECKING:
    from ..pool.store import PoolStore
    from ..settings import Settings

#: The exit status when the judge stopped a label it was asked to fill: every other label is
#: filled; the stopped ones are named with the judge's reason and fix.
STOPPED_EXIT = 3

#: The exit statuses, for ``--help``.
EXIT_STATUSES = (
    "exit status: 0 every label filled; 1 the service refused or failed, or (--url) its job "
    "failed or was cancelled; 2 bad arguments, "
    "recipe file or pool; 3 the judge stopped a label (under 10 % of its images accepted: "
    "no more are made), every other label is filled and the stopped ones are named with "
    "the judge's reason and fix; 130 Ctrl-C (every finished batch is kept; with --url the "
    "job goes on in the service)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from genaug.cli import service_url, whole_number

    parser.epilog = EXIT_STATUSES
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--per-label", type=whole_number(1),
                        help="fill every label to this many images")
    amount.add_argument("--images", type=whole_number(1),
                        help="this many more images, split over the labels by the trainers' "
                             "need and recent demand (needs --url)")
    parser.add_argument("--url", type=service_url, default=None,
                        help="a running service to fill, followed as its job (default: "
                             "generate in this process)")
    pool_arguments(parser)


def _bars(totals: dict[str, int], start: dict[str, int]) -> dict[str, Any]:
    """One progress bar per label, each to its own total, starting where the label stands
    (``start``: what it held before this run): tqdm's rate and time left then count only the
    images this run made, never what the pool already had."""
    from tqdm import tqdm

    width = max(len(label) for label in totals)
    return {
        label: tqdm(total=total, initial=min(start.get(label, 0), total),
                    desc=label.ljust(width), position=i, unit="img", dynamic_ncols=True,
                    leave=True)
        for i, (label, total) in enumerate(totals.items())
    }


def _update(bars: dict[str, Any], fill: dict[str, int],
            stopped: dict[str, str] | None = None) -> None:
    for label, bar in bars.items():
        bar.n = max(bar.initial, min(fill.get(label, 0), bar.total))
        if stopped and label in stopped and bar.n < bar.total:
            bar.set_postfix_str("stopped by the judge", refresh=False)
        bar.refresh()


def _short_and_stopped(fill: dict[str, int], targets: dict[str, int],
                       stopped: dict[str, str]) -> dict[str, str]:
    """The labels below their target that the judge stopped: no wait fills them."""
    return {label: why for label, why in stopped.items()
            if label in targets and fill.get(label, 0) < targets[label]}


def _say_stopped(recipe: str, fill: dict[str, int], targets: dict[str, int],
                 stopped: dict[str, str], filling: dict[str, str] | None = None) -> int:
    """Name each stopped label with the judge's reason and fix; :data:`STOPPED_EXIT`.
    ``filling``: labels not yet filled that the service goes on filling (label -> what to
    run to follow them), named as such, never as filled."""
    filling = filling or {}
    filled = [label for label in targets if label not in stopped and label not in filling]
    print(f"\ngenaug pregenerate: recipe {recipe!r}: "
          + (f"{', '.join(filled)} filled; " if filled else "")
          + "".join(f"{label} ({fill.get(label, 0)} of {targets[label]}) still filling in "
                    f"the service ({how}); " for label, how in filling.items())
          + f"{len(stopped)} label(s) cannot be: the judge stopped them, so no more of their "
            "images are made", file=sys.stderr)
    for label, why in stopped.items():
        held = (f"{fill.get(label, 0)} of {targets[label]}" if label in targets
                else f"{fill.get(label, 0)} held")
        print(f"  {label} ({held}): {why}", file=sys.stderr)
    print(f"genaug pregenerate: exit status {STOPPED_EXIT} (a label the judge stopped); after "
          "the fix, restart the service and run this again", file=sys.stderr)
    return STOPPED_EXIT


def run(args: argparse.Namespace) -> int:
    """Fill each label of ``args.recipe`` to ``args.per_label`` images, or (with a service)
    spend ``args.images`` more split by need."""
    if args.url:
        return _pregenerate_remote(args)
    if getattr(args, "images", None) is not None:
        print("genaug pregenerate: --images splits by the trainers' need, which a running "
              "service holds; add --url URL, or use --per-label N", file=sys.stderr)
        return 2
    return _pregenerate_local(args)


def _said(exc: BaseException) -> str:
    """A client error as this command says it: its fixes name ``--url`` (it has no key flag:
    GENAUG_API_KEY)."""
    from genaug.client.errors import for_command

    said: str = for_command(str(exc), url="--url URL")
    return said


def _pregenerate_remote(args: argparse.Namespace) -> int:
    from genaug.client import Client, GenaugError

    with Client(args.url) as client:
        try:
            job = client.fill(args.recipe, per_label=args.per_label, images=args.images)
        except GenaugError as exc:
            print(f"genaug pregenerate: {_said(exc)}", file=sys.stderr)
            # 409: no label has room for the budget but those the judge stopped
            return _refused_for_stopped(client, args.recipe) if getattr(
                exc, "status", None) == 409 else 1
        if args.images is not None:
            print(f"genaug pregenerate: {job['budget']['note']}", file=sys.stderr)
        if job.id is None:
            print(f"genaug pregenerate: the service at {args.url} answered the fill without a "
                  "job to follow (it is older than this genaug); it fills in the background: "
                  f"GET /v1/recipes/{args.recipe} shows the fill", file=sys.stderr)
            return 1
        args.job_id = job.id  # for interrupted(): the line Ctrl-C ends with names the job
        try:
            return _follow(client, args, job.id)
        except GenaugError as exc:  # the service stopped answering; the job is its own
            print(f"genaug pregenerate: {_said(exc)}; job {job.id} may go on there: genaug jobs "
                  f"show {job.id} --url {args.url} says", file=sys.stderr)
            return 1


#: Seconds between the follower's polls (of the job, then of the recipe's fill).
_POLL_S = 0.5


def _follow(client: Any, args: argparse.Namespace, job_id: str) -> int:
    """Follow the fill's job until it ends, a bar per label it asked (images held toward the
    fill asked, or gained toward the budget); its state is the exit status. The client's
    ``wait_job`` polls and decides when the job ended; the bars follow its polls."""
    from genaug.client import GenaugError

    bars: dict[str, Any] = {}
    targets: dict[str, int] = {}

    def draw(job: dict[str, Any]) -> None:
        held, stopped = _held_and_stopped(job)
        if not bars:  # the first poll: a bar per label, each from what the label held then
            labels = job["labels"]
            targets.update((label, int(c["asked"])) for label, c in labels.items()
                           if int(c["asked"]) > 0)
            bars.update(_bars(targets or {label: 0 for label in labels}, held))
        _update(bars, held, stopped)

    try:
        job = client.wait_job(job_id, poll_s=_POLL_S, progress=False, on_update=draw)
        held, stopped = _held_and_stopped(job)
        if job["state"] == STOPPED and job["kind"] == "per_label":
            # The job ends at the first label it needs that the judge stopped; the service
            # goes on filling the others to their targets, and this command waits for them
            # as it always did, on the recipe's fill (an ended job's counts stay as they were).
            _fill_the_rest(client, args.recipe, bars, held, stopped, targets)
    finally:
        for bar in bars.values():
            bar.close()
    state = job["state"]
    if state == DONE:
        return 0
    if state == STOPPED:
        # the recipe's stops carry the judge's reason and fix per label; the job's reason
        # names them all in one line, for a service that would not say
        try:
            said = dict(client.recipe(args.recipe).get("stopped") or {})
        except GenaugError:
            said = {}
        reasons = {label: str(said.get(label) or job.get("reason") or "stopped")
                   for label in stopped}
        url = f" --url {args.url}" if args.url else ""
        filling = {label: f"genaug jobs list --recipe {args.recipe}{url}" for label in targets
                   if label not in stopped and held.get(label, 0) < targets[label]}
        return _say_stopped(args.recipe, held, targets, reasons, filling)
    url = f" --url {args.url}" if args.url else ""
    print(f"genaug pregenerate: job {job_id} {state}: {job.get('reason') or 'no reason given'}"
          f"; genaug jobs show {job_id}{url} says more", file=sys.stderr)
    return 1


def _fill_the_rest(client: Any, recipe: str, bars: dict[str, Any], held: dict[str, int],
                   stopped: dict[str, str], targets: dict[str, int]) -> None:
    """Until every label of ``targets`` the judge did not stop holds its target (a
    ``per_label`` job: held is the fill), following the recipe's fill; ``held`` and
    ``stopped`` are updated in place (a label may stop meanwhile)."""
    while any(label not in stopped and held.get(label, 0) < target
              for label, target in targets.items()):
        time.sleep(_POLL_S)
        detail = client.recipe(recipe)
        for label, target in targets.items():
            held[label] = max(held.get(label, 0), min(int(detail["fill"].get(label, 0)), target))
        stopped.update(_short_and_stopped(held, targets, dict(detail.get("stopped") or {})))
        _update(bars, held, stopped)


def _held_and_stopped(job: dict[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
    """Per label what the job holds toward what it asked (``asked - missing``), and the
    labels it still lacks that the judge stopped (no more of their images are made)."""
    labels = job["labels"]
    held = {label: max(0, int(c["asked"]) - int(c["missing"])) for label, c in labels.items()}
    stopped = {label: "stopped" for label, c in labels.items()
               if c.get("stopped") and not c.get("met")}
    return held, stopped


def _refused_for_stopped(client: Any, recipe: str) -> int:
    """After a refused fill: :data:`STOPPED_EXIT` naming each label the judge stopped, with
    its reason and fix, when the recipe has such labels; else 1."""
    from genaug.client import GenaugError

    try:
        detail = client.recipe(recipe)
    except GenaugError:
        return 1
    stopped = dict(detail.get("stopped") or {})
    if not stopped:
        return 1
    return _say_stopped(recipe, detail.get("fill") or {}, {}, stopped)


def interrupted(args: argparse.Namespace) -> str:
    job_id = getattr(args, "job_id", None)
    if args.url and job_id:
        return (f"job {job_id} goes on in the service; follow it with genaug jobs wait {job_id}"
                f" --url {args.url}, or cancel it with genaug jobs cancel {job_id} --url "
                f"{args.url}")
    if args.url:
        return ("a fill the service accepted goes on there; genaug jobs list --url "
                f"{args.url} shows its job")
    return "every batch stored before the interrupt is kept; run the same command again to resume"


class _StopFlag:
    """SIGINT sets a flag; the loop finishes and stores the batch it is making, then stops.
    A second Ctrl-C raises KeyboardInterrupt at once (the default behaviour)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: Any = None

    def __enter__(self) -> _StopFlag:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.event.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\nstopping after the batch in progress is stored (Ctrl-C again to abort)",
              file=sys.stderr)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)


KEPT = "stopped; every finished batch is kept (run the same command again to resume)"


def _pregenerate_local(args: argparse.Namespace) -> int:
    from ..recipes.load import check_recipes, load_recipes
    from ..recipes.spec import RecipeError

    with _StopFlag() as stop:
        settings, refused = checked_settings(args, "pregenerate")
        if settings is None:
            print(refused, file=sys.stderr)
            return 2
        recipes_path = args.recipes or settings.recipes
        if recipes_path is None:
            print("genaug pregenerate: give --recipes FILE or set GENAUG_RECIPES",
                  file=sys.stderr)
            return 2
        try:
            recipes = load_recipes(recipes_path)
            if args.recipe in recipes:
                check_recipes({args.recipe: recipes[args.recipe]}, path=Path(recipes_path),
                              data_root=settings.data_root,
                              adapters=_adapter_names(settings))
        except RecipeError as exc:
            print(f"genaug pregenerate: {exc}", file=sys.stderr)
            return 2
        if args.recipe not in recipes:
            print(f"genaug pregenerate: no recipe {args.recipe!r} in {recipes_path}; "
                  f"it has {sorted(recipes)}", file=sys.stderr)
            return 2
        capacity = max(settings.pool_capacity_per_label, args.per_label)
        store, problem = open_store(args, "pregenerate", capacity)
        if store is None:
            print(problem, file=sys.stderr)
            return 2
        try:
            return _fill_in_process(args, settings, recipes[args.recipe], store, stop.event)
        finally:
            store.close()


def _adapter_names(settings: Settings) -> set[str]:
    return set(settings.loras)


def _fill_in_process(args: argparse.Namespace, settings: Settings, recipe: Any,
                     store: PoolStore, stop: threading.Event) -> int:
    from ..batching.items import to_end
    from ..judge import build_judges
    from ..pipeline.device import configure_threads
    from ..pipeline.load import load_model
    from ..pipeline.worker import PipelineWorker
    from ..pool.planner import PoolPlanner, pool_model_hash

    if stop.is_set():
        print(f"\n{KEPT}", file=sys.stderr)
        return 130
    model = load_model(source=settings.model, unet_weights=settings.unet_weights,
                       device=settings.device, dtype=settings.dtype,
                       single_file_config=settings.single_file_config)
    # As the service: GENAUG_TORCH_THREADS, else all cores but one on the CPU (torch's own
    # default, every core, fights the judge and the store on a busy machine: 7x slower).
    configure_threads(settings.torch_threads, model.device)
    generator = PipelineWorker(model)
    recipes = {args.recipe: recipe}
    planner = PoolPlanner(recipes, store, model_hash=pool_model_hash(model),
                          pregenerate=False, data_root=settings.data_root,
                          judges=build_judges(recipes, settings.data_root, model.device))
    planner.raise_target(args.recipe, args.per_label)
    pid = planner.pool_ids[args.recipe]
    targets = dict.fromkeys(recipe.label_names, args.per_label)
    bars = _bars(targets, _fill_or_empty(store, pid))
    fill: dict[str, int] = {}
    try:
        while not stop.is_set():
            fill = _fill_or_empty(store, pid)
            _update(bars, fill, planner.stopped(args.recipe))
            # the planner plans no batch of a label its judge stopped: None then means every
            # other label is filled
            work = planner.next_idle_batch(settings.max_batch_images)
            if work is None:
                if planner.paused:  # the database is unreachable: wait, it resumes by itself
                    stop.wait(2.0)
                    continue
                break
            try:
                outcome = to_end(generator.run(work.key, work.items))
            except Exception as exc:
                if work.on_failed is not None:
                    work.on_failed(exc)
                raise
            work.on_done(outcome)  # stored before the stop flag is looked at again
        fill = _fill_or_empty(store, pid) or fill
        stopped = _short_and_stopped(fill, targets, planner.stopped(args.recipe))
        _update(bars, fill, stopped)
    finally:
        for bar in bars.values():
            bar.close()
    if stop.is_set():  # after the bars, which redraw as they close: the last line says it
        print(f"\n{KEPT}", file=sys.stderr)
        return 130
    if stopped:
        return _say_stopped(args.recipe, fill, targets, stopped)
    return 0


def _fill_or_empty(store: PoolStore, pid: str) -> dict[str, int]:
    from ..pool.types import PoolConnectionError

    try:
        return store.fill(pid)
    except PoolConnectionError:
        return {}
