"""A fill handed off, followed and cancelled through the clients, against a real service.

``fill()`` answers a job (``FillJob`` / ``AsyncFillJob``) that still reads as the fill's
answer; ``wait()`` polls ``GET /v1/jobs/{id}`` until it ended; ``cancel()`` ends a live one
and a second cancel is the service's 409. The service holds a job live by holding its
pipeline (``live.worker.gate``), never by a stand-in. ``JobWatch`` (the I/O-free part of a
wait: deadline, delay, the end, ``on_update``) and the progress bar the clients attach to it
(``_progress``) are unit-tested at the end.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from genaug.client import (
    AsyncClient,
    AsyncFillJob,
    Client,
    ConflictError,
    DecodeError,
    FillJob,
    InvalidRequestError,
    NotFoundError,
)
from genaug.client._jobs import FillAnswer, JobWatch, job_path
from genaug.client._progress import job_bar

KINDS = ["sync", "async"]
JOB_ID = re.compile(r"j_[0-9a-f]{16}")


@pytest.fixture
def live(make_service: Any, tmp_path: Path, shapes_recipes_file: Path) -> Iterator[Any]:
    """A service with the shapes recipe, nothing pre-generated (only the test's fills run),
    its pipeline's gate opened again whatever the test did to it."""
    service = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                           pregenerate=False, max_batch_images=8, max_wait_ms=5)
    yield service
    service.worker.gate.set()


