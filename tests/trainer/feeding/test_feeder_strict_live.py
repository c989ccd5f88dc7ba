"""A strict ReservoirFeeder against live tiny services (real uvicorn, real AsyncClient): the
first contact refuses configuration mistakes before training, and tolerates outages.

No TensorFlow here: a NumPy stand-in reservoir has the surface the feeder uses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_feeder import NumpyReservoir, wait_for

from genaug.local_service import free_port
from genaug.trainer.feeding.feeder import FeederConfigError, ReservoirFeeder

ROOT = Path(__file__).resolve().parents[3]
RECIPES = ROOT / "recipes" / "wound_phases.yaml"
PHASES = {"I": 0, "P": 1, "R": 2}


def feeder(url: str, *, shape: tuple[int, int, int] = (64, 64, 3), **kw: Any) -> ReservoirFeeder:
    options: dict[str, Any] = {
        "recipe": "wound-phases", "label_map": PHASES, "batch": 6, "interval_s": 0.05,
        "backoff_initial_s": 0.05, "backoff_max_s": 0.2, "client_kwargs": {"retry_deadline": 1},
    }
    options.update(kw)
    return ReservoirFeeder(NumpyReservoir(3, 4, shape), url=url, **options)


@pytest.fixture
def recipe_service(make_service: Any, tmp_path: Path) -> Any:
    # One per test: services share the tiny pipeline, and only one may run it at a time.
    return make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=4, max_batch_images=8, api_keys=["trainer-key"])


def test_a_right_configuration_passes_and_feeds(recipe_service: Any) -> None:
    f = feeder(recipe_service.url, api_key="trainer-key")
    with f:
        assert f.stats.checked
        wait_for(lambda: f.stats.images_received > 0, timeout=60)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"api_key": None}, "refused the API key"),
        ({"api_key": "wrong"}, "refused the API key"),
        ({"recipe": "wound-phase"}, "recipe 'wound-phase' is unknown"),
        ({"label_map": {"I": 0, "P": 1, "remodelling": 2}},
         "label_map names ['remodelling'], which recipe 'wound-phases' lacks"),
        ({"shape": (32, 32, 3)}, "makes 64x64 images but the reservoir holds 32x32"),
        ({"shape": (64, 64, 1)}, "makes 3-channel images but the reservoir holds 1"),
    ],
    ids=["no key", "wrong key", "unknown recipe", "label", "size", "channels"],
)
def test_mistakes_raise_at_start(
    recipe_service: Any, kwargs: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    options = {"api_key": "trainer-key", **kwargs}
    f = feeder(recipe_service.url, **options)
    with pytest.raises(FeederConfigError, match=re.escape(message)):
        f.start()
    assert not f.running and f.stats.images_received == 0
    # strict=False: the same mistake only shows in the stats, as before
    lenient = feeder(recipe_service.url, strict=False, **options)
    lenient.start()
    wait_for(lambda: lenient.stats.errors >= 1 or lenient.stats.requests >= 1, timeout=30)
    assert lenient.running
    lenient.stop()


def test_empty_pool_without_pregeneration_or_target(make_service: Any, tmp_path: Path) -> None:
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db", pregenerate=False)
    with pytest.raises(FeederConfigError, match="pre-generation is off"):
        feeder(live.url).start()
    with feeder(live.url, wait_s=2.0) as f:  # samples that wait make the pool grow: fine
        assert f.stats.checked


def test_outages_are_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    f = feeder(f"http://127.0.0.1:{free_port()}", client_kwargs={"retry_deadline": 0.2})
    with f:  # connection refused: start returns, the feeder keeps trying
        assert f.running and not f.stats.checked
        wait_for(lambda: f.stats.errors >= 2, timeout=20)
    assert "TransportError" in (f.stats.last_error or "")
