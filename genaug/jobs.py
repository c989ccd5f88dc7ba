"""List, show, wait for and cancel the fill jobs of a running service.

A fill handed to the service (``genaug pregenerate --url``, a client's ``fill()``, ``POST
/v1/recipes/{name}/fill``) runs there as a job, stored in the pool database, so any replica
answers for it and a restart forgets none. ``genaug jobs`` follows them with the client only
(``genaug[client]``)::

    genaug jobs list [--url URL] [--recipe NAME] [--state S] [--limit N] [--json]
    genaug jobs show ID [--url URL] [--json]
    genaug jobs wait ID [--url URL]      a progress bar where a terminal is attached
    genaug jobs cancel ID [--url URL]
    genaug jobs forget ID [--url URL]    removes it (cancelled first if live)

``--url`` defaults to ``GENAUG_URL`` (every replica it lists), else http://127.0.0.1:8000;
``--api-key`` to ``GENAUG_API_KEY``. ``wait`` exits with the job's state, as ``genaug
pregenerate`` does: 0 done, 3 stopped (each label the judge stopped is named with its reason
and fix), 1 failed or cancelled. Ctrl-C leaves the job running in the service and says the
command that cancels it. A refusal of the service (an unknown id, a cancel of a job that
already ended) is one line with the service's message, exit status 1.

Example::

    genaug jobs list --recipe digits --state running
    genaug jobs wait j_0123456789abcdef && echo filled
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from genaug.job_states import CANCELLED, DONE, FAILED, LIVE, STATES, STOPPED

if TYPE_CHECKING:  # the client (httpx, numpy) is imported when the command runs
    from genaug.client import Client

__all__ = ["EXIT_STATUSES", "STATE_EXIT", "add_arguments", "format_job", "format_jobs",
           "interrupted", "run"]

DEFAULT_URL = "http://127.0.0.1:8000"
#: ``genaug jobs wait``'s exit status per ended state; the same as ``genaug pregenerate``'s.
STATE_EXIT = {DONE: 0, STOPPED: 3, FAILED: 1, CANCELLED: 1}
MAX_LIMIT = 1000
#: How long ``wait`` retries a poll the service did not answer (a restart, a replica moving).
WAIT_RETRY_S = 30.0

EXIT_STATUSES = (
    "exit status: 0 done (wait), or listed, shown, cancelled, forgotten; 1 the job failed or "
    "was cancelled (wait), or the service refused (an unknown id, a cancel of a job that already "
    "ended: its message in one line) or did not answer; 2 bad arguments; 3 the job stopped "
    "(wait): the judge stopped a label it needs, each named with the judge's reason and fix; "
    "130 Ctrl-C (the job goes on in the service; the line says how to cancel it)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``genaug jobs``' subcommands and their flags."""
    from .cli import seconds, service_url, whole_number

    parser.epilog = EXIT_STATUSES
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", type=service_url, default=None,
                        help=f"the service (default: GENAUG_URL, else {DEFAULT_URL})")
    common.add_argument("--api-key", default=None,
                        help="API key to send (default: GENAUG_API_KEY)")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", parents=[common], epilog=EXIT_STATUSES,
                             help="the recent jobs, newest first",
                             description="The recent jobs, newest first: id, recipe, state, "
                                         "images held of asked, rate, time left, created.")
    listing.add_argument("--recipe", default=None, help="only this recipe's jobs")
    listing.add_argument("--state", choices=STATES, default=None,
                         help="only jobs in this state")
    listing.add_argument("--limit", default=50, type=whole_number(
                             1, MAX_LIMIT, fix=f"list at most {MAX_LIMIT} jobs at once (filter "
                                               "with --recipe / --state)"),
                         help=f"at most this many (1..{MAX_LIMIT}, default %(default)s)")
    listing.add_argument("--json", action="store_true", help='print {"jobs": [job, ...]}')
    show = sub.add_parser("show", parents=[common], epilog=EXIT_STATUSES,
                          help="one job and its labels",
                          description="One job: its state, why it ended, and per label what "
                                      "it asked, made, accepted and lacks.")
    show.add_argument("id", help="the job's id (j_ and 16 hex characters)")
    show.add_argument("--json", action="store_true", help="print the job as the service "
                      "answers GET /v1/jobs/ID")
    wait = sub.add_parser("wait", parents=[common], epilog=EXIT_STATUSES,
                          help="follow a job until it ends; exit with its state",
                          description="Follow a job (a progress bar where a terminal is "
                                      "attached) until it ends; exit with its state.")
    wait.add_argument("id", help="the job's id")
    wait.add_argument("--poll", type=seconds(most=3600, fix="poll every second or so "
                                                        "(--poll 1)"), default=1.0,
                      help="seconds between polls (default %(default)s)")
    cancel = sub.add_parser("cancel", parents=[common], epilog=EXIT_STATUSES,
                            help="cancel a queued or running job",
                            description="Cancel a queued or running job: what it asked for "
                                        "and no other live job wants is no longer made.")
    cancel.add_argument("id", help="the job's id")
    forget = sub.add_parser("forget", parents=[common], epilog=EXIT_STATUSES,
                            help="remove a job (cancelled first if it is live)",
                            description="Remove a job from the service: a queued or running "
                                        "one is cancelled first; its webhook is never sent.")
    forget.add_argument("id", help="the job's id")


