"""Run the reliability checks and write ``docs/reliability.md``.

    python -m reliability            # CI sizes (about two minutes on 2 cores)
    python -m reliability --full     # full sizes (8 clients x 60 s, 200 examples per operation...)
    python -m reliability --only load faults --no-write

Each check starts its own real service (tiny pipeline, uvicorn on 127.0.0.1), is bounded in
count and time, and stops it. The exit code is 0 when every row held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import CheckResult

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
COMMAND = "python -m reliability"
AREAS = ("Load", "Faults", "Hostile input", "Security")


@dataclass(frozen=True)
class Sizes:
    """How much each check does. ``CI`` fits a CI job; ``FULL`` is the issue's full size."""

    name: str
    load_clients: int
    load_seconds: float
    kill_rounds: int
    disconnects: int
    disconnect_rounds: int
    slow_seconds: float
    fuzz_examples: int
    timing_requests: int


CI = Sizes("CI", load_clients=8, load_seconds=10, kill_rounds=1, disconnects=100,
           disconnect_rounds=1, slow_seconds=4, fuzz_examples=25, timing_requests=200)
FULL = Sizes("full", load_clients=8, load_seconds=60, kill_rounds=3, disconnects=100,
             disconnect_rounds=3, slow_seconds=15, fuzz_examples=200, timing_requests=1000)


def checks(sizes: Sizes) -> list[tuple[str, str, Callable[[Any], CheckResult]]]:
    """(area, name, run(model)) in document order."""
    from . import faults, hostile, load, security

    return [
        ("Load", "load", lambda m: load.check_load(clients=sizes.load_clients,
                                                   seconds=sizes.load_seconds)),
        ("Faults", "kill_during_fill",
         lambda m: faults.check_kill_during_fill(rounds=sizes.kill_rounds)),
        ("Faults", "kill_during_training", lambda m: faults.training_reference()),
        ("Faults", "generator_exception", faults.check_generator_exception),
        ("Faults", "generator_oom", faults.check_generator_oom),
        ("Faults", "disconnects", lambda m: faults.check_disconnects(
            m, count=sizes.disconnects, rounds=sizes.disconnect_rounds)),
        ("Faults", "slow_clients", lambda m: faults.check_slow_clients(
            m, seconds=sizes.slow_seconds)),
        ("Hostile input", "fuzz", lambda m: hostile.check_fuzz(
            m, examples=sizes.fuzz_examples)),
        ("Hostile input", "size_limits", hostile.check_size_limits),
        ("Hostile input", "malformed", hostile.check_malformed),
        ("Security", "auth", lambda m: security.check_auth(
            m, timing_requests=sizes.timing_requests)),
        ("Security", "secure_defaults", security.check_secure_defaults),
    ]


def run(sizes: Sizes, only: set[str] | None = None) -> list[CheckResult]:
    from genaug.service.testing import load_tiny

    model = load_tiny()
    results: list[CheckResult] = []
    for area, name, fn in checks(sizes):
        if only and name not in only and area.lower().split()[0] not in only:
            continue
        started = time.monotonic()
        print(f"[reliability] {area} / {name} ...", file=sys.stderr, flush=True)
        try:
            result = fn(model)
        except Exception as exc:  # a crashed check is a failed row, not a lost table
            result = CheckResult(area, name)
            result.add(f"{name} (the check itself crashed)", 1, f"{type(exc).__name__}: {exc}",
                       lost="the check", ok=False, traceback=traceback.format_exc()[-2000:])
        result.seconds = time.monotonic() - started
        verdict = "held" if result.ok else "FAILED"
        print(f"[reliability]   {verdict} in {result.seconds:.1f} s",
              file=sys.stderr, flush=True)
        results.append(result)
    return results


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = ""
    try:
        load = f", load average {os.getloadavg()[0]:.1f} at start"
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs{mem}{load}; " \
           f"{platform.system()} {platform.release()}, Python {platform.python_version()}"


