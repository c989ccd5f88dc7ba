"""One ``genaug gain`` run: read the folder, fetch each arm's images, train every cell, report.

:func:`run_gain` is the whole of it, for ``genaug gain`` and for Python. Everything a run
makes lives in ``OUT``: the report (``gain.json``, ``gain.md``, ``gain.png``), every finished
cell (``gain-cells.jsonl``, one line each, written as it finishes) and the work folder
``OUT/.gain`` (the data at the classifier's size, each arm's images). A run killed at any
point continues from its last finished cell when started again with the same settings, and
says so; with other settings it refuses in one line (use another ``--out``).

Cells train in child processes (:mod:`~genaug.gain.child`), one per core it may use
(``jobs``), each on one thread. The arms' images are fetched once per run (the pool), once per
seed (variants) or once per ``k`` and seed (adapted), before training.

Example::

    report = run_gain(GainSettings(data=Path("DATA"), recipe="digits",
                                   url="http://127.0.0.1:8000", shots=(1, 5), seeds=5))
    for line in report.lines: print(line)
"""

from __future__ import annotations

import json
import math
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genaug.mixing import default_share

from .data import GainInputError, Images, read_folder
from .plan import Cell, Split, cells, default_test_per_label
from .report import REAL, summarise, verdict_line, write_report
from .settings import ARMS, DEFAULT_ARMS, GainSettings
from .sources import (
    fetch_pool,
    fetch_variants,
    load_source,
    read_extra,
    recipe_prompts,
    save_source,
)

__all__ = ["ARMS", "DEFAULT_ARMS", "GainReport", "GainSettings", "run_gain"]

#: Arms that need a running service.
SERVICE_ARMS = ("pool", "variants")

Say = Callable[[str], None]


@dataclass
class GainReport:
    """A finished run: ``summary`` rows (arm, k, mean, low, high, seeds, verdict), every
    ``cells`` row, the report's ``paths`` and its verdict ``lines``."""

    summary: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    paths: dict[str, Path]
    lines: list[str]


def _framework(asked: str | None) -> str:
    """``torch`` or ``tensorflow``: the one asked, else the one installed (torch first: it
    trains the small CNN faster on a CPU)."""
    import importlib.util

    if asked in ("tf", "tensorflow"):
        return "tensorflow"
    if asked == "torch":
        return "torch"
    if asked is not None:
        raise GainInputError(f"--framework {asked!r}: use tf or torch")
    for name, module in (("torch", "torch"), ("tensorflow", "tensorflow")):
        if importlib.util.find_spec(module) is not None:
            return name
    raise GainInputError("neither torch nor tensorflow is installed: pip install "
                         "'genaug[torch]' or 'genaug[trainer]', or give --train module:function")


def _check(settings: GainSettings) -> list[str]:
    """The arms, ``real`` first; refusals of settings that cannot work, each one line."""
    if not settings.shots or min(settings.shots) < 1:
        raise GainInputError(f"--shots {settings.shots}: give whole numbers >= 1, e.g. 1,5,10")
    if settings.seeds < 2:
        raise GainInputError(f"--seeds {settings.seeds}: at least 2, for an interval")
    unknown = [a for a in settings.arms if a not in ARMS]
    if unknown:
        raise GainInputError(f"--arms: unknown arm(s) {', '.join(unknown)}; the arms are "
                             f"{', '.join(ARMS)}, and --extra NAME=DIR adds one")
    clash = [n for n in settings.extra if n in ARMS]
    if clash:
        raise GainInputError(f"--extra {clash[0]}=...: {clash[0]!r} is a built-in arm; name it "
                             "otherwise")
    arms = [REAL, *[a for a in settings.arms if a != REAL], *settings.extra]
    if any(a in SERVICE_ARMS or a == "adapted" for a in arms) and not settings.recipe:
        raise GainInputError("--recipe NAME is needed for the pool, variants and adapted arms "
                             "(the recipe whose labels are DATA's folders)")
    if settings.match not in ("auto", "none"):
        raise GainInputError(f"--match {settings.match!r}: use auto or none")
    if settings.share is not None and not 0.0 <= settings.share <= 1.0:
        raise GainInputError(f"--share {settings.share}: a number in [0, 1], or leave it out "
                             "for the default that falls with k")
    return arms


