"""A careless command line is one line and a non-zero exit, never a traceback or a false
success: the real ``genaug`` in a subprocess, as a person types it.

A flag's bad value is argparse's error line (``genaug CMD: error: argument --flag: ...``) and
exit status 2, before anything runs; a file or folder that cannot be used is the command's own
line, also exit status 2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from genaug.service.pool.open import open_pool
from genaug.service.recipes.load import load_recipes

ROOT = Path(__file__).resolve().parents[2]
V3 = ROOT / "tests" / "service" / "pool" / "data" / "pool_v3.db"


def genaug(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``genaug ARGV`` as a person runs it, with only the ``GENAUG_*`` variables given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return subprocess.run([sys.executable, "-m", "genaug.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, env={**clean, "COLUMNS": "200",
                                                           **(env or {})}, cwd=cwd)


def refused_by_argparse(done: subprocess.CompletedProcess[str], command: str, flag: str,
                        words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"genaug {command}: error: argument {flag}: "), last
    assert words in last, last


@pytest.mark.parametrize(("argv", "flag", "words"), [
    (["doctor", "--timeout", "-1"], "--timeout",
     "'-1' is not a number of seconds > 0 and <= 86400"),
    (["doctor", "--timeout", "nan"], "--timeout", "'nan' is not a number of seconds"),
    (["doctor", "--slots-per-class", "-4"], "--slots-per-class",
     "'-4' is not a whole number >= 1"),
    (["doctor", "--epoch-s", "-3"], "--epoch-s", "'-3' is not a number of seconds > 0"),
    (["doctor", "--url", "notaurl"], "--url",
     "'notaurl' is not a service URL (no http:// or https://); write http://HOST:PORT"),
    (["jobs", "list", "--url", "notaurl"], "--url",
     "'notaurl' is not a service URL (no http:// or https://); write http://HOST:PORT"),
    (["jobs", "show", "j_0123456789abcdef", "--url", "http://"], "--url",
     "'http://' names no host"),
    (["jobs", "wait", "j_0123456789abcdef", "--poll", "1e300"], "--poll",
     "'1e300' is not a number of seconds > 0 and <= 3600"),
    (["pregenerate", "--recipe", "r", "--per-label", "5", "--url", "notaurl"], "--url",
     "'notaurl' is not a service URL"),
    (["pregenerate", "--recipe", "r", "--per-label", "0"], "--per-label",
     "'0' is not a whole number >= 1"),
    (["pregenerate", "--recipe", "r", "--images", "-5", "--url", "http://127.0.0.1:9"],
     "--images", "'-5' is not a whole number >= 1"),
    (["demo", "--port", "99999"], "--port", "'99999' is not a whole number in 0..65535"),
    (["adapt", "data", "--seed", "-1"], "--seed", "'-1' is not a whole number in 0.."),
])
def test_a_bad_flag_value_is_argparses_line_and_exit_2(argv: list[str], flag: str,
                                                       words: str) -> None:
    command = " ".join(argv[:2]) if argv[0] == "jobs" else argv[0]
    refused_by_argparse(genaug(*argv), command, flag, words)


@pytest.fixture(scope="module")
def no_tensorflow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment where importing TensorFlow fails loudly: a refusal that came after the
    trainer started would end in ``genaug train needs the trainer extras`` instead of
    argparse's line (and the test stays fast)."""
    poison = tmp_path_factory.mktemp("no-tensorflow")
    (poison / "tensorflow").mkdir()
    (poison / "tensorflow" / "__init__.py").write_text(
        "raise ImportError('tensorflow imported', name='tensorflow')\n")
    return {"PYTHONPATH": os.pathsep.join([str(poison), *sys.path])}


