"""What ``genaug serve`` (and the other commands that build the settings) refuses before anything
loads, as a person meets it: the real command in a subprocess, one line on stderr naming what
to change, exit status 2.

- An invalid setting names its ``GENAUG_*`` variable (or the flag it came from), the value
  and what is allowed, never pydantic's field name, five lines and a link.
- A compile cache that cannot keep anything is refused before the model loads, instead of
  compiling for minutes and logging "could not save"; ``--warm-only`` that kept nothing
  exits 1.
- A shots folder holding a file that is not an image is refused when the recipes load,
  naming the file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def genaug(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``genaug ARGV`` as a person runs it, with only the ``GENAUG_*`` variables given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    return subprocess.run([sys.executable, "-m", "genaug.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, env={**clean, **(env or {})}, cwd=cwd)


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr's lines without the log records (timestamped) that may precede them."""
    return [line for line in done.stderr.splitlines()
            if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]


# -- invalid settings -------------------------------------------------------------------------

@pytest.mark.parametrize(("env", "flags", "line"), [
    ({"GENAUG_TURBO_STEPS": "0"}, [],
     "GENAUG_TURBO_STEPS=0 is not allowed: use a whole number from 1 to 50"),
    ({"GENAUG_TURBO_STEPS": "-3"}, [],
     "GENAUG_TURBO_STEPS=-3 is not allowed: use a whole number from 1 to 50"),
    ({"GENAUG_TURBO_KIND": "foo"}, [],
     "GENAUG_TURBO_KIND=foo is not allowed: use one of lcm, lightning, hyper-sd or tcd"),
    ({"GENAUG_TURBO_KIND": "lcm"}, [],
     "GENAUG_TURBO_KIND=lcm names the kind of GENAUG_TURBO_LORA, which is unset; set it to "
     "the LoRA file, or unset GENAUG_TURBO_KIND"),
    ({"GENAUG_COMPILE": "yes"}, [],
     "GENAUG_COMPILE=yes is not allowed: use one of off, unet or regional"),
    ({"GENAUG_MAX_N": "-1"}, [], "GENAUG_MAX_N=-1 is not allowed: use a whole number >= 1"),
    ({"GENAUG_SCHEDULER": "Turbo"}, [],
     "GENAUG_SCHEDULER=Turbo is not allowed: use one of default, euler, euler_a, dpmpp_2m, "
     "dpmpp_2m_karras, unipc, lcm, tcd or euler_trailing"),
    ({"GENAUG_PORT": "abc"}, [],
     "GENAUG_PORT=abc is not allowed: use a whole number from 0 to 65535"),
    ({"GENAUG_WARMUP": "maybe"}, [],
     "GENAUG_WARMUP=maybe is not allowed: use true or false (also 1/0, yes/no, on/off)"),
    ({"GENAUG_DEFAULT_SIZE": "12"}, [],
     "GENAUG_DEFAULT_SIZE=12 is not a multiple of 8 (the VAE downsamples by 8)"),
    ({"GENAUG_LOG_LEVEL": "bogus"}, [],
     "GENAUG_LOG_LEVEL='bogus' is no log level; use debug, info, warning, error or critical"),
    ({"GENAUG_REPLICA": "bogus"}, [],
     "GENAUG_REPLICA='bogus' is not i/N with 0 <= i < N; write e.g. 0/2 and 1/2"),
    ({}, ["--port", "99999"], "--port 99999 is not allowed: use a whole number from 0 to 65535"),
    ({"GENAUG_ROLE": "broker"}, [],
     "GENAUG_ROLE=broker is not allowed: use one of all, api or worker"),
    ({"GENAUG_POOL_URL": "postgresql://u:p@127.0.0.1:9/db"}, ["--role", "api"],
     "--role api serves the pools of GENAUG_RECIPES and finds its workers through them: set "
     "GENAUG_RECIPES to the workers' recipe file"),
    ({}, ["--turbo-kind", "lcm"],
     "--turbo-kind lcm names the kind of GENAUG_TURBO_LORA, which is unset; set it to the "
     "LoRA file, or unset --turbo-kind"),
    ({}, ["--warmup-shapes", "64x64"],
     "--warmup-shapes 64x64: warm-up shape '64x64' is not HxW:batch; write e.g. 1024x1024:8"),
])
def test_an_invalid_setting_is_one_line_naming_the_variable_the_value_and_what_is_allowed(
        env: dict[str, str], flags: list[str], line: str) -> None:
    done = genaug("serve", *flags, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("genaug serve: " + line), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_every_invalid_setting_gets_its_line_and_a_secret_is_never_printed() -> None:
    done = genaug("serve", "--port", "99999", "--max-n", "0",
                  env={"GENAUG_COMPILE": "yes", "GENAUG_API_KEYS": "k",
                       "GENAUG_WEBHOOK_SECRET": "s3cret-value-here"})
    assert done.returncode == 2
    assert said(done) == [
        "genaug serve: --port 99999 is not allowed: use a whole number from 0 to 65535",
        "genaug serve: --max-n 0 is not allowed: use a whole number >= 1",
        "genaug serve: GENAUG_COMPILE=yes is not allowed: use one of off, unet or regional",
    ], done.stderr
    assert "s3cret" not in done.stderr and "validation error" not in done.stderr


@pytest.mark.parametrize("command", [["pool", "list"], ["pregenerate", "--recipe", "r",
                                                        "--per-label", "2"]])
def test_the_pool_commands_say_an_invalid_setting_the_same_way(
        command: list[str], tmp_path: Path) -> None:
    done = genaug(*command, "--pool-path", str(tmp_path / "p.db"),
                  env={"GENAUG_MAX_N": "-1", "GENAUG_RECIPES": str(tmp_path / "r.yaml")})
    assert done.returncode == 2, done.stderr
    name = " ".join(command[:1] if command[0] != "pool" else command)
    assert said(done) == [f"genaug {name}: GENAUG_MAX_N=-1 is not allowed: use a whole "
                          "number >= 1"], done.stderr
    assert "Traceback" not in done.stderr


# -- the compile cache ------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_compile_cache_that_cannot_be_written_is_refused_before_anything_compiles(
        tmp_path: Path, where: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    cache = afile if where == "a file" else afile / "compile"
    started = time.monotonic()
    done = genaug("serve", "--warm-only", "--model", "tiny-random", cwd=tmp_path,
                  env={"GENAUG_COMPILE": "unet", "GENAUG_COMPILE_CACHE": str(cache)})
    took = time.monotonic() - started
    why = "is a file, not a folder" if where == "a file" else "cannot be written"
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"genaug serve: GENAUG_COMPILE_CACHE={cache} {why}")
    # before the model loads, so long before anything compiles: not one log record
    assert done.stderr.count("\n") == 1 and took < 60, (took, done.stderr[-2000:])


