"""Check the service, the recipe's pool, GPUs, XLA, versions and memory before training.

``genaug doctor`` checks a training host against its genaug service. Each check answers
``ok``, ``warn`` or ``fail`` with one line of what it found and, unless it is ok, one line
of the fix. The doctor reads and never fixes: it changes no configuration.

======== ====================================================================================
check    looks at
======== ====================================================================================
service  the service answers at ``--url`` (``GENAUG_URL``) and is ready (model loaded)
api-key  the service accepts the key sent (``--api-key`` / ``GENAUG_API_KEY``)
model    the model, device and dtype it serves
recipe   ``--recipe`` exists, and its labels (without ``--recipe``: the recipes it has)
pool     the recipe pool's fill per label against the reservoir's slots, and its fill rate:
         full before the first epoch ends (``--epoch-s``)? Labels the judge stopped
         (no more of their images are made): the judge's fix, not a fill that cannot end
sampling a ``speed: auto`` recipe only: the sampler auto decided on and how much cheaper it
         is, or for how long it has been probing and why, and what draws the probes it lacks
gpus     the GPUs TensorFlow would use here (NVML UUIDs, ``CUDA_VISIBLE_DEVICES``) against
         the service's GPU
xla      when TensorFlow was built with CUDA: XLA's CUDA data directory (``XLA_FLAGS=
         --xla_gpu_cuda_data_dir``) and ``nvvm/libdevice/libdevice.10.bc`` in it
versions TensorFlow, Keras, the NVIDIA driver (against TensorFlow's CUDA), genaug here and
         there; with ``--trainer torch``: torch and the driver against torch's CUDA, and
         no xla check (a PyTorch trainer: :mod:`genaug.torch`, whose ``diagnose()`` runs
         the loader itself)
memory   host memory available against the reservoir ``genaug train`` would allocate
======== ====================================================================================

Exit status 1 when any check fails. ``--json`` prints
``{"checks": [{"name", "status", "message", "fix"}]}``. No TensorFlow is imported: its
version and build come from the installed package's files, the GPUs from NVML, so the doctor
answers in about a second. docs/doctor.md says where each check comes from.

Example::

    genaug doctor --url http://127.0.0.1:8000 --recipe digits
    python -m genaug.doctor --recipe digits --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from genaug.trainer.hardware.host import (
    Check,
    Host,
    check_gpus,
    check_memory,
    check_xla,
    ok,
    recipe_size,
)
from genaug.trainer.hardware.versions import check_torch_versions, check_versions

if TYPE_CHECKING:  # the client (httpx, numpy) is imported when the checks run
    from genaug.client import Client

__all__ = [
    "Options",
    "add_arguments",
    "check_pool",
    "check_sampling",
    "format_checks",
    "main",
    "run",
    "run_checks",
]

DEFAULT_URL = "http://127.0.0.1:8000"


# ----------------------------------------------------------------------------- service checks


def check_pool(detail: Mapping[str, Any], *, slots: int, epoch_s: float | None,
               pregenerate: bool, url: str) -> Check:
    """The pool's fill per label against what the reservoir holds (``slots`` per class, at
    most the pool's capacity), and whether the service fills it before the first epoch ends:
    only up to its targets (``target_per_label``), at its recent ``generation_rate``.

    A short label the recipe's judge stopped (``stopped``: it accepted under 10 % of the
    label's images, so none more are made) gets the judge's fix, never a ``genaug
    pregenerate`` that could not finish."""
    name = str(detail.get("name"))
    fill = {str(k): int(v) for k, v in (detail.get("fill") or {}).items()}
    rate = float(detail.get("generation_rate") or 0.0)
    capacity = int(detail.get("capacity_per_label") or slots)
    want = min(slots, capacity)
    targets = detail.get("target_per_label") or {}
    missing = sum(max(0, want - n) for n in fill.values())
    planned = sum(max(0, min(want, int(targets.get(label, want if pregenerate else 0))) - n)
                  for label, n in fill.items())
    shown = ", ".join(f"{label} {n}" for label, n in fill.items())
    of = f"the reservoir's {slots}" if want == slots else f"the pool's capacity {capacity}"
    found = (f"pool of {name!r}: {shown} image(s) of {of} per label; generating "
             f"{rate:.2f} images/s")
    pregen = f"genaug pregenerate --recipe {name} --per-label {want} --url {url}"
    if not fill:
        return Check("pool", "warn", f"{found}: the recipe has no label", "check the recipe file")
    if missing == 0:
        return ok("pool", found + ": full")
    stopped = {str(label): str(why) for label, why in (detail.get("stopped") or {}).items()
               if fill.get(str(label), want) < want}
    if stopped:
        # No fill ends while the judge stops these labels (pregenerate exits 3): the fix is
        # the judge's, then a restart (a new window) lets generation try them again.
        whys = "; ".join(f"{label} ({fill.get(label, 0)} held): {_judge_why(why)}"
                         for label, why in stopped.items())
        fixes = "; ".join(f"{label}: {_judge_fix(why)}" for label, why in stopped.items())
        return Check("pool", "warn", (
            f"{found}: the judge stopped {len(stopped)} label(s), so no more of their images "
            f"are made and the reservoir mixes only what the pool holds of them: {whys}"),
            f"{fixes}; then fill the pool: {pregen}")
    empty = [label for label, n in fill.items() if n == 0]
    state = ("empty" if len(empty) == len(fill) else
             f"labels {empty} empty" if empty else f"{missing} image(s) short")
    if rate <= 0 or planned == 0:
        idle = "" if pregenerate else " (pre-generation is off)"
        return Check("pool", "warn", (
            f"{found}: {state} and nothing more is being generated{idle}; the reservoir "
            "mixes only what the pool holds, and waits on the service for the rest"), pregen)
    if planned < missing:
        return Check("pool", "warn", (
            f"{found}: {state}, and the service plans only {planned} of the {missing} "
            "image(s) missing (its fill targets are lower)"), pregen)
    eta = missing / rate
    when = f"full in about {_duration(eta)}"
    if epoch_s is not None and eta <= epoch_s:
        return ok("pool", f"{found}: {when}, within the first epoch ({_duration(epoch_s)})")
    late = (f", after the first epoch ({_duration(epoch_s)}) ends" if epoch_s is not None
            else " (pass --epoch-s to compare with an epoch)")
    return Check("pool", "warn", f"{found}: {when}{late}", (
        f"fill it before training: {pregen} (it waits for the fill), or train more epochs"))


def check_sampling(detail: Mapping[str, Any], *, pregenerate: bool, url: str,
                   now: float | None = None) -> Check | None:
    """How a ``speed: auto`` recipe's pool is drawn (its detail's ``sampling``): ``ok`` once
    auto decided, naming the sampler and how much cheaper it is than the recipe's own;
    ``warn`` while it probes, naming for how long (``since``, the service's clock against
    ``now``) and why, with what draws the probes it lacks. None for a recipe that is not
    ``auto``, or a service that does not say."""
    sampling = detail.get("sampling") or {}
    if sampling.get("speed") != "auto":
        return None
    name = str(detail.get("name"))
    reason = str(sampling.get("reason") or "")
    since = sampling.get("since")
    ago = (None if not isinstance(since, int | float) else
           _minutes((time.time() if now is None else now) - float(since)))
    if sampling.get("state") == "decided":
        chosen = str((sampling.get("sampler") or {}).get("name") or "?")
        cheaper = float(sampling.get("cheaper") or 1.0)
        how = (f"{cheaper:g}x cheaper than the recipe's own sampler" if cheaper > 1 else
               "the recipe's own sampler")
        when = f" {ago} ago" if ago is not None else ""
        return ok("sampling", f"{name!r} (speed auto) decided{when}: drawn with {chosen}, "
                              f"{how} ({reason.removeprefix(chosen + ': ')})")
    found = (f"{name!r} (speed auto) has been probing for {ago}" if ago is not None else
             f"{name!r} (speed auto) is probing")
    found += f": {reason}; no cheaper sampler draws the pool until auto decides"
    if reason.startswith("every label is stopped"):
        return Check("sampling", "warn", found, "the judge's fix first (see pool), then a "
                                                "restart: probing begins again")
    fill = {str(k): int(v) for k, v in (detail.get("fill") or {}).items()}
    capacity = int(detail.get("capacity_per_label") or 0)
    from genaug.service.sampling.rule import PROBE_IMAGES  # numpy only, as the client

    # Both arms' next round of probes fits in this many per label (every accepted image is
    # judged, so a fill to it draws at least that many).
    per_label = max(fill.values(), default=0) + 2 * PROBE_IMAGES
    per_label = min(capacity, per_label) if capacity > 0 else per_label
    pregen = f"genaug pregenerate --recipe {name} --per-label {per_label} --url {url}"
    full = [label for label, n in fill.items() if capacity > 0 and n >= capacity]
    if full and not pregenerate:
        return Check("sampling", "warn", found, (
            f"label(s) {', '.join(full)} are at the pool's capacity {capacity}, so no fill "
            "draws the probes they lack: serve with GENAUG_PREGENERATE=true (the idle "
            "generator draws them) or a larger GENAUG_POOL_CAPACITY_PER_LABEL"))
    if pregenerate:
        return Check("sampling", "warn", found, (
            "probing ends as the pool fills: the idle generator draws the probes it lacks "
            f"(pre-generation is on); a fill draws them first: {pregen}"))
    return Check("sampling", "warn", found, (
        f"probing ends as the pool fills: a fill of {per_label} per label ({pregen}), or "
        "GENAUG_PREGENERATE=true, draws the probes it lacks"))


def _minutes(seconds: float) -> str:
    """How long, in minutes (a clock a little behind the service's reads as none)."""
    return "under a minute" if seconds < 60 else f"{seconds / 60:.0f} min"


def _judge_why(reason: str) -> str:
    """The finding of a stop's reason (``stopped: the judge accepted ... Fix: ...``)."""
    return reason.split(" Fix: ", 1)[0].removeprefix("stopped: ")


def _judge_fix(reason: str) -> str:
    """The fix of a stop's reason: what follows ``Fix:`` (the whole reason without one)."""
    parts = reason.split(" Fix: ", 1)
    return parts[1] if len(parts) == 2 else reason


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _model_check(info: Mapping[str, Any]) -> Check:
    model = info.get("model") or {}
    device = info.get("device") or {}
    dev = str(device.get("name") or device.get("type") or "?")
    if device.get("cuda_uuid"):
        dev += f" ({device['cuda_uuid']})"
    if not model:
        return Check("model", "warn", f"no model loaded yet on {dev}",
                     "wait for the service to finish loading (see service)")
    kind, dtype = str(model.get("kind", "?")), str(model.get("dtype", "?"))
    found = (f"{kind} from {model.get('source', '?')} (weights {str(model.get('hash', ''))[:12]})"
             f", {dtype} on {dev}")
    on_cpu = str(device.get("type", "")) == "cpu"
    if on_cpu and not kind.startswith("tiny"):
        return Check("model", "warn", f"{found}: SDXL on a CPU makes minutes per image",
                     "serve it on a GPU: genaug serve --device cuda:N")
    if not on_cpu and dtype == "float32":
        return Check("model", "warn", f"{found}: float32 on a GPU is about half the speed",
                     "genaug serve --dtype float16 (or bfloat16)")
    return ok("model", found)


# ----------------------------------------------------------------------------- the run


@dataclass
class Options:
    """What ``genaug doctor`` checks; its flags, parsed (see :func:`add_arguments`).

    Example::

        checks = run_checks(Options(url="http://127.0.0.1:8000", recipe="digits"))
        [c for c in checks if c.status != "ok"]
    """

    url: str = DEFAULT_URL
    recipe: str | None = None
    api_key: str | None = None
    slots_per_class: int = 128
    epoch_s: float | None = None
    timeout: float = 2.0
    trainer: str = "tensorflow"


def run_checks(options: Options, host: Host | None = None) -> list[Check]:
    """Every check, in the order printed. Never raises for what it finds."""
    from genaug.client import AuthenticationError, Client, GenaugError, TransportError
    from genaug.client.errors import KEY_HINT

    host = host if host is not None else Host.this_machine()
    url = options.url
    checks: list[Check] = []
    info: dict[str, Any] | None = None
    detail: dict[str, Any] | None = None
    key_note = ("--api-key" if options.api_key is not None else
                "GENAUG_API_KEY" if os.environ.get("GENAUG_API_KEY") else "no key")
    with Client(url, api_key=options.api_key, timeout=options.timeout,
                retry_deadline=0.0) as client:
        t0 = time.perf_counter()
        try:
            info = client.info()
        except AuthenticationError as exc:
            checks.append(_ready_check(client, url, "?", f"{_ms(t0):.0f} ms"))
            said = _first_line(exc).replace(KEY_HINT, "")
            checks.append(Check("api-key", "fail", f"{said} (sent: {key_note})", (
                "set GENAUG_API_KEY (or --api-key) to one of the service's keys "
                "(GENAUG_API_KEYS where it runs)")))
        except TransportError as exc:
            checks.append(Check("service", "fail", (
                f"no genaug service answers at {url} ({_cause(exc)})"), (
                "start it (genaug serve --port N) or point at it: --url URL / GENAUG_URL")))
        except GenaugError as exc:
            checks.append(Check("service", "fail", f"{url} answered: {_first_line(exc)}",
                                "check that --url is a genaug service (GET /v1/info)"))
        if info is not None:
            version = str(info.get("version", "?"))
            checks.append(ok("service", f"genaug {version} at {url} is ready ({_ms(t0):.0f} ms)")
                          if info.get("ready") else _ready_check(client, url, version, ""))
            checks.append(ok("api-key", (
                f"the service requires a key and accepts the one sent ({key_note})"
                if info.get("auth") else "the service requires no key")))
            checks.append(_model_check(info))
            recipe_check, detail = _recipe_check(client, options)
            checks.append(recipe_check)
            if detail is not None:
                pregenerate = bool((info.get("replica") or {}).get("pregenerate", True))
                checks.append(check_pool(
                    detail, slots=options.slots_per_class, epoch_s=options.epoch_s,
                    pregenerate=pregenerate, url=url))
                sampling = check_sampling(detail, pregenerate=pregenerate, url=url)
                if sampling is not None:
                    checks.append(sampling)
            checks.append(check_gpus(info, url, host))
    service_version = None if info is None else info.get("version")
    if options.trainer == "torch":  # no TensorFlow, no XLA: torch and its CUDA
        checks.append(check_torch_versions(host, service_version))
    else:
        checks.append(check_xla(host))
        checks.append(check_versions(host, service_version))
    why = ("the service did not answer" if info is None else
           f"recipe {options.recipe!r} not found" if options.recipe else "pass --recipe")
    checks.append(check_memory(detail, options.slots_per_class, host, unsized=why))
    return checks


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _cause(exc: BaseException) -> str:
    text = _first_line(exc)
    match = re.search(r"\((\w+Error: [^)]*)\)", text)
    return match.group(1) if match else text


def _ms(t0: float) -> float:
    return 1000 * (time.perf_counter() - t0)


def _ready_check(client: Client, url: str, version: str, took: str) -> Check:
    """``/readyz`` (open to all: no key needed) as a check; its detail when not ready."""
    from genaug.client import GenaugError

    name = f"genaug {version}" if version != "?" else "a genaug service"
    try:
        client.wait_ready(timeout=0.0)
    except GenaugError as exc:
        text = str(exc)
        match = re.search(r'"detail"\s*:\s*"([^"]*)"', text)
        detail = match.group(1) if match else _first_line(exc)
        return Check("service", "fail", f"{name} answers at {url} but is not ready: {detail}",
                     "wait until it has loaded and warmed up (GET /readyz turns 200), or read "
                     "the service's log for the load error")
    return ok("service", f"{name} at {url} is ready" + (f" ({took})" if took else ""))


def _recipe_check(client: Client, options: Options) -> tuple[Check, dict[str, Any] | None]:
    from genaug.client import GenaugError, NotFoundError

    name = options.recipe
    try:
        recipes = client.recipes()
    except GenaugError as exc:
        return Check("recipe", "fail", f"cannot list the recipes: {_first_line(exc)}",
                     "check the service's pool database (its log)"), None
    names = [str(r.get("name")) for r in recipes]
    if name is None:
        if not names:
            return Check("recipe", "warn", "the service has no recipes: trainers can only "
                                           "generate (no pool)",
                         "genaug serve --recipes FILE (recipes/*.yaml are examples)"), None
        listed = "; ".join(f"{r.get('name')} ({', '.join(r.get('labels') or [])})"
                           for r in recipes)
        return ok("recipe", f"recipes: {listed}; pass --recipe NAME to check one"), None
    try:
        detail: dict[str, Any] = client.recipe(name)
    except NotFoundError:
        return Check("recipe", "fail", (
            f"the service has no recipe {name!r}; it has {names or 'none'}"), (
            f"pass one of {names} with --recipe, or add {name!r} to the service's recipe "
            "file (genaug serve --recipes FILE)" if names else
            "genaug serve --recipes FILE with that recipe")), None
    except GenaugError as exc:
        return Check("recipe", "fail", f"recipe {name!r}: {_first_line(exc)}",
                     "retry; if it persists, read the service's log"), None
    height, width, channels = recipe_size(detail.get("spec") or {})
    labels = list(detail.get("labels") or [])
    return ok("recipe", f"{name!r}: {len(labels)} labels {labels}, {height}x{width}x"
                         f"{channels} images"), detail


# ----------------------------------------------------------------------------- CLI


def format_checks(checks: Sequence[Check]) -> str:
    """The text table: ``status name: found`` and, unless ok, ``fix: ...`` under it."""
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<8}  {c.message}")
        if c.fix:
            lines.append(f"{'':<16}fix: {c.fix}")
    fails = sum(c.status == "fail" for c in checks)
    warns = sum(c.status == "warn" for c in checks)
    lines.append(f"{fails} failed, {warns} warning(s), {len(checks) - fails - warns} ok")
    return "\n".join(lines)