# -- a fill is a job ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_fill_answers_a_job_that_reads_as_the_answer_and_wait_returns_it_done(
        live: Any, kind: str) -> None:
    polls: list[dict[str, Any]] = []  # what wait() handed on_update, poll after poll
    if kind == "sync":
        with Client(live.url) as client:
            job = client.fill("shapes", per_label=4)
            assert isinstance(job, FillJob)
            final = job.wait(timeout=60, poll_s=0.05, on_update=polls.append)
            listed = client.jobs("shapes")
            again = client.job(job.id or "")
    else:
        async def main() -> tuple[Any, ...]:
            async with AsyncClient(live.url) as client:
                job = await client.fill("shapes", per_label=4)
                assert isinstance(job, AsyncFillJob)
                final = await job.wait(timeout=60, poll_s=0.05, on_update=polls.append)
                return job, final, await client.jobs("shapes"), await client.job(job.id or "")
        job, final, listed, again = asyncio.run(main())
    # the fill's answer, as before: the recipe's counts and targets, read as a mapping
    assert job["name"] == "shapes" and set(job["fill"]) == {"circle", "square", "triangle"}
    assert job["target_per_label"] == dict.fromkeys(["circle", "square", "triangle"], 4)
    assert dict(job)["job"] == {"id": job.id, "url": f"/v1/jobs/{job.id}"}
    assert job.id is not None and JOB_ID.fullmatch(job.id) and job.url == f"/v1/jobs/{job.id}"
    # followed until it ended: done, every label met, what was asked accepted
    assert final["id"] == job.id and final["state"] == "done", final
    assert final["accepted"] >= final["asked"] == 12 and final["missing"] == 0, final
    assert all(c["met"] and c["fill"] >= 4 for c in final["labels"].values()), final
    assert final["ended"] is not None and final["eta_s"] in (0, 0.0, None)
    # on_update saw every poll, the last one the job as it ended (what wait returned)
    assert polls and polls[-1] is final, polls
    assert all(p["id"] == job.id and p["state"] in ("queued", "running") for p in polls[:-1])
    # and the service answers for it as it ended, alone and in the list
    assert again["state"] == "done" and again["accepted"] == final["accepted"]
    assert [j["id"] for j in listed] == [job.id] and listed[0]["state"] == "done"


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_ends_a_live_job_and_a_second_cancel_is_a_conflict(live: Any, kind: str) -> None:
    live.worker.gate.clear()  # the pipeline holds the first batch: the job stays live

    def check(first: dict[str, Any], status: dict[str, Any], waited: dict[str, Any],
              second: BaseException, job_id: str) -> None:
        assert first["id"] == job_id and first["state"] == "cancelled", first
        assert first["reason"] and "cancel" in first["reason"], first
        assert status["state"] == waited["state"] == "cancelled"
        # the service's 409, as the client's conflict error, with the service's message
        assert isinstance(second, ConflictError) and isinstance(second, InvalidRequestError)
        assert second.status == 409 and second.field == "id", second
        assert f"id {job_id!r}: the job already ended (cancelled)" in str(second), second

    if kind == "sync":
        with Client(live.url) as client:
            job = client.fill("shapes", per_label=4)
            assert live.worker.entered.wait(30), "the fill's first batch never reached the GPU"
            assert job.status()["state"] in ("queued", "running")
            first = job.cancel()
            status, waited = job.status(), job.wait(timeout=10, poll_s=0.05)
            with pytest.raises(ConflictError) as second:
                job.cancel()
            check(first, status, waited, second.value, job.id or "")
            assert client.forget_job(job.id or "")["state"] == "cancelled"
            with pytest.raises(NotFoundError):
                job.status()
    else:
        async def main() -> None:
            async with AsyncClient(live.url) as client:
                job = await client.fill("shapes", per_label=4)
                assert await asyncio.to_thread(live.worker.entered.wait, 30)
                assert (await job.status())["state"] in ("queued", "running")
                first = await job.cancel()
                status, waited = await job.status(), await job.wait(timeout=10, poll_s=0.05)
                with pytest.raises(ConflictError) as second:
                    await job.cancel()
                check(first, status, waited, second.value, job.id or "")
                assert (await client.forget_job(job.id or ""))["state"] == "cancelled"
                with pytest.raises(NotFoundError):
                    await job.status()
        asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_job_is_not_found_naming_it(live: Any, kind: str) -> None:
    unknown = "j_0123456789abcdef"
    if kind == "sync":
        with Client(live.url) as client:
            with pytest.raises(NotFoundError) as got:
                client.job(unknown)
            with pytest.raises(NotFoundError) as cancelled:
                client.cancel_job(unknown)
    else:
        async def main() -> tuple[Any, Any]:
            async with AsyncClient(live.url) as client:
                with pytest.raises(NotFoundError) as got:
                    await client.job(unknown)
                with pytest.raises(NotFoundError) as cancelled:
                    await client.cancel_job(unknown)
                return got, cancelled
        got, cancelled = asyncio.run(main())
    for raised in (got.value, cancelled.value):
        assert raised.status == 404 and f"id {unknown!r}: no such job" in str(raised), raised


@pytest.mark.parametrize("kind", KINDS)
def test_wait_past_its_timeout_names_the_job_and_its_state(live: Any, kind: str) -> None:
    live.worker.gate.clear()
    if kind == "sync":
        with Client(live.url) as client:
            job = client.fill("shapes", per_label=2)
            with pytest.raises(TimeoutError) as raised:
                job.wait(timeout=0.3, poll_s=0.05)
            client.cancel_job(job.id or "")
    else:
        async def main() -> tuple[Any, Any]:
            async with AsyncClient(live.url) as client:
                job = await client.fill("shapes", per_label=2)
                with pytest.raises(TimeoutError) as raised:
                    await job.wait(timeout=0.3, poll_s=0.05)
                await client.cancel_job(job.id or "")
                return job, raised
        job, raised = asyncio.run(main())
    said = str(raised.value)
    assert re.match(rf"job {job.id} is still (queued|running) after 0\.3 s \(0 of 6 images\); "
                    "it goes on in the service", said), said
    assert f"genaug jobs cancel {job.id}" in said


def test_wait_with_a_bad_poll_is_refused_before_any_request() -> None:
    with Client("http://127.0.0.1:9", retry_deadline=0.1) as client:
        with pytest.raises(ValueError, match=r"poll_s=0: give the seconds between polls"):
            client.wait_job("j_0123456789abcdef", poll_s=0)
        with pytest.raises(ValueError, match=r"job id '': give the id a fill answered"):
            client.job("")


