"""Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group.

Each command runs in its own process group (``start_new_session=True``, as a shell's job), the
test reads its output until the phase under test, records every descendant process (by PID,
from ``/proc/<pid>/task/*/children``, whatever session or group they run in), sends SIGINT to
the group with ``os.killpg``, and asserts what a person at the terminal gets: exit status 130,
no traceback, one line that says what was kept, and no process of the command left 5 s later.
Linux only (``/proc``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"


def _needs_tensorflow() -> None:
    """Skip without TensorFlow, found without importing it: this pytest process never holds
    it (tests/trainer/test_findings.py checks that), TensorFlow runs in the children."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs tensorflow (the trainer extra)")


# Slow: each test starts a real command (a service, TensorFlow) and waits for a phase of it,
# about 10 s each on 2 cores; `make test-slow` and CI run them after the suite.
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="reads processes from /proc (Linux)")]


# -- processes, by PID ----------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in ticks): a PID with another start time is
    another process. None when it is gone or a zombie (dead, only not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in {"Z", "X"} else fields[19]


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid`` (children, their children...), PID to start time."""
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except OSError:
                continue
            for kid in kids:
                started = _start_time(kid)
                if started is not None and kid not in found:
                    found[kid] = started
                    todo.append(kid)
    return found


def still_running(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` that still run (same PID, same start time), with their command."""
    left = {}
    for pid, started in processes.items():
        if _start_time(pid) == started:
            try:
                left[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
            except OSError:
                continue
    return left


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def has_loaded(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class Job:
    """A command in its own process group, as a shell starts it; its output read as it comes
    (in chunks: progress bars end their lines with a carriage return)."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            cwd=cwd, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        self.streams = {"out": "", "err": ""}
        self.commands: dict[int, str] = {}
        self.children: dict[int, str] = {}
        self._new = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(pipe, name), daemon=True)
                         for pipe, name in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: Any, name: str) -> None:
        while chunk := os.read(pipe.fileno(), 65536):
            with self._new:
                self.streams[name] += chunk.decode(errors="replace")
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    @property
    def out(self) -> str:
        return self.streams["out"]

    @property
    def err(self) -> str:
        return self.streams["err"]

    def text(self) -> str:
        return self.out + "\n--- stderr ---\n" + self.err

    def wait_for(self, seen: Callable[[], bool], what: str, timeout: float) -> None:
        """Until ``seen()``; fails naming ``what`` when the job ends or the time is up."""
        deadline = time.monotonic() + timeout
        with self._new:
            while not seen():
                if self.proc.poll() is not None:
                    pytest.fail(f"ended (exit {self.proc.returncode}) before {what}:\n"
                                + self.text()[-3000:])
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"no {what} within {timeout:.0f} s:\n" + self.text()[-3000:])
                self._new.wait(0.2)

    def printed(self, marker: str, *, stream: str = "out") -> Callable[[], bool]:
        return lambda: marker in self.streams[stream]

    def interrupt(self, sig: signal.Signals = signal.SIGINT, *, group: bool = True,
                  timeout: float = 60.0) -> tuple[dict[int, str], float]:
        """Record the descendants, send ``sig`` (to the group, as a terminal does), wait for
        the exit; return the descendants and the seconds from the signal to the exit."""
        before = self.children = descendants(self.proc.pid)
        self.commands = {pid: cmdline(pid) for pid in before}
        sent = time.monotonic()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"still running {timeout:.0f} s after {sig.name}:\n"
                        + self.text()[-3000:])
        took = time.monotonic() - sent
        for reader in self._readers:
            reader.join(10)
        return before, took

    def interrupt_after(self, marker: str, what: str, timeout: float,
                        sig: signal.Signals = signal.SIGINT, *, stream: str = "out",
                        group: bool = True) -> tuple[dict[int, str], float, dict[int, str]]:
        """Wait for ``marker`` (naming ``what``), then :meth:`interrupt`; return the
        descendants, the seconds to the exit and those still running 5 s later. The job is
        stopped whatever happens: a failed test leaves nothing."""
        try:
            self.wait_for(self.printed(marker, stream=stream), what, timeout)
            children, took = self.interrupt(sig, group=group)
            return children, took, gone_within(children, 5.0)
        finally:
            self.stop()

    def stop(self) -> None:
        """Whatever is left of the job and its descendants, those recorded at the signal
        included (orphans are no longer descendants), killed: a failed test leaves nothing."""
        for pid in {self.proc.pid, *descendants(self.proc.pid), *still_running(self.children)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)


def gone_within(processes: dict[int, str], seconds: float) -> dict[int, str]:
    """Those of ``processes`` still running ``seconds`` from now (or {} once all are gone)."""
    deadline = time.monotonic() + seconds
    while (left := still_running(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def assert_one_line_ending(job: Job, code: int, *, starts: str) -> str:
    """Exit ``code``, no traceback anywhere, and stderr's last line starts with ``starts``."""
    assert job.proc.returncode == code, job.text()[-3000:]
    assert "Traceback" not in job.text(), job.text()[-3000:]
    lines = [line for line in job.err.replace("\r", "\n").splitlines() if line.strip()]
    assert lines, job.text()[-3000:]
    last = lines[-1]
    assert last.startswith(starts), job.text()[-3000:]
    return last


def genaug(*args: str) -> list[str]:
    return [sys.executable, "-m", "genaug.cli", *args]


def demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return {**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# -- genaug demo ------------------------------------------------------------------------------


def test_ctrl_c_while_the_demo_draws_its_grid_ends_in_one_line_and_stops_the_service(
    tmp_path: Path,
) -> None:
    """Interrupted while the grid's twenty requests are in flight: the service child is
    stopped (in the demo's own group, it got the SIGINT too), the demo says so in one line."""
    job = Job(genaug("demo", "--no-train", "--out", str(tmp_path / "grid.png")),
              env=demo_env(), cwd=tmp_path)
    _, took, left = job.interrupt_after("[2/4] ready", "the service ready and the grid started",
                                        180)
    assert any("genaug.service" in cmd for cmd in job.commands.values()), job.commands
    assert left == {}, f"left running 5 s after the demo exited: {left}"
    line = assert_one_line_ending(job, 130, starts="genaug demo: interrupted; ")
    assert job.err.strip() == line  # nothing else on stderr: the one line
    assert "run genaug demo again" in line
    assert took < 10, f"the demo took {took:.1f} s to stop"


def test_sigterm_to_the_demo_alone_stops_its_children_and_says_terminated(
    tmp_path: Path,
) -> None:
    """``kill PID`` (SIGTERM to the demo only, as ``timeout`` or a supervisor sends it): the
    same cleanup as Ctrl-C; before, the demo died at once and its service ran on."""
    job = Job(genaug("demo", "--no-train", "--out", str(tmp_path / "grid.png")),
              env=demo_env(), cwd=tmp_path)
    children, _, left = job.interrupt_after("[2/4] ready", "the service ready", 180,
                                            signal.SIGTERM, group=False)
    assert children and left == {}, f"left running: {left}"
    assert_one_line_ending(job, 143, starts="genaug demo: terminated (SIGTERM); ")


def test_kill_9_of_the_demo_still_ends_its_service(tmp_path: Path) -> None:
    """The parent cannot clean up after SIGKILL: the kernel ends its children
    (PR_SET_PDEATHSIG), so no service is left holding its port and its pool."""
    job = Job(genaug("demo", "--no-train", "--out", str(tmp_path / "grid.png")),
              env=demo_env(), cwd=tmp_path)
    children, _, left = job.interrupt_after("[2/4] ready", "the service ready", 180,
                                            signal.SIGKILL, group=False)
    assert children and left == {}, f"left running 5 s after kill -9 of the demo: {left}"


@pytest.mark.slow  # the service, the grid, then TensorFlow's import and a first training run
def test_ctrl_c_while_the_demo_trains_in_its_tensorflow_child(tmp_path: Path) -> None:
    """The reported case: Ctrl-C while the TensorFlow child trains. Before, a 10-line
    traceback, exit -2, and the TensorFlow child running on after the demo had exited."""
    _needs_tensorflow()
    job = Job(genaug("demo", "--out", str(tmp_path / "grid.png")), env=demo_env(),
              cwd=tmp_path)

    def tensorflow_child() -> int | None:
        return next((pid for pid in descendants(job.proc.pid)
                     if "genaug.experiments.fewshot" in cmdline(pid)), None)

    try:
        job.wait_for(job.printed("[3/4]"), "the training phase", 300)
        job.wait_for(lambda: (pid := tensorflow_child()) is not None
                     and has_loaded(pid, "tensorflow"), "TensorFlow loaded in its child", 180)
        time.sleep(3.0)  # into the first run's steps
        tf_pid = tensorflow_child()
        children, took = job.interrupt()
        left = gone_within(children, 5.0)
    finally:
        job.stop()
    assert tf_pid in children and len(children) >= 2, children  # the service and TensorFlow
    assert left == {}, f"left running 5 s after the demo exited: {left}"
    line = assert_one_line_ending(job, 130, starts="genaug demo: interrupted; ")
    assert job.err.strip() == line
    assert took < 10, f"the demo took {took:.1f} s to stop"


# -- pregenerate, train, adapt, serve ----------------------------------------------------------


def test_pregenerate_keeps_every_finished_batch_and_a_second_ctrl_c_ends_in_one_line(
    tmp_path: Path,
) -> None:
    """The first Ctrl-C lets the batch in progress be stored (exit 130, "every finished batch
    is kept"); a second one, as the line it prints invites, stops at once: one line, no
    traceback (before: a KeyboardInterrupt traceback out of the pipeline)."""
    env = {**demo_env(), "GENAUG_POOL_PATH": str(tmp_path / "pool.db"),
           "GENAUG_MAX_BATCH_IMAGES": "10"}
    argv = genaug("pregenerate", "--recipes", str(RECIPES / "digits.yaml"), "--recipe",
                  "digits", "--per-label", "200")
    first = Job(argv, env=env, cwd=tmp_path)
    try:
        first.wait_for(first.printed("img", stream="err"), "the progress bars", 180)
        time.sleep(1.0)
        _, _ = first.interrupt()
    finally:
        first.stop()
    assert_one_line_ending(first, 130, starts="stopped; every finished batch is kept")

    second = Job(argv, env=env, cwd=tmp_path)
    try:
        second.wait_for(second.printed("img", stream="err"), "the progress bars", 180)
        time.sleep(1.0)
        os.killpg(second.proc.pid, signal.SIGINT)
        second.wait_for(second.printed("Ctrl-C again", stream="err"), "the stop notice", 30)
        children, _ = second.interrupt()
        left = gone_within(children, 5.0)
    finally:
        second.stop()
    assert left == {}
    line = assert_one_line_ending(second, 130, starts="genaug pregenerate: interrupted; ")
    assert "every batch stored before the interrupt is kept" in line


def test_ctrl_c_during_genaug_train_ends_in_one_line(tmp_path: Path) -> None:
    _needs_tensorflow()
    env = {**demo_env(), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "KERAS_BACKEND": "tensorflow"}
    job = Job(genaug("train", "--epochs", "1000", "--demo-per-class", "16", "--cpu-replicas",
                     "2"), env=env, cwd=tmp_path)
    _, took, left = job.interrupt_after("Epoch 2/", "the second epoch", 240)
    assert left == {}
    line = assert_one_line_ending(job, 130, starts="genaug train: interrupted; ")
    assert "nothing is saved" in line
    assert took < 15, f"train took {took:.1f} s to stop"


def write_digits(root: Path, per_label: int = 2) -> Path:
    """DATA/<digit>/<i>.png: real few-shot digits, as a user's folder of shots."""
    from PIL import Image

    from genaug.digits import load_split, subset

    images, labels = load_split("fewshot")
    for index in subset(labels, per_label, seed=0):
        folder = root / str(int(labels[index]))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[index]).save(folder / f"{index}.png")
    return root


def test_ctrl_c_during_adapt_saves_the_lora_and_exits_130(tmp_path: Path) -> None:
    data = write_digits(tmp_path / "data")
    out = tmp_path / "digits.safetensors"
    job = Job(genaug("adapt", str(data), "--recipes", str(RECIPES / "digits.yaml"),
                     "--recipe", "digits", "--out", str(out), "--model", "tiny-digits-base",
                     "--steps", "100000", "--batch-size", "2", "--no-check"),
              env=demo_env(), cwd=tmp_path)
    _, _, left = job.interrupt_after("loss=", "the first training steps", 180, stream="err")
    assert left == {}
    assert job.proc.returncode == 130 and "Traceback" not in job.text(), job.text()[-3000:]
    assert "interrupted" in job.out and out.is_file()  # what was learned is saved


@pytest.mark.parametrize(("marker", "phase"), [
    ("Uvicorn running", "loading the model"),
    ("warm-up 1 of 2, 64x64:1", "warming up"),
    ("ready:", "ready"),
])
def test_ctrl_c_stops_genaug_serve_in_one_line_whatever_it_is_doing(
        tmp_path: Path, marker: str, phase: str) -> None:
    """uvicorn shuts down gracefully on SIGINT; then serve ends as every command does: one
    line saying what was kept, exit status 130, none of uvicorn's own shutdown lines, no
    traceback: while it loads the model, while it warms up, and once it serves."""
    from genaug.local_service import free_port

    port = free_port()
    env = demo_env()
    if phase == "warming up":  # a warm-up long enough to be caught in (seconds, not 0.1 s)
        env["GENAUG_WARMUP_SHAPES"] = "512x512:8,512x512:8,512x512:8"
    job = Job(genaug("serve", "--port", str(port), "--recipes", str(RECIPES / "digits.yaml"),
                     "--pool-path", str(tmp_path / "pool.db")), env=env, cwd=tmp_path)
    _, took, left = job.interrupt_after(marker, phase, 180, stream="err")
    assert left == {}
    last = assert_one_line_ending(job, 130, starts="genaug serve: interrupted; the service "
                                                    "stopped")
    assert "every image stored in the pool is kept" in last
    for uvicorn_line in ("Shutting down", "Waiting for application shutdown",
                         "Application shutdown complete", "Finished server process"):
        assert uvicorn_line not in job.err, job.err[-2000:]
    if phase == "ready":
        assert "ready:" in job.err
    # the graceful stop waits for the pool batch in progress: 2 s idle, 15 s measured on a
    # busy 2-core machine
    assert took < 30, f"serve took {took:.1f} s to stop"


# -- the examples -----------------------------------------------------------------------------


def test_ctrl_c_during_the_trainer_example_ends_in_one_line(
    make_service: Any, tmp_path: Path
) -> None:
    _needs_tensorflow()
    live = make_service(recipes=RECIPES / "wound_phases.yaml", pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    env = {**demo_env(), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "KERAS_BACKEND": "tensorflow"}
    job = Job([sys.executable, str(ROOT / "examples" / "trainer_example.py"), live.url,
               "--epochs", "100000", "--steps", "4"], env=env, cwd=tmp_path)
    _, _, left = job.interrupt_after("Epoch 2/", "the second epoch", 240)
    assert left == {}
    assert_one_line_ending(job, 130, starts="trainer_example: interrupted; ")
