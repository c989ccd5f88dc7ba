"""Every code block of the README, and of the pages that carry its walkthroughs, runs as
written against a default ``genaug serve``.

The README is what a newcomer reads in a minute: its first screen says what genaug is, gives
the two commands and a trainer sampling from the pool; the walkthroughs it links to live in
``docs/trainer.md`` (TensorFlow and PyTorch trainers), ``docs/embedded-model.md`` (the
embedded model and its data) and ``docs/adapt.md``. Their code blocks are run here as the
README's are (``PAGES``).

The service is the real thing, started as a user would (``genaug serve --recipes
recipes/wound_phases.yaml``, the embedded default model, default settings) with only its port
and pool file chosen by the test. The blocks are taken from the pages as they are; the only
substitutions are these, so a block that stops working fails this test:

* the pages' ``http://127.0.0.1:8000`` becomes the test service's URL, and ``/tmp/`` a
  folder of the test's own;
* the README's first trainer block gets what its user has: ``real_ds`` (a ``tf.data``
  dataset of float images in [0, 1] and their labels) and ``model`` (a compiled Keras
  classifier);
* the variants block gets what a user has: a ``client`` and ``real_images`` (uint8 images);
* the curl line gets what its user has: ``three.png`` (a real three, written by
  ``docs/embedded-model.md``'s ``python -m genaug.digits`` line) in the folder it runs in.

The TensorFlow blocks run in one TensorFlow child process, as a user's script would: first
the README's trainer block, then ``docs/trainer.md``'s trainer block and the need block that
continues it, in a namespace of their own; TensorFlow never loads in the pytest process. The
PyTorch block runs in a child process of its own, where an import of TensorFlow fails. The
bash lines run in ``bash`` with the checkout's environment first on ``PATH`` (``genaug``,
``python``), except the ones in ``NOT_RUN``, each with its reason; the ``genaug`` and
training-script lines among those are still parsed by their own argument parsers, so a flag
a page names and they lack fails here. After all of it, the service's log holds no warning.
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
TRAINER_PAGE = ROOT / "docs" / "trainer.md"
# The README and the pages that carry its walkthroughs: every code block of these runs here.
PAGES = (README, TRAINER_PAGE, ROOT / "docs" / "embedded-model.md", ROOT / "docs" / "adapt.md")
URL_IN_README = "http://127.0.0.1:8000"
# What a newcomer sees without scrolling: what genaug is, the two commands, a trainer.
FIRST_SCREEN_LINES = 40
README_MOST_LINES = 250
BIN = Path(sys.executable).parent

# Bash lines (after joining continued lines) that do not run here, by how they start, and
# why. Everything else in a bash block runs.
NOT_RUN = {
    "genaug gain /tmp/digits/test": "about 10 minutes of generation and training, against a "
        "service of the digits recipe; tests/genaug/test_gain_readme.py runs the line as "
        "written (slow)",
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


def code_blocks(language: str, *pages: Path) -> list[str]:
    """The ``language`` blocks of ``pages`` (default: all of ``PAGES``), in page order."""
    return [block for page in pages or PAGES
            for block in re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)]


def bash_lines() -> list[str]:
    """The pages' bash commands, one per line once continued lines are joined (lines that
    are only a comment left out)."""
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


def first_trainer_block() -> str:
    """The README's own trainer block: the one of its first screen."""
    return next(b for b in code_blocks("python", README) if "from genaug.trainer import" in b)


def test_every_block_is_run_or_listed() -> None:
    readme = code_blocks("python", README)
    assert len(readme) == 3, "a new python block in the README: run it below"
    assert sum("from genaug.trainer import" in b for b in readme) == 1
    assert sum("from genaug.client import Client\n\nwith Client(" in b for b in readme) == 1
    assert sum(b.startswith("out = client.variants(real_images") for b in readme) == 1
    trainer = code_blocks("python", TRAINER_PAGE)
    assert len(trainer) == 4, "a new python block in docs/trainer.md: run it below"
    # The match= block runs in tests/trainer/feeding/_match_child.py, on real 28x28 shots.
    assert sum("match=shots" in b for b in trainer) == 1
    assert sum("from genaug.trainer import" in b for b in trainer) == 2
    assert sum("from genaug.torch import" in b for b in trainer) == 1
    assert code_blocks("python", *PAGES[2:]) == [], "a python block in a page: run it below"
    # Fences with no language are listings (a folder layout, a command's output), not code
    for page in PAGES:
        languages = set(re.findall(r"^```(\w+)$", page.read_text(), flags=re.M))
        assert languages <= {"bash", "python"}, (page.name, languages)
    assert set(re.findall(r"^```(\w+)$", README.read_text(), flags=re.M)) == {"bash", "python"}
    lines = bash_lines()
    ran = [line for line in lines if not_run_reason(line) is None]
    assert any(line.startswith("python -m genaug.digits") for line in ran), ran
    assert any(line.startswith("curl ") for line in ran), ran
    for start in NOT_RUN:  # every entry still names a line of a page
        assert any(line.startswith(start) for line in lines), start


