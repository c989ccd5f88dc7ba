"""The README's ``genaug gain`` example, run as written against the service it names.

``genaug serve --recipes recipes/digits.yaml --pregenerate false`` (the README's command, the
embedded model, a pool of the test's own), the README's ``python -m genaug.digits`` line, then
its ``genaug gain`` line word for word (``/tmp/`` becomes the test's folder): it must end with
a report whose verdicts it printed (the minutes the README states for 2 cores are
docs/gain.md's measured figure; the limit here is the test's timeout, generous for a busy
machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from genaug.local_service import free_port

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def _readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Does it help? `genaug gain`", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture
def digits_service(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env["GENAUG_POOL_PATH"] = str(tmp_path / "pool.db")
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(BIN / "genaug"), "serve", "--recipes",
                             str(ROOT / "recipes" / "digits.yaml"), "--pregenerate", "false",
                             "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "genaug serve did not get ready"
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _run_as_a_group(line: str, *, cwd: Path, env: dict[str, str]
                    ) -> subprocess.CompletedProcess[str]:
    """``bash -c line`` in a process group of its own, the whole group killed if the test ends
    first (its timeout): ``genaug gain``'s training children never outlive the test."""
    proc = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=2300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_readme_gain_example_runs_as_written(digits_service: str, tmp_path: Path) -> None:
    lines = _readme_lines()
    assert [line.split()[:3] for line in lines] == [["python", "-m", "genaug.digits"],
                                                    ["genaug", "gain", "/tmp/digits/test"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    env["GENAUG_URL"] = digits_service  # the README's service, on the test's port
    started = time.monotonic()
    for line in lines:
        done = _run_as_a_group(line.replace("/tmp/", f"{tmp_path}/"), cwd=tmp_path, env=env)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-4000:])
    minutes = (time.monotonic() - started) / 60
    report = json.loads((tmp_path / "gain" / "gain.json").read_text())
    arms = {(r["arm"], r["k"]) for r in report["summary"]}
    assert arms == {(a, k) for a in ("real", "pool", "variants") for k in (1, 5)}
    assert all(r["seeds"] == 5 for r in report["summary"])
    assert "pool: " in done.stdout and " at k=5 over 5 seeds: " in done.stdout
    print(f"the README's gain example: {minutes:.1f} minutes")  # the log shows it
