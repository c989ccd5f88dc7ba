"""genaug.torch against a real service: a PoolDataset's stream, in the process that trains and
in DataLoader workers (fork and spawn, persistent or not), a MixedDataset's ratio and its
fallback to real images, the trainer's one identity, its need, and its mistakes said."""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
import pytest
import torch
from _torch_shapes import RealShapes, clients_of
from torch.utils.data import DataLoader

from genaug.torch import MixedDataset, PoolDataset
from genaug.torch.stream import StreamError


def test_a_pool_dataset_yields_the_recipes_images_and_labels(pool_service: Any) -> None:
    pool = PoolDataset(pool_service.url, "shapes", length=48, seed=3, trainer_id="nb-1")
    items = list(pool)
    assert len(items) == 48
    image, label = items[0]
    assert image.dtype == torch.float32 and tuple(image.shape) == (3, 32, 32)
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert label.dtype == torch.int64 and label.ndim == 0
    labels = [int(lab) for _, lab in items]
    assert set(labels) == {0, 1, 2} and min(labels.count(c) for c in range(3)) >= 6  # balanced
    assert pool.label_map() == {"circle": 0, "square": 1, "triangle": 2}  # the recipe's order
    assert pool.stats()["synthetic"] == 48 and pool.stats()["received"] > 0
    assert "nb-1/r0/w-" in clients_of(pool_service.url)


@pytest.mark.parametrize(("context", "persistent"), [("fork", False), ("spawn", True)])
def test_each_worker_draws_its_own_stream_under_the_trainers_name(
        pool_service: Any, context: str, persistent: bool) -> None:
    trainer = f"run-{context}"
    pool = PoolDataset(pool_service.url, "shapes", length=40, trainer_id=trainer, seed=0)
    loader = DataLoader(pool, batch_size=8, num_workers=2, multiprocessing_context=context,
                        persistent_workers=persistent)
    for _ in range(2):  # two epochs: each hands out exactly `length`
        batches = list(loader)
        assert sum(len(labels) for _, labels in batches) == 40
        images, labels = batches[0]
        assert tuple(images.shape) == (8, 3, 32, 32) and labels.dtype == torch.int64
    ours = sorted(c for c in clients_of(pool_service.url) if c.startswith(trainer + "/"))
    assert ours == [f"{trainer}/r0/w0", f"{trainer}/r0/w1"]
    stats = pool.stats()  # the workers' counters, read in the process that trains
    assert stats["synthetic"] == 80 and stats["iterations"] == 4
    assert stats["received"] > 0


def test_the_memory_setting_bounds_a_trainer_process_whatever_its_workers(
        pool_service: Any) -> None:
    budget = 0.5  # MB: 3 classes x 32x32x3 = 9 KiB a slot, so 54 slots for the trainer
    for workers in (0, 1, 2):
        pool = PoolDataset(pool_service.url, "shapes", length=12, memory_mb=budget,
                           trainer_id=f"small-{workers}")
        loader = DataLoader(pool, batch_size=4, num_workers=workers)
        assert sum(len(labels) for _, labels in loader) == 12
        held = pool.stats()["bytes"]
        assert 0.8 * budget * 2**20 < held <= budget * 2**20, (workers, held)
        pool.close()


def test_a_mix_keeps_each_label_and_replaces_at_the_ratio_asked(
        pool_service: Any, real_shapes: RealShapes) -> None:
    pool = PoolDataset(pool_service.url, "shapes", trainer_id="mixer", seed=1)
    pool.stream().wait_ready(60)  # this process's reservoir holds images: the ratio is exact
    mixed = MixedDataset(real_shapes, pool, p=0.5, seed=1)
    got = [(image, int(label)) for _ in range(5) for image, label in mixed]
    assert len(got) == 5 * len(real_shapes)
    synthetic = 0
    for image, label in got:
        real = any(torch.equal(image, real_shapes.images[i]) for i in range(len(real_shapes))
                   if real_shapes.labels[i] == label)
        synthetic += not real
    n = len(got)
    # Binomial(300, 0.5): 4.5 standard deviations either side.
    assert abs(synthetic - n / 2) < 4.5 * math.sqrt(n / 4), synthetic
    stats = mixed.stats()
    assert stats["synthetic"] == synthetic and stats["real"] == n - synthetic
    assert [label for _, label in got[:60]].count(0) == 20  # every example once, labels kept


