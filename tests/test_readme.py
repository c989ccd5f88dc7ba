"""Every code block of the README runs as written against a default ``genaug serve``.

The service is the real thing, started as a user would (``genaug serve --recipes
recipes/wound_phases.yaml``, the embedded default model, default settings) with only its port
and pool file chosen by the test. The blocks are taken from README.md as they are; the only
substitutions are these, so a block that stops working fails this test:

* the README's ``http://127.0.0.1:8000`` becomes the test service's URL, and ``/tmp/`` a
  folder of the test's own;
* the variants block gets what a user has: a ``client`` and ``real_images`` (uint8 images);
* the curl line gets what its user has: ``three.png`` (a real three, written by the README's
  ``python -m genaug.digits`` line) in the folder it runs in.

The trainer blocks (the reservoir, feeder and strategy block, then the need block that
continues it) run in one TensorFlow child process, as a user's script would: TensorFlow
never loads in the pytest process. The PyTorch block runs in a child process of its own, where
an import of TensorFlow fails. The bash lines run in ``bash`` with the checkout's
environment first on ``PATH`` (``genaug``, ``python``), except the ones in ``NOT_RUN``, each
with its reason; the ``genaug`` and training-script lines among those are still parsed by
their own argument parsers, so a flag the README names and they lack fails here. After all
of it, the service's log holds no warning.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.local_service import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
URL_IN_README = "http://127.0.0.1:8000"
BIN = Path(sys.executable).parent

# Bash lines (after joining continued lines) that do not run here, by how they start, and
# why. Everything else in a bash block runs.
NOT_RUN = {
    "make demo": "the demo: minutes of training; it has its own runs (make demo, and the slow "
                 "test of genaug demo --no-train)",
    "make test": "the suite this test belongs to",
    "pip install": "an install: this checkout's environment already holds the package "
                   "(tests/test_packaging.py checks what it ships)",
    "nice -n 10 python tools/train_tiny_generator.py": "minutes of training; "
        "tests/tools/test_train_tiny_generator.py runs the same script for a few steps",
    "genaug serve --model /tmp/tiny-digits/pipeline": "serves until stopped, and needs the "
        "training above; tests/tools/test_train_tiny_generator.py serves such a folder",
    "genaug serve --model tiny-random --unet-weights": "serves until stopped, and needs the "
        "training above; tests/tools/test_train_tiny_generator.py loads such weights over "
        "tiny-random",
    "genaug serve --model /models/sdxl": "serves until stopped, and needs SDXL weights and "
        "a CUDA device; this module's own service is the same command on the default model",
    "genaug adapt DATA": "needs SDXL weights and a CUDA device; tests/service/adapt/"
        "test_adapt.py runs genaug adapt on the tiny model",
    "GENAUG_LORAS=wounds=wounds.safetensors genaug serve": "serves until stopped, and needs "
        "the adapter above; tests/service/adapt/test_adapt.py runs the line genaug adapt "
        "prints until /readyz",
}


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def bash_lines() -> list[str]:
    """The README's bash commands, one per line once continued lines are joined (lines
    that are only a comment left out)."""
    lines: list[str] = []
    for block in code_blocks("bash"):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    return lines


def not_run_reason(line: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if line.startswith(start)), None)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def url(work: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env["GENAUG_POOL_PATH"] = str(work / "pool.db")
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "genaug.cli", "serve", "--recipes",
         str(ROOT / "recipes" / "wound_phases.yaml"), "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (work / "serve.log").read_text()
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


def substitute(code: str, url: str, work: Path) -> str:
    return code.replace(URL_IN_README, url).replace("/tmp/", f"{work}/")


def run(code: str, url: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    exec(compile(code.replace(URL_IN_README, url), "README.md", "exec"), namespace)
    return namespace


def test_every_block_is_run_or_listed() -> None:
    python = code_blocks("python")
    assert len(python) == 5, "a new python block: run it below"
    assert sum("from genaug.torch import" in b for b in python) == 1
    assert sum("from genaug.client import Client\n\nwith Client(" in b for b in python) == 1
    assert sum(b.startswith("out = client.variants(real_images") for b in python) == 1
    assert sum("from genaug.trainer import" in b for b in python) == 2
    # Fences with no language are listings (a folder layout), not code
    languages = set(re.findall(r"^```(\w+)$", README.read_text(), flags=re.M))
    assert languages == {"bash", "python"}, languages
    lines = bash_lines()
    ran = [line for line in lines if not_run_reason(line) is None]
    assert any(line.startswith("python -m genaug.digits") for line in ran), ran
    assert any(line.startswith("curl ") for line in ran), ran
    for start in NOT_RUN:  # every entry still names a line of the README
        assert any(line.startswith(start) for line in lines), start


def test_the_lines_not_run_parse_and_the_make_targets_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What can be checked of a line that does not run: genaug's and the training script's
    own parsers take its flags, and make has its target."""
    import importlib.util

    from genaug.cli import build_parser

    spec = importlib.util.spec_from_file_location("train_tiny_generator",
                                                  ROOT / "tools" / "train_tiny_generator.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "train_tiny_generator", script)  # for its dataclass
    spec.loader.exec_module(script)
    for line in bash_lines():
        if not_run_reason(line) is None:
            continue
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]  # VAR=value before the command
        if words[0] == "genaug":
            # exits 2 (SystemExit) on a flag genaug lacks
            build_parser(words[1]).parse_args(words[1:])
        elif words[:4] == ["nice", "-n", "10", "python"]:
            assert words[4] == "tools/train_tiny_generator.py", line
            script.parse(words[5:])  # exits 2 on a flag the script lacks
        elif words[0] == "make":
            assert re.search(rf"^{words[1]}:", (ROOT / "Makefile").read_text(), re.M), line


