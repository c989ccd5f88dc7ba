"""``genaug pregenerate --url`` follows the job its fill became and exits with that job's
state: 0 done, 1 cancelled by someone else (naming ``genaug jobs show ID``), 130 on Ctrl-C
with the job left running and named with ``genaug jobs cancel ID``. (3, a label the judge
stopped: tests/service/pool/test_pool_stopped.py.) Real service, real command in its own
process group; a job is held live by holding the service's pipeline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from genaug.client import Client


@pytest.fixture
def live(fill_service: Any) -> Any:
    return fill_service


class Command:
    """``genaug pregenerate --url ...`` in its own process group, its stderr read as it
    comes (the bars end their lines with carriage returns)."""

    def __init__(self, url: str, per_label: int, cwd: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "genaug.cli", "pregenerate", "--url", url, "--recipe",
             "shapes", "--per-label", str(per_label)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"})
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        while chunk := os.read(self.proc.stderr.fileno(), 65536):
            self.err += chunk.decode(errors="replace")

    def wait_until(self, seen: Any, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not seen():
            assert self.proc.poll() is None, f"ended before {what}:\n{self.err[-3000:]}"
            assert time.monotonic() < deadline, f"no {what}:\n{self.err[-3000:]}"
            time.sleep(0.05)

    def end(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            pytest.fail(f"still following after {timeout:.0f} s:\n{self.err[-3000:]}")
        self._reader.join(10)
        return code

    def last_line(self) -> str:
        lines = [line for line in self.err.replace("\r", "\n").splitlines() if line.strip()]
        return lines[-1] if lines else ""


def _live_job(client: Client) -> dict[str, Any] | None:
    live = [j for j in client.jobs("shapes") if j["state"] in ("queued", "running")]
    return live[0] if live else None


def test_done_exits_0_and_a_job_cancelled_by_someone_else_exits_1_naming_it(
        live: Any, tmp_path: Path) -> None:
    done = Command(live.url, 2, tmp_path)
    assert done.end() == 0, done.err[-3000:]
    with Client(live.url) as client:
        followed = client.jobs("shapes")
        assert [j["state"] for j in followed] == ["done"], followed
        assert all(c["fill"] >= 2 for c in followed[0]["labels"].values())
        live.worker.gate.clear()  # the next job stays live until the test lets it go
        command = Command(live.url, 4, tmp_path)
        command.wait_until(lambda: _live_job(client) is not None, "job")
        command.wait_until(lambda: "img" in command.err, "progress bars")
        job = _live_job(client)
        assert job is not None
        client.cancel_job(job["id"])  # someone else: another terminal, a client
        live.worker.gate.set()
        code = command.end()
    assert code == 1, command.err[-3000:]
    assert "Traceback" not in command.err
    assert command.last_line() == (
        f"genaug pregenerate: job {job['id']} cancelled: cancelled by a client; genaug jobs "
        f"show {job['id']} --url {live.url} says more"), command.err[-3000:]


@pytest.mark.slow  # a real Ctrl-C to the command's process group (~5 s)
def test_ctrl_c_stops_following_names_the_job_and_leaves_it_running(
        live: Any, tmp_path: Path) -> None:
    live.worker.gate.clear()
    command = Command(live.url, 4, tmp_path)
    with Client(live.url) as client:
        command.wait_until(lambda: _live_job(client) is not None, "job")
        command.wait_until(lambda: "img" in command.err, "progress bars")
        os.killpg(command.proc.pid, signal.SIGINT)
        code = command.end(30)
        job = _live_job(client)
        assert job is not None, "Ctrl-C of the follower ended the job"
        client.cancel_job(job["id"])
    assert code == 130 and "Traceback" not in command.err, command.err[-3000:]
    assert command.last_line() == (
        f"genaug pregenerate: interrupted; job {job['id']} goes on in the service; follow it "
        f"with genaug jobs wait {job['id']} --url {live.url}, or cancel it with genaug jobs "
        f"cancel {job['id']} --url {live.url}"), command.err[-3000:]


def test_the_bars_on_a_terminal_count_the_jobs_own_rate_not_what_the_labels_held(
        live: Any, terminal: Any, job_bars: Any) -> None:
    """The labels held 6 images each before the command asked 10: each label's bar starts at
    6 of 10, and its rate and time left count only the images made after that."""
    frames_of, rates_are_the_jobs_own = job_bars
    with Client(live.url) as client:
        assert client.fill("shapes", per_label=6).wait(timeout=60, poll_s=0.05)["state"] == "done"
    live.worker.gate.clear()  # nothing is made until the bars ran 2 s
    term = terminal([sys.executable, "-m", "genaug.cli", "pregenerate", "--url", live.url,
                     "--recipe", "shapes", "--per-label", "10"])
    term.wait_for(lambda text: any(f[3] >= 2 for f in frames_of(text)), "2 s of the bars")
    live.worker.gate.set()
    assert term.end() == 0, term.text[-2000:]
    frames = frames_of(term.text)
    assert {f[0] for f in frames} == {"circle", "square", "triangle"}, frames
    for label in ("circle", "square", "triangle"):
        mine = [f for f in frames if f[0] == label]
        assert mine[0][1:3] == (6, 10) and mine[-1][1:3] == (10, 10), mine
    rates_are_the_jobs_own(frames)
