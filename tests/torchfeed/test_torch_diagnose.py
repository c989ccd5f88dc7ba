"""diagnose() on real loaders: a stream started before the DataLoader forks is called out, a
pool far smaller than what a trainer draws is called too small, and each says its fix."""

from __future__ import annotations

import threading
from typing import Any

from _torch_shapes import RealShapes
from torch.utils.data import DataLoader

from genaug.client import Client
from genaug.torch import MixedDataset, PoolDataset, diagnose


def _by_check(findings: list[Any]) -> dict[str, Any]:
    return {f.check: f for f in findings}


def test_a_stream_started_before_the_workers_fork_is_called_out(
        pool_service: Any, real_shapes: RealShapes) -> None:
    pool = PoolDataset(pool_service.url, "shapes", trainer_id="forked")
    next(iter(pool))  # the habit that bites: one look in the main process first
    loader = DataLoader(MixedDataset(real_shapes, pool, p=0.5), batch_size=10,
                        num_workers=2, multiprocessing_context="fork")
    found = _by_check(diagnose(loader, steps=4))
    assert found["fork"].status == "warn" and "spawn" in found["fork"].fix
    assert found["service"].status == "ok" and found["waits"].status in ("ok", "warn")
    spawned = DataLoader(MixedDataset(real_shapes, PoolDataset(pool_service.url, "shapes"),
                                      p=0.5), batch_size=10, num_workers=1,
                         multiprocessing_context="spawn")
    assert _by_check(diagnose(spawned, steps=2))["fork"].status == "ok"


def test_an_open_client_of_yours_is_called_out_a_need_report_in_flight_is_not(
        pool_service: Any, real_shapes: RealShapes, monkeypatch: Any) -> None:
    """Your own Client open when the workers fork is the hazard; the client a need report's
    thread holds while it posts lives on that thread alone (no worker can reach it), so a
    report still in flight when diagnose runs, as after an epoch's report_need, is not."""
    pool = PoolDataset(pool_service.url, "shapes", trainer_id="reporting")
    loader = DataLoader(MixedDataset(real_shapes, pool, p=0.5), batch_size=10,
                        num_workers=1, multiprocessing_context="fork")
    with Client(pool_service.url):
        found = _by_check(diagnose(loader, steps=1))["fork"]
        assert found.status == "warn" and "1 genaug client(s)" in found.message, found
    posting, release = threading.Event(), threading.Event()
    feedback = Client.feedback

    def held(self: Client, *args: Any, **kwargs: Any) -> Any:
        posting.set()
        release.wait(30)
        return feedback(self, *args, **kwargs)

    monkeypatch.setattr(Client, "feedback", held)
    pool.report_need({"circle": 0.5, "square": 0.1})
    try:
        assert posting.wait(30)
        assert _by_check(diagnose(loader, steps=1))["fork"].status == "ok"
    finally:
        release.set()
    pool.report_need({"circle": 0.0, "square": 0.0})  # withdrawn: the module's pool as it was


def test_a_pool_too_small_for_the_trainers_rate_is_said_with_its_fix(
        make_service: Any, tmp_path: Any, shapes_recipes_file: Any) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, max_batch_images=8)
    with Client(live.url) as client:
        client.fill("shapes", per_label=4).wait(timeout=120, progress=False)
    pool = PoolDataset(live.url, "shapes", trainer_id="hungry")
    loader = DataLoader(pool, batch_size=64)
    found = _by_check(diagnose(loader, steps=50))
    reuse = found["reuse"]
    assert reuse.status == "warn" and "from a pool of 12" in reuse.message, reuse
    assert "GENAUG_POOL_CAPACITY_PER_LABEL" in reuse.fix
    assert str(reuse).startswith("warn reuse")
