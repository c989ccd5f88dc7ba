"""A ``genaug gain`` run killed with Ctrl-C keeps its finished cells; run again, it says so
and ends with the figures of a run never interrupted."""

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
            *FAST, "--seeds", "2", "--jobs", "1", "--steps", "60"]
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
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "run the same command to continue" in err
    kept = len(cells.read_text().splitlines())
    assert 2 <= kept < 4
    again = gain(*args, "--out", str(cut), cwd=digits["root"])
    assert again.returncode == 0, again.stderr
    assert f"resuming {cut}: {kept} of 4 cells already trained" in again.stderr
    assert summary(cut) == summary(whole)
