"""This checkout's service against another revision's, side by side in one run.

For a change that should not move a figure (a refactor, a dependency bump): both services run
at once as ``python -m genaug.service`` children with the same settings, one importing this
working tree (or the revision ``--new``), the other the revision ``--old`` checked out into a
temporary git worktree (its ``service/``, ``client/`` and ``trainer/`` folders linked into a
``genaug`` package the way ``pyproject.toml`` maps them, so nothing is installed). Each
service gets a two-label recipe (64x64, 1 step) and ``pool_capacity_per_label=100``, fills
it, and then answers, in interleaved rounds (old, new, new, old, ...):

* pool samples of ``n=1`` (the fixed cost of a call) and ``n=64`` through the sync client;
* generation at saturation: 4 coroutines asking for 8 images each, ``max_batch_images=8``.

The table gives each side's p50 and the ratio new / old (for latency, under 1 is faster).

    python -m bench.service.compare_trees --old REV [--new REV] [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, interleave, main, make_parser, percentile, table
from bench.services import (
    child_env,
    saturate,
    settings_args,
    wait_generated,
    wait_ready,
    write_recipe,
)

N = 64
MAX_BATCH = 8


@contextlib.contextmanager
def checkout(rev: str, folder: Path) -> Iterator[Path]:
    """``rev`` checked out under ``folder`` as an importable ``genaug`` package; yields the
    directory to put first on ``PYTHONPATH``."""
    work = folder / "checkout"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(work), rev],
                   check=True, capture_output=True)
    try:
        yield importable(work, folder / "path")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work)],
                       check=False, capture_output=True)


def importable(tree: Path, dest: Path) -> Path:
    """A ``genaug`` package under ``dest`` made of links into the checkout ``tree``, laid out
    as ``pyproject.toml`` maps it; returns ``dest`` (for ``PYTHONPATH``)."""
    package = dest / "genaug"
    package.mkdir(parents=True)
    for item in (tree / "genaug").iterdir():
        (package / item.name).symlink_to(item)
    for sub in ("service", "client", "trainer"):
        (package / sub).symlink_to(tree / sub)
    return dest


@contextlib.contextmanager
def child(python_path: Path, threads: int, settings: dict[str, Any]) -> Iterator[str]:
    from genaug.local_service import free_port, running_service

    env = child_env(threads)
    env["PYTHONPATH"] = str(python_path)
    port = free_port()
    # -P: the current directory stays off the import path. Run from a checkout, it would put
    # that checkout's genaug/ first and the editable install would map genaug.service to it:
    # both sides would then run the same code.
    with running_service(port, extra_args=settings_args(settings), env=env,
                         entry=("-P", "-m", "genaug.service")) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        yield url


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "")
    parser.add_argument("--old", required=True, help="the git revision to compare against")
    parser.add_argument("--new", help="a git revision instead of this working tree")
    args = parser.parse_args(argv)
    import httpx

    from genaug.client import AsyncClient, Client

    rounds = 4 if args.quick else 8
    per_round = 30 if args.quick else 100
    gen_requests = 8 if args.quick else 24
    capacity = 100
    ms: dict[str, list[float]] = {}
    rate: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="genaug-compare-") as tmp:
        folder = Path(tmp)
        recipes = write_recipe(folder, labels=("A", "B"), steps=1)
        with contextlib.ExitStack() as stack:
            old_path = stack.enter_context(checkout(args.old, folder / "old"))
            if args.new:
                new_path = stack.enter_context(checkout(args.new, folder / "new"))
            else:
                new_path = importable(ROOT, folder / "new")
            urls: dict[str, str] = {}
            for side, path in (("old", old_path), ("new", new_path)):
                settings = {"recipes": recipes, "pool_path": folder / f"{side}.db",
                            "pool_capacity_per_label": capacity,
                            "max_batch_images": MAX_BATCH}
                urls[side] = stack.enter_context(child(path, args.threads, settings))
            http = stack.enter_context(httpx.Client(timeout=120))
            for url in urls.values():
                wait_generated(http, url, "bench", 2 * capacity)
            time.sleep(0.3)
            clients = {side: stack.enter_context(Client(url, timeout=60))
                       for side, url in urls.items()}
            for client in clients.values():
                for _ in range(10):
                    client.sample("bench", n=N)
                    client.sample("bench", n=1)

            def sampler(side: str, n: int) -> Any:
                def phase() -> float:
                    out = ms.setdefault(f"{side} n={n}", [])
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        got = clients[side].sample("bench", n=n)
                        out.append((time.perf_counter() - t0) * 1000)
                        assert len(got) == n
                    return 0.0
                return phase

            def generator(side: str) -> Any:
                def phase() -> float:
                    async def go() -> float:
                        async with AsyncClient(urls[side], timeout=120) as client:
                            return await saturate(client, concurrency=4,
                                                  requests=gen_requests, n=MAX_BATCH)
                    value = asyncio.run(go())
                    rate.setdefault(side, []).append(value)
                    return value
                return phase

            phases = {}
            for side in ("old", "new"):
                phases[f"{side} n=1"] = sampler(side, 1)
                phases[f"{side} n={N}"] = sampler(side, N)
                phases[f"{side} generate"] = generator(side)
            interleave(rounds, phases)

    rows: list[list[Any]] = []
    result: dict[str, Any] = {"benchmark": "compare_trees", "old": args.old,
                              "new": args.new or "working tree"}
    for n in (1, N):
        old, new = percentile(ms[f"old n={n}"], 50), percentile(ms[f"new n={n}"], 50)
        rows.append([f"pool sample n={n}, p50 ms", old, new, new / old])
        result[f"sample_n{n}_p50_ms"] = {"old": old, "new": new, "ratio": new / old}
    old_rate = percentile(rate["old"], 50)
    new_rate = percentile(rate["new"], 50)
    rows.append([f"generate at saturation, images/s (median of {rounds})",
                 old_rate, new_rate, new_rate / old_rate])
    result["generate_images_per_s"] = {"old": old_rate, "new": new_rate,
                                       "ratio": new_rate / old_rate}
    table(f"{args.new or 'This working tree'} against {args.old}: {rounds} interleaved rounds, "
          f"{per_round} samples per round and size, generation {gen_requests} x {MAX_BATCH} "
          "images per round",
          ["measure", "old", "new", "new / old"], rows)
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