def test_the_bash_lines(url: str, work: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for line in bash_lines():
        if not_run_reason(line) is not None:
            continue
        if line.startswith("curl "):  # its user's own image of a three
            assert shutil.which("curl"), "the README's curl line needs curl: apt-get install curl"
            three = sorted((work / "digits" / "fewshot" / "3").glob("*.png"))[0]
            (work / "three.png").write_bytes(three.read_bytes())
        done = subprocess.run(["bash", "-c", substitute(line, url, work)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    assert len(list((work / "digits" / "generator").glob("*/*.png"))) == 997
    png = (work / "variants.png").read_bytes()  # curl writes an error body too: check it
    assert png.startswith(b"\x89PNG\r\n\x1a\n"), png[:200]


def test_the_client_block(url: str) -> None:
    block = next(b for b in code_blocks("python") if "from genaug.client import Client" in b)
    names = run(block, url)
    assert names["batch"].images.shape[0] == 8 and names["png"].startswith(b"\x89PNG")
    assert names["pool"].label_names == ["I", "P", "R"]
    assert names["fast"].metadata["resolved"]["speed"] == "turbo"


def test_the_variants_block(url: str) -> None:
    from genaug.client import Client

    block = next(b for b in code_blocks("python") if "client.variants(real_images" in b)
    with Client(url) as client:
        real_images = np.zeros((2, 64, 64, 3), np.uint8)  # stands for the user's own images
        names = run(block, url, client=client, real_images=real_images)
    assert len(names["out"].images) == 8 and list(names["out"].sources) == [0] * 4 + [1] * 4


CHILD = """
import json, sys
namespace = {}
for block in json.loads(sys.argv[1]):
    exec(compile(block, "README.md", "exec"), namespace)
feeder, reservoir = namespace["feeder"], namespace["reservoir"]
print(json.dumps({"received": feeder.stats.images_received,
                  "fill": [int(n) for n in reservoir.fill_counts()],
                  "mixed": float(reservoir.mixed_fraction())}))
"""


def test_the_trainer_blocks(url: str) -> None:
    """The trainer block, then the need block that continues it, in one TensorFlow process;
    then the service shows what they did: the feeder's images, the need, the fill."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed (pip install 'genaug[trainer]')")
    blocks = [b.replace(URL_IN_README, url) for b in code_blocks("python")
              if "from genaug.trainer import" in b]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "KERAS_BACKEND": "tensorflow", "TF_NUM_INTEROP_THREADS": "2",
           "TF_NUM_INTRAOP_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(blocks)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["received"] > 0 and sum(out["fill"]) > 0 and out["mixed"] > 0, out
    detail = httpx.get(url + "/v1/recipes/wound-phases").json()
    assert set(detail["need"]) == {"I", "P", "R"} and detail["need"]["P"] > 0, detail["need"]
    assert any(v["asked"] > 0 for v in detail["per_label"].values()), detail["per_label"]


TORCH_CHILD = """
import json, sys
sys.modules["tensorflow"] = None  # the PyTorch path: an import of TensorFlow fails
sys.modules["keras"] = None
namespace = {}
exec(compile(sys.argv[1], "README.md", "exec"), namespace)
print(json.dumps({k: float(v) for k, v in namespace["train"].stats().items()}))
"""


def test_the_torch_block(url: str) -> None:
    """The PyTorch block in a process of its own: both workers drew pool images under the
    block's one trainer name, its need reached the service as that one trainer's, and
    diagnose found the loader clean."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install 'genaug[torch]')")
    block = next(b for b in code_blocks("python") if "from genaug.torch import" in b)
    # The service has had a while to pre-generate, as a trainer finds it: every label holds
    # images (else diagnose rightly says the mix is starved of the empty ones).
    deadline = time.monotonic() + 120
    def least() -> int:
        fill = httpx.get(url + "/v1/recipes/wound-phases").json()["fill"]
        return min(fill.get(label, 0) for label in "IPR")

    while least() < 8:
        assert time.monotonic() < deadline, "the wound-phases pool did not fill"
        time.sleep(0.2)
    done = subprocess.run([sys.executable, "-c", TORCH_CHILD, block.replace(URL_IN_README, url)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    stats = json.loads(lines[-1])
    assert stats["synthetic"] > 0 and stats["real"] > 0 and stats["received"] > 0, stats
    assert stats["failures"] == 0, stats
    assert [line.split()[:2] for line in lines[-6:-1]] == [
        ["ok", check] for check in ("fork", "service", "starved", "reuse", "waits")], lines
    clients = {c["client"] for c in httpx.get(url + "/v1/clients").json()["clients"]}
    assert {"my-run/r0/w0", "my-run/r0/w1"} <= clients, clients
    detail = httpx.get(url + "/v1/recipes/wound-phases").json()
    assert detail["need_clients"] >= 1 and set(detail["need"]) == {"I", "P", "R"}, detail


def test_the_default_service_logged_no_warning(url: str, work: Path) -> None:
    """After every block above ran against it (generation, variants, samples, a feeder, a
    fill by need), the default service's log holds no warning: third-party lines that say
    nothing to a user are dropped at start-up, a recipe's long prompt would be said once."""
    httpx.get(url + "/readyz")  # the service is still up: its log is what it wrote so far
    log = (work / "serve.log").read_text()
    assert "ready: tiny-digits model" in log, log[-3000:]
    noisy = [line for line in log.splitlines()
             if "WARNING" in line or "Warning" in line or "requires torchvision" in line]
    assert noisy == [], noisy[:5]