def test_the_readme_is_read_in_a_minute() -> None:
    """The first screen holds what genaug is, the two commands and the whole first trainer
    block; the README stays short (a section the lead writes, `genaug gain`, counts for at
    most 15 lines), the rest lives in docs/ behind links."""
    text = README.read_text()
    lines = text.splitlines()
    first = "\n".join(lines[:FIRST_SCREEN_LINES])
    assert "make demo" in first and "make test" in first, "the two commands left the first screen"
    assert first_trainer_block() in first, "the trainer block left the first screen"
    statements = [line for line in first_trainer_block().splitlines()
                  if line.strip() and not line.startswith(("from ", "import ", "#", " "))]
    assert len(statements) <= 5, statements
    gain = text.split("\n## Does it help? `genaug gain`\n", 1)
    assert len(gain) == 2, "the README lost its section '## Does it help? `genaug gain`'"
    assert first_trainer_block() in gain[0], "the gain section comes after the trainer block"
    gain_lines = len(gain[1].split("\n## ", 1)[0].splitlines())
    assert len(lines) - max(0, gain_lines - 15) <= README_MOST_LINES, len(lines)


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
    # The curl line's three comes from the digits line, which runs first wherever it is
    lines = sorted(bash_lines(), key=lambda line: not line.startswith("python -m genaug.digits"))
    for line in lines:
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
    block = next(b for b in code_blocks("python", README)
                 if "from genaug.client import Client\n\nwith Client(" in b)
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
pages, first, stand_ins = json.loads(sys.argv[1])

def stats(namespace):
    feeder, reservoir = namespace["feeder"], namespace["reservoir"]
    return {"received": feeder.stats.images_received,
            "fill": [int(n) for n in reservoir.fill_counts()],
            "mixed": float(reservoir.mixed_fraction())}

# docs/trainer.md first: its configure_devices() must come before TensorFlow initialises
namespace = {}
for block in pages:
    exec(compile(block, "docs/trainer.md", "exec"), namespace)
out = {"trainer_page": stats(namespace)}
namespace = {}
exec(compile(stand_ins, "stand-ins", "exec"), namespace)
exec(compile(first, "README.md", "exec"), namespace)
out["first_screen"] = stats(namespace)
print(json.dumps(out))
"""

# What the README's first trainer block takes as given: the user's data and compiled model.
STAND_INS = """
import tensorflow as tf
x, y = tf.random.uniform([128, 64, 64, 3], seed=0), tf.range(128) % 3
real_ds = tf.data.Dataset.from_tensor_slices((x, y))
model = tf.keras.Sequential([tf.keras.Input((64, 64, 3)),
                             tf.keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
                             tf.keras.layers.GlobalAveragePooling2D(),
                             tf.keras.layers.Dense(3, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
"""


def least_fill(url: str) -> int:
    fill = httpx.get(url + "/v1/recipes/wound-phases").json()["fill"]
    return min(fill.get(label, 0) for label in "IPR")


def wait_for_the_pool(url: str) -> None:
    """The service has had a while to pre-generate, as a trainer finds it: every label holds
    images (else a feeder or diagnose rightly says the mix is starved of the empty ones)."""
    deadline = time.monotonic() + 120
    while least_fill(url) < 8:
        assert time.monotonic() < deadline, "the wound-phases pool did not fill"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def tensorflow_blocks(url: str) -> dict[str, Any]:
    """docs/trainer.md's trainer block and the need block that continues it, then the
    README's first trainer block on stand-ins for the user's data and model, in one
    TensorFlow process; what each feeder and reservoir counted."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed (pip install 'genaug[trainer]')")
    wait_for_the_pool(url)
    pages = [b.replace(URL_IN_README, url) for b in code_blocks("python", TRAINER_PAGE)
             if "from genaug.trainer import" in b]
    first = first_trainer_block().replace(URL_IN_README, url)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
           "KERAS_BACKEND": "tensorflow", "TF_NUM_INTEROP_THREADS": "2",
           "TF_NUM_INTRAOP_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([pages, first, STAND_INS])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_the_trainer_page_blocks(url: str, tensorflow_blocks: dict[str, Any]) -> None:
    """docs/trainer.md's trainer and need blocks: the feeder's images reached the batches,
    and the service shows the need and the fill they asked for."""
    out = tensorflow_blocks["trainer_page"]
    assert out["received"] > 0 and sum(out["fill"]) > 0 and out["mixed"] > 0, out
    detail = httpx.get(url + "/v1/recipes/wound-phases").json()
    assert set(detail["need"]) == {"I", "P", "R"} and detail["need"]["P"] > 0, detail["need"]
    assert any(v["asked"] > 0 for v in detail["per_label"].values()), detail["per_label"]


def test_the_first_screen_trainer_block(tensorflow_blocks: dict[str, Any]) -> None:
    """The README's five lines: pool images reached the reservoir and replaced real ones in
    the batches fit trained on."""
    out = tensorflow_blocks["first_screen"]
    assert out["received"] > 0 and min(out["fill"]) > 0 and out["mixed"] > 0, out


TORCH_CHILD = """
import json, sys
sys.modules["tensorflow"] = None  # the PyTorch path: an import of TensorFlow fails
sys.modules["keras"] = None
namespace = {}
exec(compile(sys.argv[1], "docs/trainer.md", "exec"), namespace)
print(json.dumps({k: float(v) for k, v in namespace["train"].stats().items()}))
"""


def test_the_torch_block(url: str) -> None:
    """The PyTorch block in a process of its own: both workers drew pool images under the
    block's one trainer name, its need reached the service as that one trainer's, and
    diagnose found the loader clean."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install 'genaug[torch]')")
    block = next(b for b in code_blocks("python", TRAINER_PAGE) if "from genaug.torch import" in b)
    wait_for_the_pool(url)
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