@pytest.mark.parametrize(("argv", "flag", "words"), [
    (["--slots-per-class", "-4"], "--slots-per-class",
     "'-4' is not a whole number >= 1; the reservoir holds at least one image per class"),
    (["--p", "3"], "--p", "'3' is not a share in [0, 1]; 0 is none, 1 is all"),
    (["--p", "nan"], "--p", "'nan' is not a share in [0, 1]"),
    (["--service", "notaurl", "--recipe", "digits"], "--service",
     "'notaurl' is not a service URL (no http:// or https://); write http://HOST:PORT"),
    (["--service", "http://:8000", "--recipe", "digits"], "--service", "names no host"),
    (["--learning-rate", "-1"], "--learning-rate", "'-1' is not a learning rate > 0"),
    (["--learning-rate", "nan"], "--learning-rate", "'nan' is not a learning rate > 0"),
    (["--rebalance", "0,0,0"], "--rebalance", "'0,0,0' has no positive weight"),
    (["--rebalance", "1,-1,4"], "--rebalance", "'-1' is not a class weight >= 0"),
    (["--gpus", "-1"], "--gpus", "'-1' is not a whole number >= 0"),
    (["--gpus", ","], "--gpus", "',' holds no GPU indices"),
    (["--cpu-replicas", "0"], "--cpu-replicas", "'0' is not a whole number >= 1"),
    (["--demo-per-class", "-3"], "--demo-per-class", "'-3' is not a whole number >= 1"),
    (["--image-size", "4"], "--image-size", "'4' is not a whole number in 8..2048"),
    (["--batch-size", "0"], "--batch-size", "'0' is not a whole number >= 1"),
    (["--epochs", "-2"], "--epochs", "'-2' is not a whole number >= 1"),
    (["--steps-per-epoch", "0"], "--steps-per-epoch", "'0' is not a whole number >= 1"),
    (["--seed", "-1"], "--seed", "'-1' is not a whole number in 0..4294967295"),
    (["--feeder-batch", "0"], "--feeder-batch", "'0' is not a whole number >= 1"),
    (["--feeder-interval-s", "-1"], "--feeder-interval-s/--feeder-interval",
     "'-1' is not a number of seconds in [0, 86400]"),
    (["--feeder-wait-s", "inf"], "--feeder-wait-s", "'inf' is not a number of seconds"),
])
def test_genaug_train_refuses_a_bad_flag_before_tensorflow(
        no_tensorflow: dict[str, str], argv: list[str], flag: str, words: str) -> None:
    refused_by_argparse(genaug("train", "--epochs", "1", *argv, env=no_tensorflow), "train",
                        flag, words)


def test_genaug_train_takes_zero_seconds_where_zero_means_none(
        no_tensorflow: dict[str, str]) -> None:
    """``--feeder-interval-s 0`` (no pause) and ``--feeder-wait-s 0`` (the default: no wait)
    pass the flags: the command goes on to the trainer, which needs TensorFlow."""
    done = genaug("train", "--feeder-interval-s", "0", "--feeder-wait-s", "0",
                  env=no_tensorflow)
    assert done.returncode == 2 and "needs the trainer extras" in done.stderr, done.stderr


@pytest.mark.parametrize("command", [["jobs", "list"], ["doctor"]])
def test_a_malformed_genaug_url_is_said_before_anything_is_sent(command: list[str]) -> None:
    done = genaug(*command, env={"GENAUG_URL": "notaurl"})
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"genaug {command[0]}: GENAUG_URL entry 'notaurl' is not a service "
                           "URL (no http:// or https://); write http://HOST:PORT, e.g. "
                           "http://127.0.0.1:8000, or pass --url URL\n")


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    """A pool database holding recipe ``digits``'s pool (3 images) and its recipe."""
    db = tmp_path / "pool.db"
    shutil.copy(V3, db)
    recipe = load_recipes(ROOT / "recipes" / "digits.yaml")["digits"]
    with open_pool(db, capacity_per_label=100) as store:
        store.recipe_specs.record("digits-0123456789ab", recipe)
    return db


@pytest.mark.parametrize(("out", "words"), [
    ("afile", "--out {out} is a file, not a folder; give a folder (it is made if missing)"),
    ("afile/sub", "--out {out} cannot be made or written (a file is in its path); give a "
                  "folder you can write"),
    ("/proc/x", "--out {out} cannot be made or written (FileNotFoundError: "),
])
def test_export_into_a_folder_it_cannot_make_is_one_line(pool: Path, tmp_path: Path, out: str,
                                                         words: str) -> None:
    if out.startswith("/proc") and not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    (tmp_path / "afile").write_text("x")
    done = genaug("export", "--recipe", "digits", "--pool-path", str(pool), "--out", out,
                  cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("genaug export: ")]
    assert line.startswith("genaug export: " + words.format(out=out)), line
    assert done.stderr.strip().splitlines()[-1] == line


def test_export_with_a_malformed_recipes_file_refuses_it(pool: Path, tmp_path: Path) -> None:
    """The pool stores its recipe, so the export needs no file; but a file named and not
    read would be a false success."""
    bad = tmp_path / "MALFORMED.yaml"
    bad.write_text("recipes:\n  - name: [x\n")
    done = genaug("export", "--recipe", "digits", "--pool-path", str(pool), "--out",
                  str(tmp_path / "out"), "--recipes", str(bad), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [x for x in done.stderr.splitlines() if x.startswith("genaug export: ")]
    assert lines == [f"genaug export: invalid recipes file: {bad}:3:1: invalid YAML: expected "
                     "',' or ']', but got '<stream end>'"], done.stderr
    assert not (tmp_path / "out").exists()
