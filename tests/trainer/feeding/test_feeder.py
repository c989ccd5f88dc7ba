"""ReservoirFeeder in-process, against stand-in clients and a NumPy reservoir (no TensorFlow)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _standins import FakeAsyncClient, class_value, closed_port

from genaug.trainer.feeding.feeder import (
    FeederConfigError,
    FeederStats,
    ReservoirFeeder,
    first_contact_problems,
)

SIZE = (8, 8)


class NumpyReservoir:
    """Same surface as SyntheticReservoir for the feeder: write, fill_counts, shapes."""

    def __init__(self, num_classes: int, slots: int, shape: tuple[int, int, int] = (8, 8, 3)):
        self.num_classes = num_classes
        self.slots_per_class = slots
        self.image_shape = shape
        self.images = np.zeros([num_classes, slots, *shape], np.uint8)
        self.fill = np.zeros([num_classes], np.int32)
        self.cursor = np.zeros([num_classes], np.int64)
        self.lock = threading.Lock()
        self.writes: list[tuple[int, int]] = []

    def write(self, label: int, images: np.ndarray) -> int:
        if tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(f"images of shape {images.shape} do not fit {self.image_shape}")
        with self.lock:
            for img in images[-self.slots_per_class :]:
                self.images[label, self.cursor[label]] = img
                self.cursor[label] = (self.cursor[label] + 1) % self.slots_per_class
                self.fill[label] = min(self.slots_per_class, self.fill[label] + 1)
            self.writes.append((label, len(images)))
        return min(len(images), self.slots_per_class)

    def fill_counts(self) -> np.ndarray:
        with self.lock:
            return self.fill.copy()


def wait_for(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


LABELS = {"a": 0, "b": 1, "c": 2}


def make(reservoir: Any, client: Any, **kw: Any) -> ReservoirFeeder:
    options: dict[str, Any] = {
        "recipe": "demo",
        "label_map": LABELS,
        "batch": 6,
        "interval_s": 0.01,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    options.update(kw)
    return ReservoirFeeder(reservoir, client=client, **options)


def test_fills_reservoir_by_class_and_counts() -> None:
    res = NumpyReservoir(3, 8)
    fake = FakeAsyncClient(list(LABELS), SIZE)
    with make(res, fake) as feeder:
        wait_for(lambda: res.fill_counts().min() == 8)
        stats = feeder.stats
        assert stats.connected and stats.running
    assert not feeder.stats.connected and not feeder.stats.running  # stopped
    assert stats.images_received >= 24 and stats.requests >= 4 and stats.errors == 0
    assert stats.last_refresh is not None and stats.last_refresh <= time.time()
    for c in range(3):  # every slot holds its own class's pixels
        assert np.all(res.images[c] == class_value(c))


def test_requests_least_filled_classes_first() -> None:
    res = NumpyReservoir(3, 8)
    res.write(0, np.zeros([8, 8, 8, 3], np.uint8))  # full
    res.write(1, np.zeros([4, 8, 8, 3], np.uint8))  # half
    fake = FakeAsyncClient(list(LABELS), SIZE)
    with make(res, fake, interval_s=5.0):
        wait_for(lambda: len(fake.calls) >= 1)
    assert fake.calls[0]["labels"] == ["c", "b"]  # empty first, full class not asked
    assert fake.calls[0]["n"] == 6


def test_all_full_requests_all_labels_to_refresh() -> None:
    res = NumpyReservoir(3, 2)
    for c in range(3):
        res.write(c, np.zeros([2, 8, 8, 3], np.uint8))
    fake = FakeAsyncClient(list(LABELS), SIZE)
    with make(res, fake, interval_s=5.0):
        wait_for(lambda: len(fake.calls) >= 1)
    assert sorted(fake.calls[0]["labels"]) == ["a", "b", "c"]


def test_backs_off_while_down_and_reconnects() -> None:
    res = NumpyReservoir(3, 4)
    fake = FakeAsyncClient(list(LABELS), SIZE, fail_first=3)
    with make(res, fake) as feeder:
        wait_for(lambda: feeder.stats.images_received > 0)
        s = feeder.stats
        assert s.errors == 3 and s.consecutive_failures == 0 and s.connected
        assert "ConnectionError" in (s.last_error or "")
        fake.down = True  # the service goes away mid-training
        wait_for(lambda: feeder.stats.consecutive_failures >= 3)
        assert not feeder.stats.connected and feeder.running
        fake.down = False  # ... and comes back
        wait_for(lambda: feeder.stats.connected)
        assert feeder.stats.consecutive_failures == 0


def test_backoff_grows_exponentially_capped_and_honours_retry_after() -> None:
    feeder = make(
        NumpyReservoir(3, 4),
        FakeAsyncClient(list(LABELS)),
        backoff_initial_s=1.0,
        backoff_max_s=8.0,
    )
    delays = []
    for k in range(1, 7):
        feeder._stats = FeederStats(consecutive_failures=k)
        delays.append(feeder._backoff_delay())
    assert all(0.8 * lo <= d <= lo for d, lo in zip(delays, [1, 2, 4, 8, 8, 8], strict=True))

    class RateLimited(Exception):
        retry_after = 5.0

    feeder._stats = FeederStats(consecutive_failures=1)
    assert feeder._backoff_delay(RateLimited()) == 5.0


def test_never_raises_on_bad_responses() -> None:
    res = NumpyReservoir(3, 4)
    wrong_size = FakeAsyncClient(list(LABELS), (16, 16))  # service sends the wrong size
    with make(res, wrong_size, strict=False) as feeder:  # strict would refuse at start
        wait_for(lambda: feeder.stats.errors >= 2)
        assert feeder.running
    assert "do not fit" in (feeder.stats.last_error or "")
    assert res.fill_counts().sum() == 0


def test_unmapped_labels_are_dropped() -> None:
    res = NumpyReservoir(3, 4)

    class ExtraLabels(FakeAsyncClient):
        async def sample(self, recipe: str, **kw: Any) -> Any:
            result = await super().sample(recipe, labels=["a", "zzz"], n=4)
            return result

    fake = ExtraLabels(["a", "zzz"], SIZE)
    with make(res, fake, label_map={"a": 0, "c": 2}, interval_s=5.0, strict=False) as feeder:
        wait_for(lambda: feeder.stats.requests >= 1)
    assert feeder.stats.images_dropped == 2 and feeder.stats.images_received == 2
    assert res.fill_counts().tolist() == [2, 0, 0]


def test_stop_cancels_hanging_request_and_closes_owned_client() -> None:
    made: list[FakeAsyncClient] = []

    def factory() -> FakeAsyncClient:
        made.append(FakeAsyncClient(list(LABELS), SIZE, hang=True))
        return made[-1]

    feeder = make(NumpyReservoir(3, 4), factory, strict=False)  # hangs in sample
    feeder.start()
    wait_for(lambda: bool(made) and len(made[0].calls) == 1)
    t0 = time.monotonic()
    feeder.stop(timeout=5)
    assert time.monotonic() - t0 < 2
    assert not feeder.running and made[0].closed
    feeder.start()  # restartable: start() mirrors stop()
    wait_for(lambda: len(made) == 2)
    feeder.stop()
    assert not feeder.running


def test_generate_fallback_uses_prompts_and_reservoir_size() -> None:
    res = NumpyReservoir(2, 4, (12, 10, 3))
    fake = FakeAsyncClient(["x", "y"])
    feeder = ReservoirFeeder(
        res,
        client=fake,
        label_map={"x": 0, "y": 1},
        prompts={"x": "a fox", "y": "a dog"},
        batch=4,
        interval_s=0.01,
    )
    with feeder:
        wait_for(lambda: res.fill_counts().min() == 4)
    first = fake.calls[0]
    assert first["op"] == "generate"
    assert (first["output_height"], first["output_width"]) == (12, 10)
    assert np.all(res.images[0] == sum(map(ord, "a fox")) % 256)
    assert np.all(res.images[1] == sum(map(ord, "a dog")) % 256)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label_map": {"a": 3}}, "outside the reservoir's classes"),
        ({"recipe": None}, "pass recipe="),
        ({"label_map": {}}, "label_map is empty"),
        ({"recipe": None, "prompts": {"b": "x"}, "label_map": {"a": 0}}, "no prompt for"),
    ],
)
def test_constructor_says_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(NumpyReservoir(3, 4), FakeAsyncClient(["a"]), **kwargs)
    with pytest.raises(ValueError, match="not both"):
        ReservoirFeeder(
            NumpyReservoir(3, 4), url="http://x", client=object(), recipe="r", label_map={"a": 0}
        )


def test_real_client_against_closed_port_counts_transport_errors() -> None:
    client_mod = pytest.importorskip("genaug.client")
    res = NumpyReservoir(3, 4)
    feeder = ReservoirFeeder(
        res,
        url=f"http://127.0.0.1:{closed_port()}",
        recipe="demo",
        label_map=LABELS,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        client_kwargs={"retry_deadline": 0.1},
    )
    with feeder:
        wait_for(lambda: feeder.stats.errors >= 2, timeout=10)
    assert "TransportError" in (feeder.stats.last_error or "")
    assert issubclass(client_mod.TransportError, client_mod.GenaugError)
    assert res.fill_counts().sum() == 0


def test_feeder_thread_has_its_own_loop() -> None:
    """Works while the calling thread runs an asyncio loop of its own (e.g. a notebook)."""
    res = NumpyReservoir(3, 4)

    async def main() -> FeederStats:
        with make(res, FakeAsyncClient(list(LABELS), SIZE)) as feeder:
            for _ in range(500):
                if feeder.stats.images_received:
                    break
                await asyncio.sleep(0.01)
            return feeder.stats

    assert asyncio.run(main()).images_received > 0


# -- strict: configuration mistakes stop training before it starts; outages never do ----------


def test_strict_start_passes_and_marks_checked() -> None:
    res = NumpyReservoir(3, 8)
    with make(res, FakeAsyncClient(list(LABELS), SIZE)) as feeder:
        assert feeder.stats.checked
        wait_for(lambda: res.fill_counts().min() == 8)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"labels": ["a", "b"]}, "label_map names ['c'], which recipe 'demo' lacks"),
        ({"spec": {"height": 16, "width": 16}}, "makes 16x16 images but the reservoir holds 8x8"),
        ({"spec": {"height": 8, "width": 8, "output_channels": 1}},
         "makes 1-channel images but the reservoir holds 3"),
        ({"fill": {"a": 0, "b": 0, "c": 0}, "target_per_label": {"a": 0, "b": 0, "c": 0}},
         "holds no image for labels ['a', 'b', 'c'] and nothing will make any"),
    ],
    ids=["label", "size", "channels", "empty pool"],
)
def test_strict_start_raises_on_configuration_mistakes(
    change: dict[str, Any], message: str
) -> None:
    fake = FakeAsyncClient(list(LABELS), SIZE)
    fake.detail_overrides = change
    feeder = make(NumpyReservoir(3, 4), fake)
    with pytest.raises(FeederConfigError, match=re.escape(message)):
        feeder.start()
    assert not feeder.running and fake.calls == []  # nothing sampled, thread ended
    # the same mistakes with strict=False: today's tolerant behaviour, nothing raised
    lenient = make(NumpyReservoir(3, 4), fake, strict=False)
    lenient.start()
    assert lenient.running
    lenient.stop()


def test_an_empty_demand_only_pool_is_fine_when_samples_may_wait() -> None:
    fake = FakeAsyncClient(list(LABELS), SIZE)
    fake.detail_overrides = {"fill": {"a": 0}, "target_per_label": {"a": 0}}
    with make(NumpyReservoir(3, 4), fake, wait_s=1.0) as feeder:
        assert feeder.stats.checked


def test_strict_outage_is_tolerated_and_checked_when_the_service_answers() -> None:
    fake = FakeAsyncClient(list(LABELS), SIZE)
    fake.down = True
    res = NumpyReservoir(3, 4)
    with make(res, fake) as feeder:  # start() returns: an outage is not a mistake
        assert feeder.running and not feeder.stats.checked
        wait_for(lambda: feeder.stats.errors >= 2)
        fake.down = False
        wait_for(lambda: feeder.stats.checked and res.fill_counts().min() == 4)


def test_a_mistake_found_after_an_outage_stops_the_feeder_not_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeAsyncClient(list(LABELS), SIZE)
    fake.down = True
    fake.detail_overrides = {"labels": ["a"]}
    feeder = make(NumpyReservoir(3, 4), fake)
    feeder.start()
    wait_for(lambda: feeder.stats.errors >= 1)
    fake.down = False
    wait_for(lambda: not feeder.running)
    assert "lacks" in (feeder.stats.last_error or "")
    assert any("genaug feeder stopped" in r.getMessage() for r in caplog.records)


def test_a_hanging_service_delays_start_by_the_first_contact_timeout_only() -> None:
    fake = FakeAsyncClient(list(LABELS), SIZE, hang=True)
    feeder = make(NumpyReservoir(3, 4), fake, first_contact_timeout_s=0.2)
    feeder.start()
    assert feeder.running and not feeder.stats.checked
    feeder.stop(timeout=5)
    assert not feeder.running


def test_first_contact_problems_for_prompts() -> None:
    info = {"limits": {"max_side": 32, "default_size": 64}}
    problems = first_contact_problems(info=info, recipe_detail=None, recipe=None,
                                      label_map={"a": 0}, image_shape=(64, 64, 1))
    assert len(problems) == 2
    assert "at most 32 px" in problems[0] and "RGB" in problems[1]


def test_a_client_id_the_service_would_refuse_stops_the_feeder_at_start() -> None:
    """``client_kwargs={"client_id": "with mixing"}`` (a space): before, every sample was a 422
    the feeder took for an outage, and a mixing run fed 0 images in silence."""
    feeder = ReservoirFeeder(NumpyReservoir(3, 4), url=f"http://127.0.0.1:{closed_port()}",
                             recipe="demo", label_map=LABELS,
                             client_kwargs={"client_id": "genaug-fewshot-with mixing"})
    with pytest.raises(FeederConfigError, match=r"client_id 'genaug-fewshot-with mixing' is "
                                                r"not .*'genaug-fewshot-with-mixing'"):
        feeder.start()
    assert not feeder.running


def test_a_request_the_service_refuses_stops_the_feeder_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from genaug.client import InvalidRequestError

    started = threading.Event()

    class Refused(FakeAsyncClient):
        async def sample(self, recipe: str, **kwargs: Any) -> Any:
            while not started.is_set():  # refused once training runs (start() returned)
                await asyncio.sleep(0.01)
            raise InvalidRequestError("X-Client-Id 'a b' is not 1-64 characters ...",
                                      status=422, field="X-Client-Id")

    feeder = make(NumpyReservoir(3, 4), Refused(list(LABELS), SIZE))
    feeder.start()  # the first contact passes
    started.set()
    wait_for(lambda: not feeder.running)
    assert "refused its request: X-Client-Id" in (feeder.stats.last_error or "")
    assert any("genaug feeder stopped" in r.getMessage() for r in caplog.records)


def test_a_lenient_feeder_says_why_it_stopped(caplog: pytest.LogCaptureFixture) -> None:
    """strict=False: start() raises nothing, so the stop is logged as an error, not dropped."""
    feeder = ReservoirFeeder(NumpyReservoir(3, 4), url=f"http://127.0.0.1:{closed_port()}",
                             recipe="demo", label_map=LABELS, strict=False,
                             client_kwargs={"client_id": "my trainer"})
    feeder.start()
    wait_for(lambda: not feeder.running)
    assert any("genaug feeder stopped" in r.getMessage() and "'my trainer'" in r.getMessage()
               for r in caplog.records)
