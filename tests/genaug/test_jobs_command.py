"""``genaug jobs`` run as a person runs it (a subprocess) against a real tiny service: list,
show, wait, cancel, their exit statuses and the one-line refusals; Ctrl-C of a wait leaves the
job running and says how to cancel it. A job is held live by holding the service's pipeline
(``live.worker.gate``). The stopped job's exit 3 runs where the judge really stops a label:
tests/service/pool/test_pool_stopped.py."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Any

import pytest

from genaug.cli import main
from genaug.client import Client
from genaug.local_service import free_port


@pytest.fixture
def live(fill_service: Any) -> Any:
    return fill_service


def jobs(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return subprocess.run([sys.executable, "-m", "genaug.cli", "jobs", *argv],
                          capture_output=True, text=True, timeout=timeout, env=env)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()


def test_list_show_wait_and_cancel_and_their_exit_statuses(live: Any) -> None:
    url = live.url
    with Client(url) as client:
        finished = client.fill("shapes", per_label=2)
        assert finished.wait(timeout=60, poll_s=0.05)["state"] == "done"
        live.worker.gate.clear()  # the next fill's first batch is held: that job stays live
        held = client.fill("shapes", per_label=4)
        assert live.worker.entered.wait(30)
    done_id, live_id = finished.id, held.id
    assert done_id and live_id

    listed = jobs("list", "--url", url)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split() == ["id", "recipe", "state", "held/asked", "rate", "eta", "created"]
    # newest first: the live one, then the done one with all it asked held
    assert [r.split()[0] for r in rows[1:]] == [live_id, done_id], listed.stdout
    # held/asked: the 2 per label the pool held before it began count toward its 4
    assert rows[1].split()[2] in ("queued", "running") and rows[1].split()[3] == "6/12"
    assert rows[2].split()[1:4] == ["shapes", "done", "6/6"], rows[2]

    only_done = jobs("list", "--url", url, "--state", "done", "--json")
    assert only_done.returncode == 0, only_done.stderr
    assert [j["id"] for j in json.loads(only_done.stdout)["jobs"]] == [done_id]

    shown = jobs("show", done_id, "--url", url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{done_id} (recipe 'shapes') done: 6 of 6 images", lines[0]
    circle = next(line.split() for line in lines if line.split()[:1] == ["circle"])
    assert circle[1] == "2" and circle[-1] == "met", lines  # asked 2, met
    as_json = jobs("show", done_id, "--url", url, "--json")
    assert json.loads(as_json.stdout)["labels"]["square"]["asked"] == 2

    waited = jobs("wait", done_id, "--url", url)
    assert (waited.returncode, waited.stdout) == (0, lines[0] + "\n"), waited.stderr

    cancelled = jobs("cancel", live_id, "--url", url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"{live_id} (recipe 'shapes') cancelled: 6 of 12 images")
    # the service refuses: its message in one line, exit status 1
    again = jobs("cancel", live_id, "--url", url)
    assert again.returncode == 1 and again.stdout == ""
    assert one_line(again).startswith(
        f"genaug jobs: 409 from {url}: id {live_id!r}: the job already ended (cancelled);")
    # waiting for a cancelled job ends at once, 1, saying so
    after = jobs("wait", live_id, "--url", url)
    assert after.returncode == 1, after.stderr
    assert f"genaug jobs: job {live_id} cancelled: cancelled by a client" in after.stderr
    typo = jobs("list", "--url", url, "--recipe", "shapez")
    assert typo.returncode == 1 and one_line(typo) == (
        f"genaug jobs: 404 from {url}: recipe = 'shapez': no such recipe, and no job of one; "
        "this service has: shapes")
    forgot = jobs("forget", live_id, "--url", url)
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.startswith(f"forgot {live_id} (recipe 'shapes') cancelled:")
    gone = jobs("show", live_id, "--url", url)
    assert gone.returncode == 1 and f"id {live_id!r}: no such job" in one_line(gone)
    unknown = jobs("show", "j_0123456789abcdef", "--url", url)
    assert unknown.returncode == 1 and one_line(unknown) == (
        f"genaug jobs: 404 from {url}: id 'j_0123456789abcdef': no such job; GET /v1/jobs "
        "lists the recent ones")


def test_wait_on_a_terminal_draws_the_jobs_own_rate_and_time_left_once(
        live: Any, terminal: Any, job_bars: Any) -> None:
    """The labels held 6 images each before the job asked 10: the bar starts at 18 of 30 and
    its rate and time left count only what the job made after that (a bar that took the 18
    for speed read about 9 images a second while nothing was made), with no second rate."""
    frames_of, rates_are_the_jobs_own = job_bars
    with Client(live.url) as client:
        assert client.fill("shapes", per_label=6).wait(timeout=60, poll_s=0.05)["state"] == "done"
        live.worker.gate.clear()  # nothing is made for the next job until the bar ran 2 s
        job = client.fill("shapes", per_label=10)
    term = terminal([sys.executable, "-m", "genaug.cli", "jobs", "wait", job.id or "",
                     "--url", live.url, "--poll", "0.2"])
    term.wait_for(lambda text: any(f[3] >= 2 for f in frames_of(text)), "2 s of the bar")
    live.worker.gate.set()
    assert term.end() == 0, term.text[-2000:]
    frames = frames_of(term.text)
    assert frames[0][1:3] == (18, 30), frames[0]
    assert frames[-1][1:3] == (30, 30), frames[-1]
    rates_are_the_jobs_own(frames)
    for line in term.text.replace("\n", "\r").split("\r"):
        assert line.count("img/s") + line.count("s/img") <= 1, line


def test_no_service_is_one_line_and_1_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = jobs("list", "--url", url)
    assert done.returncode == 1 and time.monotonic() - started < 20
    said = one_line(done)
    assert said.startswith(f"genaug jobs: no answer from the genaug service at {url}")
    # The fix names this command's flag, not the Python client's argument.
    assert "point the client at it with --url URL / GENAUG_URL" in said and "url=" not in said


def test_a_refused_key_names_the_flag_that_sends_one(make_service: Any) -> None:
    live = make_service(api_keys=["the-right-key"])
    done = jobs("list", "--url", live.url, "--api-key", "a-wrong-key")
    assert done.returncode == 1
    said = one_line(done)
    assert said.startswith(f"genaug jobs: 401 from {live.url}:"), said
    assert said.endswith("(pass --api-key KEY or set GENAUG_API_KEY)") and "api_key=" not in said


@pytest.mark.parametrize(("argv", "said"), [
    (["list", "--limit", "0"], "argument --limit: '0' is not a whole number in 1..1000; list at "
                               "most 1000 jobs at once (filter with --recipe / --state)"),
    (["list", "--state", "over"], "argument --state: invalid choice: 'over'"),
    (["wait", "j_0123456789abcdef", "--poll", "-1"],
     "argument --poll: '-1' is not a number of seconds > 0 and <= 3600; poll every second "
     "or so"),
    (["show"], "the following arguments are required: id"),
])
def test_bad_arguments_exit_2_naming_the_flag_and_the_fix(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["jobs", *argv])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_help_says_the_exit_statuses() -> None:
    done = subprocess.run([sys.executable, "-m", "genaug.cli", "jobs", "wait", "--help"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "300"})
    assert "exit status: 0 done (wait)" in done.stdout and "3 the job stopped" in done.stdout
    assert "130 Ctrl-C (the job goes on in the service" in done.stdout


@pytest.mark.slow  # a real Ctrl-C to a command's process group, through a terminal (~5 s)
def test_ctrl_c_while_waiting_leaves_the_job_running_and_says_how_to_cancel_it(
        live: Any) -> None:
    live.worker.gate.clear()
    with Client(live.url) as client:
        job = client.fill("shapes", per_label=4)
    # stderr on a terminal, as a person's (a pty has no size until given one, and tqdm
    # draws nothing in 0 columns): the progress bar is drawn there
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "genaug.cli", "jobs", "wait", job.id or "", "--url", live.url,
         "--poll", "0.2"],
        stdout=subprocess.PIPE, stderr=follower, start_new_session=True, text=True)
    os.close(follower)
    seen: list[str] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            seen.append(chunk.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while f"{job.id}:" not in "".join(seen) or "/12" not in "".join(seen):
            assert proc.poll() is None, "".join(seen)
            assert time.monotonic() < deadline, "no progress bar: " + "".join(seen)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        reader.join(10)
        os.close(leader)
    text = "".join(seen).replace("\r", "\n")
    lines = [line for line in text.splitlines() if line.strip()]
    assert proc.returncode == 130 and "Traceback" not in text, text
    assert lines[-1] == (
        f"genaug jobs: interrupted; job {job.id} goes on in the service; follow it again with "
        f"genaug jobs wait {job.id} --url {live.url}, or cancel it with genaug jobs cancel "
        f"{job.id} --url {live.url}"), lines[-1]
    with Client(live.url) as client:
        assert client.job(job.id or "")["state"] in ("queued", "running")
        client.cancel_job(job.id or "")