def test_a_mix_never_waits_for_an_empty_pool(make_service: Any, tmp_path: Any,
                                             shapes_recipes_file: Any,
                                             real_shapes: RealShapes) -> None:
    """No pre-generation, no fill: the pool stays empty and the mix hands out real images at
    once, as many as the dataset has."""
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    mixed = MixedDataset(real_shapes, PoolDataset(live.url, "shapes", trainer_id="early"),
                         p=1.0, seed=0)
    started = time.monotonic()
    got = list(mixed)
    assert time.monotonic() - started < 5.0  # no wait for a pool that has nothing
    assert len(got) == 60 and mixed.stats()["real"] == 60 and mixed.stats()["asked"] == 60


def test_a_trainers_class_names_are_matched_to_the_recipes_labels(pool_service: Any) -> None:
    pool = PoolDataset(pool_service.url, "shapes", classes=["Triangle", "circle", "square"],
                       length=30, trainer_id="folder")
    assert pool.label_map() == {"triangle": 0, "circle": 1, "square": 2}
    assert {int(label) for _, label in pool} == {0, 1, 2}
    with pytest.raises(StreamError, match="hexagon"):
        list(PoolDataset(pool_service.url, "shapes", classes=["circle", "hexagon"], length=1,
                         first_fill_s=30, trainer_id="bad-classes"))


def test_a_mistake_stops_training_naming_the_service(pool_service: Any,
                                                    real_shapes: RealShapes) -> None:
    # A mix never waits, so the first batches are real while the worker's stream reads the
    # recipe; the stream's answer stops the next batch, in this epoch or (under load, after a
    # short epoch of 15 batches) the next one: epochs run until it does, 60 s at most.
    pool = PoolDataset(pool_service.url, "shapez", trainer_id="typo", first_fill_s=30)
    loader = DataLoader(MixedDataset(real_shapes, pool, p=0.5), batch_size=4, num_workers=1,
                        persistent_workers=True)
    deadline = time.monotonic() + 60
    with pytest.raises(Exception) as info:  # the worker's StreamError, re-raised by the loader
        while time.monotonic() < deadline:
            for _ in loader:
                pass
    assert "shapez" in str(info.value) and pool_service.url in str(info.value)
    with pytest.raises(StreamError, match="label_map names"):
        list(PoolDataset(pool_service.url, "shapes", label_map={"hexagon": 0}, length=1,
                         first_fill_s=30, trainer_id="bad-map"))


def test_a_trainers_need_is_one_report_whatever_its_ranks(pool_service: Any) -> None:
    url = pool_service.url
    pool = PoolDataset(url, "shapes", trainer_id="needy")
    pool.report_need({"triangle": 3.0, "circle": 1.0, "hexagon": 9.0, "square": float("nan")})
    deadline = time.monotonic() + 30
    while pool.need_sent is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pool.need_sent == {"triangle": 3.0, "circle": 1.0}  # the recipe's labels, numbers
    # Two more ranks of the same trainer report through the API: still one trainer.
    for rank in (1, 2):
        answer = httpx.post(f"{url}/v1/recipes/shapes/feedback",
                            json={"need": {"triangle": 3.0, "circle": 1.0}},
                            headers={"X-Client-Id": f"needy/r{rank}/w-"}, timeout=30)
        assert answer.status_code == 200 and answer.json()["client"] == "needy"
    detail = httpx.get(f"{url}/v1/recipes/shapes", timeout=30).json()
    assert detail["need_clients"] == 1
    assert detail["need"]["triangle"] == pytest.approx(0.75, abs=0.01)


def test_the_default_share_falls_with_the_real_images_per_class(
        pool_service: Any, real_shapes: RealShapes) -> None:
    """``p="auto"`` (the default): the real images per class are ``len(dataset)`` over the
    recipe's labels (20 here: a share of 2 / 22), or ``real_per_class`` when given."""
    from genaug.mixing import default_share

    pool = PoolDataset(pool_service.url, "shapes", trainer_id="auto-mixer", seed=4)
    pool.stream().wait_ready(60)
    mixed = MixedDataset(real_shapes, pool, seed=4)
    assert mixed.p == "auto"
    n = 0
    for _ in range(20):
        n += sum(1 for _ in mixed)
    share = default_share(len(real_shapes) / 3)
    assert mixed.p == pytest.approx(share) == pytest.approx(1 / 11)
    synthetic = mixed.stats()["synthetic"]
    assert abs(synthetic - n * share) < 4.5 * math.sqrt(n * share * (1 - share)), synthetic
    assert MixedDataset(real_shapes, pool, real_per_class=1).p == 0.5
    with pytest.raises(ValueError, match="'auto'"):
        MixedDataset(real_shapes, pool, p="half")