def _client(settings: GainSettings, say: Say) -> Any:
    from genaug.client import Client, GenaugError

    url = settings.url or os.environ.get("GENAUG_URL") or "http://127.0.0.1:8000"
    client = Client(url, api_key=settings.api_key, client_id="genaug-gain", retry_deadline=10.0)
    try:
        client.wait_ready(timeout=30.0)
    except (GenaugError, TimeoutError) as exc:
        client.close()
        raise GainInputError(
            f"the service at {url} is not reachable or not ready ({exc}); start one (genaug "
            "serve --recipes FILE), give its --url, or leave the pool and variants arms out "
            "(--arms real --extra NAME=DIR)") from exc
    say(f"service {url}: ready")
    return client


class _Work:
    """The run's folder (module doc)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out / ".gain"
        self.cells = out / "gain-cells.jsonl"
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def claim(self, fingerprint: str) -> None:
        """Take the folder for a run of ``fingerprint`` (the settings its cells depend on);
        a folder of another run is refused in one line."""
        stamp = self.root / "run.json"
        if stamp.is_file():
            kept = json.loads(stamp.read_text())
            if kept.get("fingerprint") != fingerprint:
                raise GainInputError(
                    f"{self.out} holds a run with other settings (data, size, steps, "
                    "framework, match, share, per-label...); give another --out, or delete "
                    f"{self.out} to start over")
        else:
            stamp.write_text(json.dumps({"fingerprint": fingerprint}))

    def finished(self) -> dict[str, dict[str, Any]]:
        done: dict[str, dict[str, Any]] = {}
        if self.cells.is_file():
            for line in self.cells.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill: that cell runs again
                    continue
                done[f"{row['arm']}/k{row['k']}/s{row['seed']}"] = row
        return done

    def record(self, row: dict[str, Any]) -> None:
        with self._lock, self.cells.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _originals(settings: GainSettings, data: Images) -> list[Path]:
    return [Path(settings.data) / f for f in data.files]


def _shot_order(split: Split, data: Images, k_max: int, seed: int) -> dict[int, np.ndarray]:
    shots = split.shots(data, k_max, seed)
    return {label: shots[label * k_max:(label + 1) * k_max] for label in range(len(data.names))}


def _sources(settings: GainSettings, pending: Sequence[Cell], data: Images, split: Split,
             work: _Work, say: Say) -> None:
    """Fetch what the pending cells' arms mix in (module doc). The service's refusal of
    what was asked (a 4xx: the fill over the pool's capacity, say) is a
    :class:`GainInputError` naming it; its failure (no answer, a 5xx) a ``RuntimeError``."""
    from genaug.client import (
        AuthenticationError,
        GenaugError,
        InvalidRequestError,
        NotFoundError,
    )

    try:
        _fetch(settings, pending, data, split, work, say)
    except (InvalidRequestError, NotFoundError, AuthenticationError) as exc:
        raise GainInputError(f"the service refused: {exc}") from exc
    except GenaugError as exc:
        raise RuntimeError(f"the service failed: {exc}") from exc


def _fetch(settings: GainSettings, pending: Sequence[Cell], data: Images, split: Split,
           work: _Work, say: Say) -> None:
    needed = {c.arm for c in pending}
    folder = work.root / "sources"
    client = None
    try:
        if needed & set(SERVICE_ARMS):
            client = _client(settings, say)
            detail = client.recipe(settings.recipe)
            prompts = recipe_prompts(detail, data.names, str(settings.recipe))
        if "pool" in needed and load_source(folder / "pool.npz") is None:
            save_source(folder / "pool.npz", fetch_pool(
                client, str(settings.recipe), data.names, per_label=settings.per_label, say=say))
        if "variants" in needed:
            size = int(detail["spec"]["height"])
            seeds = sorted({c.seed for c in pending if c.arm == "variants"})
            originals = _originals(settings, data)
            total = len(seeds) * len(data.names) * sum(
                math.ceil(settings.per_label / min(k for k in settings.shots if k > p))
                for p in range(max(settings.shots)))
            made = [0]
            started = time.monotonic()

            def progress(n: int) -> None:
                made[0] += n
                if made[0] % 200 < n or made[0] >= total:
                    say(f"variants: {made[0]} of about {total} images "
                        f"({time.monotonic() - started:.0f} s)")

            for seed in seeds:
                path = folder / f"variants-s{seed}.npz"
                have = load_source(path)
                order = _shot_order(split, data, max(settings.shots), seed)
                wanted = {int(s) for o in order.values() for s in o}
                if have is not None and wanted <= set(have.shots.tolist()):
                    continue
                save_source(path, fetch_variants(
                    client, data, originals, order, prompts, shots=settings.shots,
                    per_label=settings.per_label, strength=settings.strength, size=size,
                    seed=seed, have=have, progress=progress))
        for name, directory in settings.extra.items():
            if name in needed and load_source(folder / f"extra-{name}.npz") is None:
                save_source(folder / f"extra-{name}.npz",
                            read_extra(name, directory, data.names, per_label=settings.per_label))
        if "adapted" in needed:
            from .adapted import fetch_adapted

            fetch_adapted(settings, data, split, [c for c in pending if c.arm == "adapted"],
                          folder, say)
    finally:
        if client is not None:
            client.close()


def _spec(settings: GainSettings, cell: Cell, data: Images, split: Split) -> dict[str, Any]:
    shots = split.shots(data, cell.k, cell.seed)
    share = settings.share if settings.share is not None else default_share(cell.k)
    spec: dict[str, Any] = {"key": cell.key, "seed": cell.seed, "shots": shots.tolist(),
                            "share": share, "steps": settings.steps, "match": settings.match,
                            "floor": settings.min_agreement, "source": None}
    if settings.validate:
        spec["test"] = split.validation(data, max(settings.shots), settings.validate,
                                        cell.seed).tolist()
    if cell.arm == "pool":
        spec["source"] = "pool"
    elif cell.arm == "variants":
        spec["source"] = f"variants-s{cell.seed}"
        spec["per_shot"] = math.ceil(settings.per_label / cell.k)
    elif cell.arm == "adapted":
        spec["source"] = f"adapted-k{cell.k}-s{cell.seed}"
    elif cell.arm != REAL:
        spec["source"] = f"extra-{cell.arm}"
    return spec


def _train(settings: GainSettings, framework: str, specs: list[dict[str, Any]],
           cell_of: dict[str, Cell], work: _Work, say: Say,
           progress: Callable[[int, int], None] | None) -> None:
    """Run ``specs`` over the child processes; record each result as it comes."""
    from genaug.local_service import start_child, stop_child

    from .child import RESULT

    jobs = max(1, min(settings.jobs or (os.cpu_count() or 1), len(specs)))
    todo: queue.Queue[dict[str, Any] | None] = queue.Queue()
    for spec in specs:
        todo.put(spec)
    failures: list[str] = []
    finished = [0]
    lock = threading.Lock()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3"}

    def worker() -> None:
        proc = start_child([sys.executable, "-m", "genaug.gain.child", str(work.root),
                            framework, settings.train or ""], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            while True:
                try:
                    spec = todo.get_nowait()
                except queue.Empty:
                    return
                if spec is None or failures:
                    return
                proc.stdin.write(json.dumps(spec) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                while line and not line.startswith(RESULT):
                    line = proc.stdout.readline()
                if not line:
                    err = proc.stderr.read() if proc.stderr is not None else ""
                    failures.append(err.strip().splitlines()[-1] if err.strip() else
                                    f"the training child ended (status {proc.poll()})")
                    return
                got = json.loads(line[len(RESULT):])
                cell = cell_of[got["key"]]
                work.record({"arm": cell.arm, "k": cell.k, "seed": cell.seed,
                             "accuracy": got["accuracy"],
                             **{k: got[k] for k in ("agreement", "mixed") if k in got}})
                with lock:
                    finished[0] += 1
                    if progress is not None:
                        progress(finished[0], len(specs))
        finally:
            proc.stdin.close()
            stop_child(proc, grace_s=5.0)

    threads = [threading.Thread(target=worker, name=f"gain-train-{i}", daemon=True)
               for i in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
    if failures:
        raise RuntimeError(f"training failed: {failures[0]}")


def _machine() -> str:
    return f"{platform.node()}: {platform.machine()}, {os.cpu_count()} CPUs, Python " \
           f"{platform.python_version()}"


def run_gain(settings: GainSettings, *, say: Say = print,
             progress: Callable[[int, int], None] | None = None) -> GainReport:
    """Measure (module doc); ``say`` is told what happens, ``progress(done, total)`` after
    each cell. Raises :class:`~genaug.gain.data.GainInputError` (one line) for a mistake in
    the settings or the data."""
    arms = _check(settings)
    framework = "custom" if settings.train else _framework(settings.framework)
    if settings.train:
        from .child import load_train_function

        try:
            load_train_function(settings.train)
        except ValueError as exc:
            raise GainInputError(str(exc)) from exc
    data = read_folder(settings.data, size=settings.size)
    if data.skipped:
        say(f"{len(data.skipped)} file(s) of DATA are not images that can be read, skipped "
            f"(first: {data.skipped[0]})")
    most = max(settings.shots)
    smallest = min(data.count(n) for n in data.names)
    test_per_label = settings.test_per_label or default_test_per_label(smallest, most)
    split = Split.of(data, test_per_label=test_per_label,
                     most_shots=most + (settings.validate or 0))
    work = _Work(Path(settings.out))
    # The test split depends on the resolved test size: part of what the cells depend on.
    work.claim(f"{settings.fingerprint()}-t{test_per_label}-s{data.pixels.shape[1]}")
    np.savez(work.root / "data.npz", pixels=data.pixels, labels=data.labels, test=split.test,
             num_classes=np.int64(len(data.names)))
    every = cells(arms, settings.shots, settings.seeds)
    done = work.finished()
    pending = [c for c in every if c.key not in done]
    if done:
        say(f"resuming {settings.out}: {len(every) - len(pending)} of {len(every)} cells "
            "already trained")
    say(f"{len(data.names)} labels, {len(data.pixels)} images at "
        f"{data.pixels.shape[1]}x{data.pixels.shape[2]}x{data.pixels.shape[3]}, "
        f"{test_per_label} per label held out for the test; arms {', '.join(arms)}; "
        f"k = {', '.join(map(str, settings.shots))}; {settings.seeds} seeds; {framework}")
    if pending:
        _sources(settings, pending, data, split, work, say)
        specs = [_spec(settings, c, data, split) for c in pending]
        _train(settings, framework, specs, {c.key: c for c in pending}, work, say, progress)
    rows = [r for key, r in work.finished().items()
            if any(key == c.key for c in every)]
    summary = summarise(rows, arms=arms, shots=settings.shots)
    meta = {
        "data": str(settings.data), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(), "command": settings.command,
        "settings": {"framework": framework, "size": data.pixels.shape[1],
                     "channels": int(data.pixels.shape[3]), "steps": settings.steps,
                     "per_label": settings.per_label, "strength": settings.strength,
                     "match": settings.match, "min_agreement": settings.min_agreement,
                     "recipe": settings.recipe,
                     "share": "auto: min(0.5, 2 / (k + 2))" if settings.share is None
                     else settings.share, "test_per_label": test_per_label,
                     "scored_on": f"validation: {settings.validate} per label of the "
                     "training side, never the test split" if settings.validate
                     else "the test split",
                     "train": settings.train or "built-in CNN"},
        "labels": list(data.names),
        "test_split": split.test_files(data),
        "skipped": list(data.skipped),
    }
    paths = write_report(Path(settings.out), rows, summary, meta)
    lines = [verdict_line(r) for r in summary]
    return GainReport(summary, rows, paths, lines)