@pytest.mark.slow  # one compile of the tiny UNet on the CPU (~25 s)
def test_warm_only_that_kept_nothing_exits_1(tmp_path: Path) -> None:
    """The cache folder passes the check at start, and is gone (a file in its place) when the
    warm-up's entry is saved: the service would serve (it logs the failure), ``--warm-only``,
    whose one job is to fill the cache, says it kept nothing and exits 1."""
    cache = tmp_path / "cache"
    env = {"GENAUG_COMPILE": "regional", "GENAUG_COMPILE_CACHE": str(cache),
           "GENAUG_MODEL": "tiny-random", "GENAUG_MAX_BATCH_IMAGES": "1",
           "GENAUG_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "genaug.cli", "serve", "--warm-only"],
                                stdout=subprocess.PIPE, stderr=out, text=True,
                                env={**clean, **env}, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "no entry yet; the warm-up compiles" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        cache.rmdir()
        cache.write_text("the volume went away")
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 1, text[-3000:]
    assert "could not save" in text and stdout == ""
    last = said(subprocess.CompletedProcess([], 1, "", text))[-1]
    assert last.startswith("genaug serve --warm-only: warmed up") and "kept nothing (not " \
        "saved (FileExistsError" in last and "the next start compiles again" in last, last


# -- a shots folder with a file that is not an image -----------------------------------------

RECIPE = """\
recipes:
  - name: digits
    height: 64
    width: 64
    steps: 4
    guidance: 3.0
    judge: {shots: shots}
    labels:
      "5": {prompts: [a handwritten five]}
      "6": {prompts: [a handwritten six]}
"""


def test_a_shot_that_is_not_an_image_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    from PIL import Image

    for label in ("5", "6"):
        (tmp_path / "root" / "shots" / label).mkdir(parents=True)
        Image.new("RGB", (8, 8), (255, 255, 255)).save(tmp_path / "root" / "shots" / label /
                                                       "a.png")
    fake = tmp_path / "root" / "shots" / "6" / "fake.png"
    fake.write_text("x\n")  # echo x > shots/6/fake.png
    (tmp_path / "r.yaml").write_text(RECIPE)
    env = {"GENAUG_DATA_ROOT": str(tmp_path / "root"), "GENAUG_RECIPES": "r.yaml",
           "GENAUG_MODEL": "tiny-random", "GENAUG_POOL_PATH": str(tmp_path / "p.db")}
    for argv in (["serve", "--warm-only"],
                 ["pregenerate", "--recipe", "digits", "--per-label", "2"]):
        done = genaug(*argv, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "could not be loaded" not in done.stderr
        (line,) = said(done)
        assert line.startswith(f"genaug {argv[0]}: invalid recipes file: r.yaml: recipe "
                               f"'digits' judge.shots: 'shots': {fake} is not an image "), line
        assert line.endswith("remove it, or replace it with a .png or .jpg of the label"), line
    assert not (tmp_path / "p.db").exists()
