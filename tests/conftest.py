"""Shared fixtures: one tiny model per session, real uvicorn servers on 127.0.0.1, and the
test recipe.

Servers run in a thread of the test process (:mod:`genaug.service.testing`), so tests can
share the already-built tiny pipeline and hold or count pipeline calls through
``live.worker``, a ``GateWorker``. TensorFlow never runs in this process (trainer tests use
subprocesses). ``shapes_recipe`` / ``shapes_recipes_file`` are the one test recipe of the
pool, replica and hot-path tests.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Tests import the benchmarks (bench/ runs from the checkout, it is not installed). The root
# goes LAST on the path: first, its genaug/ folder (which has no service/ inside: the
# package-dir mapping lives in the install) would hide an installed genaug. And it goes on
# BEFORE the first `import genaug`: pytest has put tests/ on the path, where tests/genaug/
# (no __init__.py) would otherwise import as a namespace package `genaug` whenever the
# package is found only through the editable install's finder (`pytest` run as a script).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from genaug.service.testing import LiveService, load_tiny, start_service  # noqa: E402

if TYPE_CHECKING:
    from genaug.service.pipeline.load import LoadedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# What compiling made is kept (GENAUG_COMPILE_CACHE) in a folder of this run, never in the
# user's ~/.cache; subprocesses inherit it. Removed at the end of the session.
_COMPILE_CACHE = tempfile.mkdtemp(prefix="genaug-test-compile-cache-")
os.environ["GENAUG_COMPILE_CACHE"] = _COMPILE_CACHE
atexit.register(shutil.rmtree, _COMPILE_CACHE, True)

_STARTED = pytest.StashKey[tuple[float, tuple[float, float, float]]]()
#: Seconds per test file (setup, call and teardown of its tests) in a recorded run: the suite
#: runs the longest files first, so that two workers end together rather than one finishing
#: a long file alone at the end. ``GENAUG_TEST_DURATIONS=tests/durations.json make test``
#: records them again.
_DURATIONS = Path(__file__).with_name("durations.json")
_SECONDS: dict[str, float] = {}

SHAPES_RECIPE = """\
recipes:
  - name: shapes
    height: 32
    width: 32
    steps: 2
    guidance: 3.0
    base_seed: 7
    labels:
      circle: {prompts: ["a circle", "a round circle"]}
      square: {prompts: ["a square"]}
      triangle: {prompts: ["a triangle"], negative_prompt: "blurry"}
