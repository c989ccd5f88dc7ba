"""Run a few steps of a PyTorch input pipeline fed from genaug and say what goes wrong, with a
fix for each: the PyTorch path's typical failures.

:func:`diagnose` looks at a ``DataLoader`` over a :class:`~genaug.torch.dataset.PoolDataset` or
:class:`~genaug.torch.dataset.MixedDataset` and answers a :class:`Finding` per check:

======== ==================================================================================
check    what it finds
======== ==================================================================================
fork     a genaug stream or client already running in this process when the DataLoader
         forks its workers (a forked worker gets a copy of its connections without the
         thread that serves them): iterate the dataset only inside the DataLoader, close
         the client first, or use ``multiprocessing_context="spawn"``
service  the streams' requests failing (the service down, refusing, or out of reach)
starved  the mix asked the pool for images its reservoirs did not hold (a class still empty:
         the pool fills slower than the trainer draws)
reuse    the run drew each image the pool holds many times over while the pool made few new
         ones: the pool is too small for the trainer's rate
waits    a step that waited more than a second for its batch
======== ==================================================================================

Example::

    for finding in diagnose(loader, steps=50):
        print(finding)
"""

from __future__ import annotations

import gc
import multiprocessing
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .dataset import THREAD_OWNED, MixedDataset, PoolDataset
from .stream import live_streams

__all__ = ["Finding", "diagnose"]

#: Draws per image the pool holds, in one diagnose run, beyond which the pool is called too
#: small for the trainer (a run is seconds: an epoch repeats each image far more).
REUSE_LIMIT = 10.0


@dataclass(frozen=True)
class Finding:
    """One check's answer: ``ok``, ``warn`` or ``fail``, what it found and the fix."""

    check: str
    status: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.status:<4} {self.check:<8} {self.message}"
        return text + (f"\n              fix: {self.fix}" if self.fix else "")


def _forks(loader: Any) -> bool:
    if int(getattr(loader, "num_workers", 0)) == 0:
        return False
    context = getattr(loader, "multiprocessing_context", None)
    method = (context.get_start_method() if context is not None
              else multiprocessing.get_start_method(allow_none=True) or "fork")
    return method == "fork"


def _open_clients() -> int:
    """genaug clients alive in this process and not closed, but for those a need poster's
    thread holds for a moment (no forked worker can reach them)."""
    from genaug.client import AsyncClient, Client

    with warnings.catch_warnings():  # isinstance on some of torch's deprecated objects warns
        warnings.simplefilter("ignore")
        return sum(1 for obj in gc.get_objects() if isinstance(obj, Client | AsyncClient)
                   and not getattr(getattr(obj, "_http", None), "is_closed", True)
                   and obj not in THREAD_OWNED)


def _pool_of(dataset: Any) -> PoolDataset | None:
    if isinstance(dataset, MixedDataset):
        return dataset.pool
    return dataset if isinstance(dataset, PoolDataset) else None


def diagnose(loader: Any, *, steps: int = 50) -> list[Finding]:
    """Check the fork hazard, then run ``steps`` batches of ``loader`` and report what the
    streams did (module doc). Never trains; the loader's iterator is closed at the end."""
    findings: list[Finding] = []
    streams, clients = live_streams(), _open_clients()
    if _forks(loader) and (streams or clients):
        what = (f"{len(streams)} genaug stream(s)" if streams else f"{clients} genaug client(s)")
        findings.append(Finding("fork", "warn", (
            f"{what} already running in this process, and the DataLoader forks its "
            f"{loader.num_workers} workers: each gets a copy of their connections without "
            "the threads that serve them"), (
            "iterate the dataset only inside the DataLoader (not once in the main process "
            "first), close your own genaug Client before the loader starts, or pass "
            "multiprocessing_context='spawn'")))
    else:
        findings.append(Finding("fork", "ok", "nothing of genaug runs in this process before "
                                "the workers start"))
    pool = _pool_of(loader.dataset)
    before = pool.stats() if pool is not None else {}
    waits: list[float] = []
    started = time.monotonic()
    iterator: Iterator[Any] = iter(loader)
    try:
        for _ in range(steps):
            t0 = time.monotonic()
            try:
                next(iterator)
            except StopIteration:
                break
            waits.append(time.monotonic() - t0)
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    seconds = time.monotonic() - started
    if pool is None:
        findings.append(Finding("service", "warn", "the loader's dataset is not a genaug "
                                "PoolDataset or MixedDataset: nothing else to check"))
        return findings
    after = pool.stats()
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    findings += _stream_findings(loader, delta, waits, seconds, _pool_detail(pool))
    return findings