def _versions() -> str:
    parts = []
    for name in ("genaug", "torch", "diffusers", "fastapi", "uvicorn", "schemathesis"):
        try:
            from importlib.metadata import version

            parts.append(f"{name} {version(name)}")
        except Exception:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "service", "client"], cwd=ROOT,
                               text=True, capture_output=True, timeout=10).stdout.strip()
        parts.append(f"commit {commit}{' + local changes' if dirty else ''}")
    except (OSError, subprocess.SubprocessError):
        pass
    return ", ".join(parts)


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(results: list[CheckResult], sizes: Sizes, *, started: dt.datetime,
           seconds: float, machine_line: str) -> str:
    lines = [
        "# Reliability and security figures",
        "",
        "<!-- Generated by reliability/run.py; do not edit by hand. -->",
        "",
        f"Regenerate: `{COMMAND}` (CI sizes, about two minutes on 2 cores) or "
        f"`{COMMAND} --full` (full sizes). The tests in `tests/reliability/` run the same "
        "checks at CI size and assert on their rows (the load, kill and schemathesis runs "
        "under `make test-slow`, the rest under `make test`).",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine_line}",
        f"- Software: {_versions()}",
        f"- Size: {sizes.name} ({_sizes_line(sizes)}); run time {seconds:.0f} s",
        "- Every check runs the real service: the embedded tiny SDXL pipeline on the CPU, "
        "uvicorn on 127.0.0.1, real HTTP clients; each is bounded in count and time and "
        "stops by itself.",
        "",
    ]
    for area in AREAS:
        mine = [r for r in results if r.area == area]
        if not mine:
            continue
        lines += [f"## {area}", "",
                  "| What was tried | Times | What held | What was lost | Verdict |",
                  "|---|---:|---|---|---|"]
        for result in mine:
            for row in result.rows:
                if row.details.get("reference"):
                    verdict = "referenced"
                elif row.ok:
                    verdict = "held"
                else:
                    verdict = "**FAILED**"
                lines.append(f"| {_cell(row.what)} | {_cell(row.tried)} | {_cell(row.held)} | "
                             f"{_cell(row.lost)} | {verdict} |")
        lines.append("")
        for result in mine:
            for table in result.tables:
                lines += [f"**{table.title}**", "",
                          "| " + " | ".join(table.header) + " |",
                          "|" + "---|" * len(table.header)]
                lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
                lines.append("")
        seconds_line = ", ".join(f"{r.name} {r.seconds:.0f} s" for r in mine)
        lines += [f"Check times: {seconds_line}.", ""]
    lines += [
        "## What the schema cannot say",
        "",
        "The fuzzing rows above run `schemathesis run --checks all` against the served "
        "`/openapi.json` with a recipe loaded: what the schema admits the service accepts "
        "(operator limits are its maxima, recipe labels, schedulers and adapters its enums, "
        "`seed` stops `max_n - 1` below the largest seed, a prompt needs a non-space "
        "character (the space characters are listed in the pattern, because Python's `\\s` "
        "and JSON Schema's differ on U+001C-U+001F and U+FEFF), one output side alone keeps "
        "the aspect ratio), and what it rejects the "
        "service rejects. These answers depend on state or on content no JSON Schema "
        "describes, and are documented per route instead:",
        "",
        "- `429` (queue full, with `Retry-After`), `503` (model loading, a failed batch, the "
        "pool database unreachable; with `Retry-After` where a retry helps) and `504` (a "
        "request's `timeout_s` passed): answers to the service's state, not to the body. The "
        "schemathesis run tolerates only `/v1/generate`'s `504` "
        "(`reliability/schemathesis.toml`); the fuzzed service is ready and idle enough that "
        "a `503` would be a bug.",
        "- `413`: a body over `GENAUG_MAX_BODY_BYTES` (JSON routes) or "
        "`GENAUG_MAX_UPLOAD_BYTES` (`/v1/variants`), refused before it is parsed.",
        "- `/v1/variants` uploads (multipart): a part that is not a PNG image or a genaug "
        "safetensors batch, sources of different sizes, a size that is not a multiple of 8 or "
        "is over `max_side`, more than `max_variant_sources` sources in an `images` part, no "
        "source part or both kinds: `422` naming the part. The schema types the parts as "
        "binary (their pixels are checked after decoding), bounds the `image` parts by "
        "`max_variant_sources`, and says \"`image` parts or one `images` part\" in words: "
        "client generators give up on a multipart body with `oneOf`. The fuzzing leaves "
        "`/v1/variants` out: which bytes decode to an image no schema can say.",
        "",
        "## Not repeated here",
        "",
        "- SIGKILL of the service during a training run (training completes, the feeder "
        "reconnects after the restart): `tests/trainer/reference/test_train.py::"
        "test_service_killed_mid_fit_training_continues_and_feeder_reconnects`.",
        "- Single-request behaviour already pinned by `tests/service/api/test_generate_api.py` "
        "(429, 504, one disconnect, 422 messages, one megabyte body with Content-Length) and "
        "`tests/service/pool/test_pool_service.py` (SIGKILL during filling keeps counters "
        "consistent); `tests/service/pipeline/test_load.py` refuses a malicious pickle in "
        "`load_model`, which the Security table repeats end to end through the CLI.",
        "",
    ]
    return "\n".join(lines)


def _sizes_line(s: Sizes) -> str:
    return (f"load {s.load_clients} clients x {s.load_seconds:.0f} s, {s.kill_rounds} kill "
            f"round(s), {s.disconnects} disconnects x {s.disconnect_rounds}, slow clients "
            f"{s.slow_seconds:.0f} s, {s.fuzz_examples} schemathesis examples per operation, "
            f"{s.timing_requests} timing requests per key")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="full sizes (minutes, not one)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="check names or areas (load, faults, hostile, security, fuzz, ...)")
    parser.add_argument("--out", type=Path, default=DOC, help=f"document (default {DOC})")
    parser.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    parser.add_argument("--verbose", action="store_true",
                        help="show the services' logs (the injected faults log errors)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.CRITICAL)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = FULL if args.full else CI
    started = dt.datetime.now(dt.UTC)
    machine_line = machine()
    t0 = time.monotonic()
    results = run(sizes, set(args.only) if args.only else None)
    text = render(results, sizes, started=started, seconds=time.monotonic() - t0,
                  machine_line=machine_line)
    if args.no_write:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"[reliability] wrote {args.out}", file=sys.stderr)
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(r.explain(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