def _say(line: str) -> None:
    sys.stderr.write(f"genaug jobs: {line}\n")


def _one_line(exc: BaseException) -> str:
    """The client's message in one line, its fixes naming this command's flags."""
    from genaug.client.errors import for_command

    return " ".join(for_command(str(exc), url="--url URL", api_key="--api-key KEY").split())


def run(args: argparse.Namespace, *, write: Callable[[str], Any] | None = None) -> int:
    """Run ``genaug jobs ACTION``; the exit status (module doc)."""
    from genaug.client import Client, GenaugError

    from .urls import env_url_refusal

    out = write or sys.stdout.write
    refused = env_url_refusal() if args.url is None else None
    if refused is not None:  # said before anything is sent, as a bad --url is
        _say(refused)
        return 2
    # One look answers at once, a service that is not there included; a wait rides out a
    # restart (jobs survive one) with the client's usual retries.
    retry_s = WAIT_RETRY_S if args.action == "wait" else 0.0
    try:
        with Client(args.url, api_key=args.api_key, retry_deadline=retry_s) as client:
            if args.action == "list":
                jobs = client.jobs(args.recipe, args.state, args.limit)
                out(json.dumps({"jobs": jobs}, indent=1) + "\n" if args.json
                    else format_jobs(jobs) + "\n")
                return 0
            if args.action == "show":
                job = client.job(args.id)
                out(json.dumps(job, indent=1) + "\n" if args.json else format_job(job) + "\n")
                return 0
            if args.action == "cancel":
                job = client.cancel_job(args.id)
                out(_summary(job) + "\n")
                return 0
            if args.action == "forget":
                job = client.forget_job(args.id)
                out(f"forgot {_summary(job)}\n")
                return 0
            job = client.wait_job(args.id, poll_s=args.poll)
            out(_summary(job) + "\n")
            return _ended(client, job)
    except ValueError as exc:  # an argument the client refused before sending anything
        _say(_one_line(exc))
        return 2
    except GenaugError as exc:
        _say(_one_line(exc))
        return 1


def _ended(client: Client, job: Mapping[str, Any]) -> int:
    """Say why a job that is not done ended; its exit status (:data:`STATE_EXIT`)."""
    state = str(job.get("state"))
    if state == STOPPED:
        _say_stopped(client, job)
    elif state in (FAILED, CANCELLED):
        _say(f"job {job.get('id')} {state}: {job.get('reason') or 'no reason given'}")
    return STATE_EXIT.get(state, 1)


def stopped_labels(job: Mapping[str, Any], recipe_stopped: Mapping[str, str]
                   ) -> dict[str, str]:
    """The labels that keep ``job`` from done because the judge stopped them, each with the
    judge's reason and fix: the recipe's (``GET /v1/recipes/{name}``'s ``stopped``), else the
    job's own ``reason``."""
    labels = job.get("labels") or {}
    return {str(label): str(recipe_stopped.get(label) or job.get("reason") or "stopped")
            for label, counts in labels.items()
            if counts.get("stopped") and not counts.get("met")}