def _pool_detail(pool: PoolDataset) -> dict[str, Any] | None:
    """The recipe's detail (its fill and generation rate), or None when it cannot be read."""
    from genaug.client import Client

    try:
        with Client(pool.config.url, api_key=pool.config.api_key, retry_deadline=5.0,
                    **dict(pool.config.client_kwargs)) as client:
            return dict(client.recipe(pool.config.recipe))
    except Exception:
        return None


def _stream_findings(loader: Any, delta: dict[str, float], waits: list[float],
                     seconds: float, detail: dict[str, Any] | None) -> list[Finding]:
    out: list[Finding] = []
    if delta["failures"] > 0:
        out.append(Finding("service", "warn", (
            f"{delta['failures']:.0f} request(s) to the service failed during the run; the "
            "streams drew from what they held"), (
            "check the service (`genaug doctor --url URL --recipe NAME`); training goes on "
            "meanwhile")))
    else:
        out.append(Finding("service", "ok", "every request to the pool was answered"))
    if isinstance(loader.dataset, MixedDataset) and delta["asked"] > 0:
        got = delta["synthetic"] / delta["asked"]
        if got < 0.5:
            out.append(Finding("starved", "warn", (
                f"only {delta['synthetic']:.0f} of the {delta['asked']:.0f} examples the mix "
                f"gave to the pool were synthetic ({100 * got:.0f} %): their classes held no "
                "image yet"), (
                "fill the pool before training (genaug pregenerate --recipe NAME --per-label "
                "N), keep the workers (persistent_workers=True) so reservoirs last across "
                "epochs, or lower p")))
        else:
            out.append(Finding("starved", "ok", (
                f"{100 * got:.0f} % of the examples given to the pool were synthetic")))
    drawn = delta["synthetic"]
    if drawn > 0 and detail is not None:
        held = sum(int(v) for v in (detail.get("fill") or {}).values())
        made = float(detail.get("generation_rate") or 0.0)
        rate = drawn / max(seconds, 1e-9)
        reuse = drawn / max(1, held)
        found = (f"{drawn:.0f} images drawn in {seconds:.0f} s ({rate:.0f}/s) from a pool of "
                 f"{held} that makes {made:.1f}/s: each drawn {reuse:.1f} times")
        if reuse > REUSE_LIMIT and made * 10 < rate:
            out.append(Finding("reuse", "warn", found + ": the pool is too small for this "
                               "trainer's rate", (
                "raise the pool (GENAUG_POOL_CAPACITY_PER_LABEL and genaug pregenerate, or a "
                "fill job), lower p, or train fewer steps per epoch on synthetic images")))
        else:
            out.append(Finding("reuse", "ok", found))
    slow = [w for w in waits[1:] if w > 1.0]  # the first batch starts the workers
    if slow:
        out.append(Finding("waits", "warn", (
            f"{len(slow)} of {len(waits) - 1} steps waited more than a second for their "
            f"batch (longest {max(slow):.1f} s)"), (
            "more DataLoader workers (num_workers), a lighter transform, or prefetch_factor")))
    else:
        longest = max(waits[1:], default=0.0)
        out.append(Finding("waits", "ok", f"no step waited more than a second (longest "
                                          f"{longest:.2f} s)"))
    return out
