"""genaug.torch's careless inputs: a malformed URL refused at once in one line, a dataset
label outside the recipe said once, and need reports with bad values that never raise into
training (docs/torch.md); against the real service where one is needed."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from _torch_shapes import RealShapes

from genaug.torch import MixedDataset, PoolDataset


@pytest.mark.parametrize(("url", "said"), [
    ("notaurl", "no http:// or https://"), ("ftp://gen-host", "scheme 'ftp'"),
    ("http://", "names no host"), ("http://gen-host:99999", "out of range"),
])
def test_a_malformed_url_is_refused_at_once_naming_the_argument(url: str, said: str) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        PoolDataset(url, "shapes", first_fill_s=60)
    message = str(refused.value)
    assert time.monotonic() - started < 1.0  # not after first_fill_s of waiting
    assert "\n" not in message and f"url {url!r}" in message and said in message
    assert "http://HOST:PORT" in message  # the fix


def test_a_malformed_genaug_url_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAUG_URL", "gen-host:8000")
    with pytest.raises(ValueError, match=r"GENAUG_URL entry 'gen-host:8000' .*url="):
        PoolDataset(None, "shapes")


class Relabelled(RealShapes):
    """The user's shapes with every third example given label 5, which recipe ``shapes``
    (circle, square, triangle: 0, 1, 2) does not have."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, label = super().__getitem__(i)
        return image, 5 if label == 2 else label


def test_a_label_outside_the_recipe_is_said_once_and_counted(
        pool_service: Any, caplog: pytest.LogCaptureFixture) -> None:
    pool = PoolDataset(pool_service.url, "shapes", trainer_id="outside", seed=2)
    pool.stream().wait_ready(60)
    mixed = MixedDataset(Relabelled(), pool, p=1.0, seed=2)
    with caplog.at_level(logging.WARNING, logger="genaug.torch"):
        got = [int(label) for _ in range(2) for _, label in mixed]
    said = [r.getMessage() for r in caplog.records if "none of recipe" in r.getMessage()]
    assert len(said) == 1, said  # once, over two epochs of 20 such examples each
    assert "label 5" in said[0] and "'shapes'" in said[0]
    assert all(name in said[0] for name in ("0 'circle'", "1 'square'", "2 'triangle'"))
    assert "label_map=" in said[0]  # the fix
    stats = mixed.stats()
    assert got.count(5) == 40 and stats["outside"] == 40 and stats["asked"] == 120
    assert stats["real"] >= 40 and stats["synthetic"] + stats["real"] == 120


def test_a_need_report_with_bad_values_never_raises_and_says_so_once(
        pool_service: Any, caplog: pytest.LogCaptureFixture) -> None:
    pool = PoolDataset(pool_service.url, "shapes", trainer_id="careless-need")
    with caplog.at_level(logging.WARNING, logger="genaug.torch"):
        pool.report_need({"circle": 2.0, "square": "x", "triangle": None})  # type: ignore[dict-item]
        pool.report_need({"7": "x", "hexagon": 1.0,  # type: ignore[dict-item]
                          "circle": torch.tensor(1.5)})
        pool.report_need(["circle"])  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while pool.need_sent != {"circle": 1.5}:
            assert time.monotonic() < deadline, pool.need_sent
            time.sleep(0.05)
    said = [r.getMessage() for r in caplog.records if "report_need" in r.getMessage()]
    values = [m for m in said if "finite number" in m]
    assert len(values) == 1 and "'square': 'x'" in values[0], said  # said once
    assert any("'hexagon'" in m and "lacks" in m for m in said), said
