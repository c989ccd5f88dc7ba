"""A ``genaug gain`` run killed with Ctrl-C keeps its finished cells; run again, it says so
and ends with the figures of a run never interrupted.

The Ctrl-C must land mid-run, whatever the machine's speed: a cell of this size trains in a
fraction of a second on a quiet machine, so the run is stopped (SIGSTOP) the moment its second
cell is on disk, interrupted while stopped, and then continued; six cells still to train
cannot all finish in the few milliseconds between the poll and the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _gain_helpers import FAST, gain, summary


def test_a_killed_run_resumes_to_the_same_figures(digits: dict[str, Path]) -> None:
    args = [str(digits["data"]), "--arms", "real", "--extra", f"heldout={digits['heldout']}",
            *FAST, "--seeds", "4", "--jobs", "1", "--steps", "60"]
    whole = digits["root"] / "whole"
    assert gain(*args, "--out", str(whole), cwd=digits["root"]).returncode == 0
    cut = digits["root"] / "cut"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    proc = subprocess.Popen([sys.executable, "-m", "genaug.cli", "gain", *args, "--out",
                             str(cut)], cwd=digits["root"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    cells = cut / "gain-cells.jsonl"
    deadline = time.monotonic() + 300
    while not (cells.is_file() and len(cells.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no cell finished"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGSTOP)  # held where it is: the Ctrl-C lands mid-run
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole process group
    os.killpg(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command to continue" in err
    kept = len(cells.read_text().splitlines())
    assert 2 <= kept < 8
    again = gain(*args, "--out", str(cut), cwd=digits["root"])
    assert again.returncode == 0, again.stderr
    assert f"resuming {cut}: {kept} of 8 cells already trained" in again.stderr
    assert summary(cut) == summary(whole)