"""


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = (time.monotonic(), os.getloadavg())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    """The run's last line says how busy the machine was: a suite's time means little
    without it (the same tests take twice as long beside two other busy processes)."""
    started = config.stash.get(_STARTED, None)
    if started is None or hasattr(config, "workerinput"):  # an xdist worker: the controller says
        return
    began, before = started
    after = os.getloadavg()
    workers = getattr(config.option, "numprocesses", None) or 1
    terminalreporter.write_line(
        f"genaug: {time.monotonic() - began:.0f} s on {os.cpu_count()} CPUs with {workers} "
        f"worker(s); load average {before[0]:.2f} at the start, {after[0]:.2f} at the end "
        f"(1 minute), {after[1]:.2f} over the last 5 minutes")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` by their file's recorded seconds, longest first (files not recorded
    after, in collection order); a file's tests keep their order. The Makefile runs xdist
    with ``--dist loadfile --no-loadscope-reorder``, which hands out files in this order."""
    try:
        seconds = {str(k): float(v) for k, v in json.loads(_DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(_file_of(item.nodeid), index)
    items.sort(key=lambda item: (-seconds.get(_file_of(item.nodeid), 0.0),
                                 first[_file_of(item.nodeid)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's time to its file's (in the controller, for every worker's report)."""
    name = _file_of(report.nodeid)
    _SECONDS[name] = _SECONDS.get(name, 0.0) + float(report.duration)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``GENAUG_TEST_DURATIONS=PATH``, write this run's seconds per file there."""
    path = os.environ.get("GENAUG_TEST_DURATIONS")
    if not path or hasattr(session.config, "workerinput") or not _SECONDS:
        return
    ordered = dict(sorted(((k, round(v, 1)) for k, v in _SECONDS.items()),
                          key=lambda kv: -kv[1]))
    Path(path).write_text(json.dumps(ordered, indent=0) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def no_pool_file_in_the_checkout() -> Iterator[None]:
    """The suite leaves no ``genaug-pool.db`` (the default GENAUG_POOL_PATH) in the
    repository root: a test that starts a service or a command with recipes gives it a pool
    path (and a cwd) under its tmp_path."""
    leftover = Path(__file__).resolve().parents[1] / "genaug-pool.db"
    before = leftover.exists()
    yield
    if not before and leftover.exists():
        pytest.fail(f"a test left {leftover}: give its service or command a pool path (or "
                    "cwd) under tmp_path")


@pytest.fixture(scope="session")
def tiny_model() -> LoadedModel:
    """The tiny SDXL pipeline, built once per session and shared by every test server."""
    return load_tiny()


@pytest.fixture(scope="session")
def service(tiny_model: LoadedModel) -> Iterator[LiveService]:
    """The session's shared service: tiny model, default limits, batches of up to 8."""
    live = start_service(tiny_model, max_batch_images=8, max_wait_ms=20, max_queue_images=4096)
    yield live
    live.stop()


@pytest.fixture
def make_service(tiny_model: LoadedModel) -> Iterator[Callable[..., LiveService]]:
    """Start extra services with their own settings; all stopped at the end of the test."""
    started: list[LiveService] = []

    def make(**kwargs: Any) -> LiveService:
        live = start_service(tiny_model, **kwargs)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


@pytest.fixture(scope="session")
def shapes_recipe() -> str:
    """The YAML of the test recipe file: one recipe ``shapes``, 32x32 in 2 steps, base seed 7,
    labels circle (two prompts), square and triangle (with a negative prompt). Tests that need
    a variant edit the text (``shapes_recipe.replace("steps: 2", "steps: 0")``)."""
    return SHAPES_RECIPE


@pytest.fixture
def fill_service(make_service: Callable[..., LiveService], tmp_path: Path,
                 shapes_recipes_file: Path) -> Iterator[LiveService]:
    """A service with the ``shapes`` recipe, its pool in ``tmp_path``, no pre-generation: every
    image is one a fill asked for. Clear ``worker.gate`` to hold a fill's job live; it is
    opened again at the end."""
    service = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                           pregenerate=False, max_batch_images=8, max_wait_ms=5)
    yield service
    assert service.worker is not None
    service.worker.gate.set()


@pytest.fixture
def shapes_recipes_file(tmp_path: Path, shapes_recipe: str) -> Path:
    """``shapes_recipe`` written to ``tmp_path / "recipes.yaml"`` (for ``GENAUG_RECIPES``)."""
    path = tmp_path / "recipes.yaml"
    path.write_text(shapes_recipe)
    return path


class Terminal:
    """A command whose stderr is a terminal (a pty of 160 columns, as a person's: tqdm draws
    nothing in 0 columns), in its own process group; what it draws is read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        import fcntl
        import pty
        import struct
        import subprocess
        import termios
        import threading

        self._leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
        base = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower,
                                     start_new_session=True, text=True,
                                     env={**base, **(env or {}), "PYTHONUNBUFFERED": "1"})
        os.close(follower)
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._leader, 4096)
            except OSError:  # the terminal closed with the process
                return
            if not chunk:
                return
            self._chunks.append(chunk.decode(errors="replace"))

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    def wait_for(self, seen: Callable[[str], bool], what: str, timeout: float = 60) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not seen(self.text):
            assert self.proc.poll() is None, f"ended before {what}:\n{self.text[-3000:]}"
            assert time.monotonic() < deadline, f"no {what}:\n{self.text[-3000:]}"
            time.sleep(0.05)

    def end(self, timeout: float = 60) -> int:
        """The exit status; the command is killed (and the test fails) past ``timeout``."""
        import signal
        import subprocess

        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            pytest.fail(f"still running after {timeout:.0f} s:\n{self.text[-3000:]}")
        finally:
            self._reader.join(10)
            os.close(self._leader)
        return self.proc.returncode


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    """Start commands on a terminal (:class:`Terminal`); any still running at the end are
    killed."""
    started: list[Terminal] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> Terminal:
        term = Terminal(argv, env)
        started.append(term)
        return term

    yield start
    import signal

    for term in started:
        if term.proc.poll() is None:
            os.killpg(term.proc.pid, signal.SIGKILL)
            term.proc.wait(30)


#: One frame of a tqdm bar: ``circle: 30%|###    | 12/40 [00:03<00:09, 3.10img/s`` (the rate
#: in ``s/img`` below 1 a second, ``?img/s`` before any progress).
BAR_FRAME = (r"([\w.-]+) *: *\d+%\|[^|]*\| *(\d+)/(\d+) \[(\d+):(\d\d)<[^,\]]*, +"
             r"([0-9.]+|\?)(img/s|s/img)")

#: A frame read back: ``(bar, n, total, elapsed s, images/s or None)``.
Frame = tuple[str, int, int, float, "float | None"]


def bar_frames(text: str) -> list[Frame]:
    """Every bar frame in a terminal's text."""
    import re

    frames = []
    for bar, n, total, minutes, seconds, rate, unit in re.findall(BAR_FRAME, text):
        value = None if rate == "?" else (float(rate) if unit == "img/s" else 1 / float(rate))
        frames.append((bar, int(n), int(total), 60.0 * int(minutes) + int(seconds), value))
    return frames


def assert_rates_are_the_jobs_own(frames: list[Frame]) -> None:
    """Each bar's rate counts only what came after its first frame: rate x elapsed (whole
    seconds, rounded down) never exceeds the images gained since then (plus one for
    rounding); a bar that counted what the labels already held would read tens of images a
    second. And one rate per frame: nothing else on the line says img/s."""
    assert frames, "no progress bar was drawn"
    first: dict[str, int] = {}
    for bar, n, total, elapsed, rate in frames:
        start = first.setdefault(bar, n)
        if rate is not None and elapsed >= 1:
            assert rate * elapsed <= (n - start) + 1, (bar, n, total, elapsed, rate, start)


@pytest.fixture
def job_bars() -> tuple[Callable[[str], list[Frame]], Callable[[list[Frame]], None]]:
    """``(bar_frames, assert_rates_are_the_jobs_own)``, for tests that read a terminal's
    progress bars."""
    return bar_frames, assert_rates_are_the_jobs_own