# -- JobWatch, the progress bar and FillAnswer, without I/O ------------------------------------


def _job(state: str, *, asked: int = 12, missing: int = 12) -> dict[str, Any]:
    return {"id": "j_0123456789abcdef", "recipe": "shapes", "state": state, "asked": asked,
            "missing": missing, "accepted": asked - missing, "rate": 1.5, "eta_s": 4.0}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("terminal", "progress", "drawn"), [
    (False, None, False),   # a log or a pipe: no bar unless asked
    (True, None, True),     # a terminal: the bar
    (True, False, False),
    (False, True, True),
])
def test_the_progress_bar_is_drawn_where_a_terminal_is_attached(
        monkeypatch: pytest.MonkeyPatch, terminal: bool, progress: bool | None,
        drawn: bool) -> None:
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    seen: list[str] = []
    watch = JobWatch("j_0123456789abcdef", timeout=None, poll_s=1.0,
                     on_update=lambda job: seen.append(job["state"]))
    with job_bar(watch, progress) as bar:
        assert (bar is not None) is drawn
        assert not watch.seen(_job("running", missing=7))
        assert watch.seen(_job("done", missing=0))
    assert seen == ["running", "done"]  # the watch's own callback, with or without the bar
    assert watch.on_update is not None and watch.seen(_job("done", missing=0))
    assert seen == ["running", "done", "done"]  # the bar is detached once the wait ended
    text = stderr.getvalue()
    assert ("j_0123456789abcdef" in text and "12/12" in text and "done" in text) is drawn, text


def test_the_bar_starts_at_what_the_job_held_at_the_first_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm's ``initial``: the bar's rate and time left are the job's own work, never what its
    labels held before it began."""
    stderr = _Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    watch = JobWatch("j_0123456789abcdef", timeout=None, poll_s=1.0)
    with job_bar(watch, None) as bar:
        assert bar is not None
        watch.seen(_job("running", missing=5))
        assert (bar._bar.initial, bar._bar.n, bar._bar.total) == (7, 7, 12)
        watch.seen(_job("running", missing=2))
        assert (bar._bar.initial, bar._bar.n) == (7, 10)
    assert "running" in stderr.getvalue()


def test_a_watch_hands_every_answer_to_on_update_and_decides_the_end() -> None:
    seen: list[dict[str, Any]] = []
    watch = JobWatch("j_0123456789abcdef", timeout=None, poll_s=1.0, on_update=seen.append)
    answers = [_job("queued"), _job("running", missing=4), _job("stopped", missing=4)]
    assert [watch.seen(job) for job in answers] == [False, False, True]
    assert seen == answers and watch.last is answers[-1]


def test_a_watch_times_out_at_its_deadline_and_not_before() -> None:
    now = [100.0]
    watch = JobWatch("j_0123456789abcdef", timeout=2.0, poll_s=1.5, clock=lambda: now[0])
    watch.seen(_job("queued"))
    assert watch.delay() == 1.5
    now[0] = 101.0
    assert watch.delay() == 1.0  # never past the deadline
    now[0] = 102.0
    with pytest.raises(TimeoutError, match=r"job j_0123456789abcdef is still queued after 2 s"):
        watch.delay()


def test_an_answer_without_a_job_still_reads_but_cannot_be_followed() -> None:
    answer = FillAnswer({"name": "shapes", "fill": {"circle": 0}})
    assert answer.id is None and answer["fill"] == {"circle": 0} and len(answer) == 2
    with pytest.raises(DecodeError, match="names no job"):
        answer._job_id()


def test_a_job_id_is_quoted_into_its_path() -> None:
    assert job_path("j_0123456789abcdef") == "/v1/jobs/j_0123456789abcdef"
    assert job_path("../recipes") == "/v1/jobs/..%2Frecipes"