def _default_url() -> str:
    env = os.environ.get("GENAUG_URL", "")
    return env.split(",")[0].strip() or DEFAULT_URL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``genaug doctor``; a bad value is one argparse line and exit status 2."""
    from genaug.cli import seconds, service_url, whole_number

    parser.add_argument("--url", type=service_url, default=None,
                        help=f"the service (default: GENAUG_URL, else {DEFAULT_URL})")
    parser.add_argument("--recipe", default=None,
                        help="the recipe training will sample: checks it, its pool and the "
                             "reservoir's memory")
    parser.add_argument("--api-key", default=None,
                        help="API key to send (default: GENAUG_API_KEY)")
    parser.add_argument("--slots-per-class", default=_default_slots(),
                        type=whole_number(1, fix="the reservoir holds at least one image "
                                                 "per class"),
                        help="the reservoir's slots per class, as genaug train's flag "
                             "(default %(default)s)")
    parser.add_argument("--epoch-s", type=seconds(most=None), default=None,
                        help="how long the first epoch takes: is the pool full by then?")
    parser.add_argument("--trainer", choices=("tensorflow", "torch"), default="tensorflow",
                        help="the trainer's framework: torch checks torch and its CUDA instead "
                             "of TensorFlow, Keras and XLA (genaug.torch; default "
                             "%(default)s)")
    parser.add_argument("--timeout", type=seconds(fix="e.g. 2"), default=2.0,
                        help="seconds to wait for each answer of the service")
    parser.add_argument("--json", action="store_true",
                        help='print {"checks": [{"name", "status", "message", "fix"}]}')


def _default_slots() -> int:
    from genaug.trainer.reference.config import TrainConfig  # genaug train's default, not a copy

    return int(TrainConfig().slots_per_class)


def run(args: argparse.Namespace, *, host: Host | None = None,
               write: Callable[[str], Any] | None = None) -> int:
    """Run the checks for parsed arguments; print them; 1 when any failed, else 0; 2 (one
    line) when ``GENAUG_URL``, used without ``--url``, is no service URL."""
    from genaug.urls import env_url_refusal

    refused = env_url_refusal() if args.url is None else None
    if refused is not None:
        sys.stderr.write(f"genaug doctor: {refused}\n")
        return 2
    options = Options(url=(args.url or _default_url()).rstrip("/"), recipe=args.recipe,
                      api_key=args.api_key, slots_per_class=args.slots_per_class,
                      epoch_s=args.epoch_s, timeout=args.timeout, trainer=args.trainer)
    checks = run_checks(options, host)
    out = write or sys.stdout.write
    if args.json:
        out(json.dumps({"checks": [asdict(c) for c in checks]}, indent=1) + "\n")
    else:
        out(format_checks(checks) + "\n")
    return 1 if any(c.status == "fail" for c in checks) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.doctor [flags]`` (the same as ``genaug doctor``)."""
    parser = argparse.ArgumentParser(prog="genaug doctor",
                                     description=(__doc__ or "").split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