def _say_stopped(client: Client, job: Mapping[str, Any]) -> None:
    from genaug.client import GenaugError

    try:
        detail = client.recipe(str(job.get("recipe")))
    except GenaugError:  # the job's reason names them too
        detail = {}
    recipe_stopped = dict(detail.get("stopped") or {})
    fill_now = dict(detail.get("fill") or {})
    stopped = stopped_labels(job, recipe_stopped)
    labels = job.get("labels") or {}
    # The job's counts are as it ended, at the first stop; the service goes on filling the
    # other labels to their targets, so a per_label job's label that holds its ask now is
    # filled, whatever it held then.
    met = [label for label, counts in labels.items() if counts.get("met") or (
        job.get("kind") == "per_label" and label not in stopped
        and int(fill_now.get(label, 0)) >= int(counts.get("asked") or 0))]
    filling = [label for label in labels if label not in met and label not in stopped]
    _say(f"job {job.get('id')} (recipe {job.get('recipe')!r}) stopped: "
         + (f"{', '.join(met)} filled; " if met else "")
         + (f"{', '.join(filling)} still filling in the service; " if filling else "")
         + f"{len(stopped)} label(s) cannot be: the judge stopped them, so no more of their "
           "images are made")
    for label, why in stopped.items():
        counts = labels.get(label) or {}
        held = fill_now.get(label, counts.get("fill", 0))  # now: a batch in flight lands late
        sys.stderr.write(f"  {label} ({held} of {counts.get('asked', 0)}): {why}\n")
    _say("exit status 3 (a label the judge stopped); after the fix, restart the service and "
         "fill again")


def _eta(job: Mapping[str, Any]) -> str:
    eta = job.get("eta_s")
    if job.get("state") not in LIVE or eta is None:
        return "-"
    seconds = float(eta)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _summary(job: Mapping[str, Any]) -> str:
    """One line: ``j_... (recipe 'shapes') running: 12 of 40 images, 0.80 images/s``."""
    from genaug.client._jobs import job_held

    held, asked = job_held(job)
    line = (f"{job.get('id')} (recipe {job.get('recipe')!r}) {job.get('state')}: {held} of "
            f"{asked} images")
    if job.get("state") in LIVE:
        line += f", {float(job.get('rate') or 0.0):.2f} images/s, about {_eta(job)} left"
    return line + (f" ({job['reason']})" if job.get("reason") else "")


def _time(stamp: Any) -> str:
    return "-" if not stamp else str(stamp)[:19].replace("T", " ")


def format_jobs(jobs: Sequence[Mapping[str, Any]]) -> str:
    """``genaug jobs list``'s table. ``held/asked``: images the job's labels hold toward what
    it asked (a ``per_label`` job counts what they held before it began)."""
    from genaug.client._jobs import job_held

    if not jobs:
        return "no jobs"
    header = ("id", "recipe", "state", "held/asked", "rate", "eta", "created")
    rows = [header] + [
        (str(j.get("id")), str(j.get("recipe")), str(j.get("state")),
         "{}/{}".format(*job_held(j)), f"{float(j.get('rate') or 0.0):.2f}/s", _eta(j),
         _time(j.get("created")))
        for j in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def format_job(job: Mapping[str, Any]) -> str:
    """``genaug jobs show``'s text: the summary line, times, webhook, and a row per label."""
    lines = [_summary(job),
             f"  kind {job.get('kind')}, pool {job.get('pool_id')}; created "
             f"{_time(job.get('created'))}, updated {_time(job.get('updated'))}, ended "
             f"{_time(job.get('ended'))}"]
    if job.get("notify_url"):
        hook = job.get("webhook") or {}
        tries = int(hook.get("attempts") or 0)
        lines.append(f"  notify {job['notify_url']}: webhook {hook.get('state', '-')} "
                     f"({tries} attempt{'' if tries == 1 else 's'} made)")
    header = ("label", "asked", "made", "accepted", "rejected", "fill", "missing", "")
    rows: list[tuple[str, ...]] = [header]
    for label, c in (job.get("labels") or {}).items():
        note = "stopped by the judge" if c.get("stopped") else "met" if c.get("met") else ""
        rows.append((str(label), *(str(c.get(k, 0)) for k in header[1:7]), note))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  " + "  ".join(cell.rjust(w) if 0 < i < 7 else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
              .rstrip() for row in rows]
    return "\n".join(lines)


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves: the job goes on in the service (and how to cancel it)."""
    job_id = getattr(args, "id", None)
    if args.action == "wait" and job_id:
        url = f" --url {args.url}" if args.url else ""
        return (f"job {job_id} goes on in the service; follow it again with genaug jobs wait "
                f"{job_id}{url}, or cancel it with genaug jobs cancel {job_id}{url}")
    if args.action in ("cancel", "forget") and job_id:
        return (f"the {args.action} may have reached the service: genaug jobs show {job_id} "
                "says")
    return "nothing was changed"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.jobs ACTION ...``: ``genaug jobs`` itself (its Ctrl-C included)."""
    from .cli import main as genaug

    return genaug(["jobs", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
