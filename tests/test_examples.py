"""The examples run against a live tiny service, so they cannot rot; and the errors a
notebook user meets say what to do.

The walkthrough runs in this process (it only needs the client). The trainer example runs
in a subprocess under a hard timeout: TensorFlow never loads in the pytest process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import AuthenticationError, Client, TransportError
from genaug.local_service import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RECIPES = ROOT / "recipes" / "wound_phases.yaml"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"genaug_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_pool(url: str, per_label: int, timeout: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        fill = httpx.get(url + "/v1/recipes").json()["recipes"][0]["fill"]
        if all(v >= per_label for v in fill.values()):
            return dict(fill)
        assert time.monotonic() < deadline, f"pool did not fill: {fill}"
        time.sleep(0.2)


def test_notebook_walkthrough_runs(
    make_service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=2, max_batch_images=8)
    walkthrough = load_example("notebook_walkthrough")
    out = walkthrough.main(live.url, tmp_path / "out")

    info = httpx.get(live.url + "/v1/info").json()
    assert out["info"]["model"]["hash"] == info["model"]["hash"]
    assert out["grid"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert out["images"].shape == (4, 64, 64, 3) and out["images"].dtype == np.uint8
    sample = out["sample"]
    assert sample is not None and len(sample) > 0 and sample.label_names == ["I", "P", "R"]
    assert len(out["saved"]) == len(sample)
    for path in out["saved"]:
        assert path.is_file() and path.parent.name in {"I", "P", "R"}
    clients = {c["client"]: c for c in httpx.get(live.url + "/v1/clients").json()["clients"]}
    assert clients["notebook-walkthrough"]["requests"] == 2
    assert 0 < clients["notebook-walkthrough"]["share_last_minute"] <= 1
    assert abs(sum(c["share_last_minute"] for c in clients.values()) - 1) < 1e-3
    printed = capsys.readouterr().out
    assert info["model"]["hash"] in printed and "wound-phases" in printed


def _cells(notebook: Any) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_notebook_ipynb_is_in_sync_with_the_percent_script(tmp_path: Path) -> None:
    import jupytext

    script = jupytext.read(EXAMPLES / "notebook_walkthrough.py")
    notebook = jupytext.read(EXAMPLES / "notebook_walkthrough.ipynb")
    fix = "edit the .py and run: jupytext --sync examples/notebook_walkthrough.py"
    assert _cells(script) == _cells(notebook), fix
    assert all(not cell.get("outputs") for cell in notebook.cells), "store it without outputs"
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    # the check notices a drift: one changed line in the script
    drifted = tmp_path / "drifted.py"
    text = (EXAMPLES / "notebook_walkthrough.py").read_text()
    drifted.write_text(text.replace("n: int = 6", "n: int = 7"))
    assert _cells(jupytext.read(drifted)) != _cells(notebook)


def test_notebook_runs_in_a_jupyter_kernel(
    make_service: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .ipynb, executed cell by cell by nbclient in a real ipykernel against a live
    service: the grid is displayed inline, images are saved next to the notebook."""
    import nbclient
    import nbformat

    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=2, max_batch_images=8)
    monkeypatch.setenv("GENAUG_URL", live.url)  # the kernel inherits this environment
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    notebook = nbformat.read(EXAMPLES / "notebook_walkthrough.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    outputs = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.output_type == "error"]
    text = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    info = httpx.get(live.url + "/v1/info").json()
    assert info["model"]["hash"] in text and "wound-phases" in text
    images = [out for out in outputs if out.output_type == "display_data"
              and "image/png" in out.get("data", {})]
    assert len(images) == 1  # the grid, shown inline (not only saved)
    assert (tmp_path / "genaug-walkthrough" / "grid.png").is_file()
    saved = list((tmp_path / "genaug-walkthrough" / "wound-phases").glob("*/*.png"))
    assert saved and {p.parent.name for p in saved} <= {"I", "P", "R"}


def test_notebook_walkthrough_without_recipes(service: Any, tmp_path: Path) -> None:
    out = load_example("notebook_walkthrough").main(service.url, tmp_path)
    assert out["sample"] is None and out["saved"] == [] and (tmp_path / "grid.png").is_file()


def tf_env() -> dict[str, str]:
    if importlib.util.find_spec("tensorflow") is None:  # find_spec does not import it
        pytest.skip("tensorflow is not installed (pip install 'genaug[trainer]')")
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": "tensorflow",
        "TF_NUM_INTEROP_THREADS": "2",
        "TF_NUM_INTRAOP_THREADS": "2",
    }
    env.pop("GENAUG_URL", None)
    return env


def run_example(name: str, args: list[str], cwd: Path, timeout: float = 240) -> str:
    """Run ``examples/NAME.py ARGS`` in a TensorFlow subprocess; return its stdout."""
    cmd = [sys.executable, str(EXAMPLES / f"{name}.py"), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=tf_env(), cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} did not finish within {timeout:.0f} s\n{exc.stderr!r}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_trainer_example_trains_with_the_service(make_service: Any, tmp_path: Path) -> None:
    tf_env()
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    wait_pool(live.url, 8)
    stdout = run_example("trainer_example", [live.url, "--epochs", "3", "--steps", "3"],
                         tmp_path)
    match = re.search(r"feeder: (\d+) images in (\d+) requests, reservoir fill (\[[^\]]*\])",
                      stdout)
    assert match, stdout[-3000:]
    assert int(match.group(1)) > 0, stdout[-3000:]
    assert "tensorflow" not in sys.modules


def test_torch_trainer_example_trains_with_the_service(make_service: Any, tmp_path: Path) -> None:
    """examples/torch_trainer.py in a process where TensorFlow cannot load: a MixedDataset in
    a DataLoader of 2 workers, each drawing its own stream under the example's one trainer
    name, prefilled before its first batch (so synthetic examples are handed out)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install 'genaug[torch]')")
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    wait_pool(live.url, 8)
    script = EXAMPLES / "torch_trainer.py"
    code = ("import runpy, sys\n"
            "sys.modules['tensorflow'] = None; sys.modules['keras'] = None  # an import fails\n"
            f"sys.argv = [{str(script)!r}, {live.url!r}, '--epochs', '3']\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if k != "GENAUG_URL"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = re.search(r"genaug.torch: (\d+) synthetic and (\d+) real examples \((\d+)% "
                      r"synthetic\), (\d+) pool images received by 2 worker", proc.stdout)
    assert match, proc.stdout[-3000:]
    synthetic, real, _, received = (int(g) for g in match.groups())
    assert synthetic > 0 and real > 0 and received > 0, match.group(0)
    assert "epoch 3: loss" in proc.stdout and "ok   fork" in proc.stdout, proc.stdout[-3000:]
    clients = {c["client"] for c in httpx.get(live.url + "/v1/clients").json()["clients"]}
    assert {"torch-example/r0/w0", "torch-example/r0/w1"} <= clients, clients


def run_misconfigured(name: str, args: list[str], cwd: Path, timeout: float = 240) -> str:
    """Run ``examples/NAME.py ARGS``, which must fail; return the one line it ended with."""
    cmd = [sys.executable, str(EXAMPLES / f"{name}.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=tf_env(),
                          cwd=cwd)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, output
    assert "Traceback" not in proc.stdout + proc.stderr, output
    ours = [line for line in proc.stderr.splitlines() if line.startswith(f"{name}: ")]
    assert len(ours) == 1 and proc.stderr.rstrip().endswith(ours[0]), output  # its last line
    return ours[0]


def test_trainer_example_without_its_recipe_ends_in_one_line(
    service: Any, tmp_path: Path
) -> None:
    """A service started without recipes/wound_phases.yaml: the example names the recipe it
    asked for and what the service has (before: a 5-frame traceback)."""
    line = run_misconfigured("trainer_example", [service.url], tmp_path)
    assert "'wound-phases'" in line and "GENAUG_RECIPES" in line, line


def test_torch_trainer_example_without_its_recipe_ends_in_one_line(
    service: Any, tmp_path: Path
) -> None:
    """The PyTorch example against a service without recipes/wound_phases.yaml: one line
    naming the recipe and what the service has, as the TensorFlow examples end."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install 'genaug[torch]')")
    line = run_misconfigured("torch_trainer", [service.url], tmp_path)
    assert "'wound-phases'" in line and "GENAUG_RECIPES" in line, line


@pytest.mark.slow  # the client retries a refused connection for its retry_deadline (30 s)
def test_trainer_example_without_a_service_ends_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = run_misconfigured("trainer_example", [url], tmp_path, timeout=300)
    assert url in line and "genaug serve" in line, line


# -- what a notebook user is told --------------------------------------------------------------


def test_closed_port_says_how_to_start_the_service() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, retry_deadline=0.3) as client, pytest.raises(TransportError) as caught:
        client.info()
    message = str(caught.value)
    assert url in message and "genaug serve" in message and "GENAUG_URL" in message

    with Client(url) as client, pytest.raises(TransportError) as caught:
        client.wait_ready(timeout=0.5)
    assert "genaug serve" in str(caught.value)

    walkthrough = load_example("notebook_walkthrough")
    with pytest.raises(TransportError, match="genaug serve"):
        walkthrough.connect(url, timeout=0.5)


def test_missing_or_wrong_key_names_the_setting(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    live = make_service(api_keys=["notebook-key"])
    with Client(live.url) as client, pytest.raises(AuthenticationError) as caught:
        client.info()
    message = str(caught.value)
    assert caught.value.status == 401
    assert "GENAUG_API_KEY" in message and "api_key=" in message

    with Client(live.url, api_key="wrong") as client, pytest.raises(AuthenticationError) as caught:
        client.info()
    assert "GENAUG_API_KEY" in str(caught.value) and "api_key=" in str(caught.value)

    with Client(live.url, api_key="notebook-key") as client:
        assert client.info()["auth"] is True


def test_multimodal_example_rebalances_the_rare_class(make_service: Any, tmp_path: Path) -> None:
    """Four inputs, key="depth_rgb", inverse-frequency rebalance, 2 CPU replicas."""
    tf_env()
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    wait_pool(live.url, 8)
    stdout = run_example("multimodal_trainer",
                         [live.url, "--epochs", "2", "--cpu-replicas", "2"], tmp_path)
    match = re.search(r"feeder: (\d+) images; replaced depth_rgb by new class "
                      r"\{'I': (\d+), 'P': (\d+), 'R': (\d+)\}; mixed", stdout)
    assert match, stdout[-3000:]
    received, i, p, r = (int(g) for g in match.groups())
    assert received > 0
    # weights 1 : 1.25 : 5 -> R gets most replacements (expected share 0.69)
    assert r > i + p, (i, p, r)
    assert "on 2 replica(s)" in stdout


# two TensorFlow workers: tests/trainer/mixing/test_multiworker.py keeps the cluster
@pytest.mark.slow
def test_multiworker_example_two_workers_on_localhost(make_service: Any, tmp_path: Path) -> None:
    """MultiWorkerMirroredStrategy, custom training loop, a feeder per worker."""
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))
    from _cluster import results_of, run_cluster

    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    wait_pool(live.url, 8)
    try:
        done = run_cluster(EXAMPLES / "multiworker_trainer.py", [live.url, "--steps", "4"],
                           tf_env(), workers=2, timeout=240, cwd=tmp_path)
    except TimeoutError as exc:
        pytest.fail(str(exc))
    workers = sorted(results_of(done, "GENAUG_RESULT "), key=lambda w: w["task"])
    assert [w["task"] for w in workers] == [0, 1]
    for w in workers:
        assert w["replicas"] == 2 and len(w["losses"]) == 4
        assert w["images_received"] > 0 and w["mixed_fraction"] > 0
    # one all-reduced loss per step: both workers computed the same numbers
    assert workers[0]["losses"] == workers[1]["losses"]


def test_a_converted_unet_is_served_and_fills_the_pool(tiny_model: Any, tmp_path: Path) -> None:
    """The user's path end to end: a PyTorch checkpoint in a training wrapper, converted by
    ``genaug convert-unet``, served with ``GENAUG_UNET_WEIGHTS``, its pool sampled (training
    against a served pool is the multimodal example's test above)."""
    import torch

    unet = tiny_model.pipeline.unet  # the session's tiny-random model
    checkpoint = tmp_path / "checkpoint_best.pt"
    # As a DDP training script saves it: prefixed keys inside a wrapper with non-tensor state.
    torch.save({"epoch": 7, "model_state_dict": {f"module.{k}": v for k, v in
                                                 unet.state_dict().items()},
                "config": {"lr": 1e-4}}, checkpoint)
    converted = tmp_path / "unet.safetensors"
    # The CLI in this process (torch is loaded already); its subprocess form is tested in
    # tests/service/commands/test_convert.py.
    from genaug.cli import main

    assert main(["convert-unet", str(checkpoint), str(converted), "--base", "tiny-random",
                 "--trust-this-file"]) == 0
    assert converted.is_file()
    from genaug.local_service import free_port

    port = free_port()
    env = {**os.environ, "GENAUG_MODEL": "tiny-random", "GENAUG_UNET_WEIGHTS": str(converted),
           "GENAUG_RECIPES": str(RECIPES), "GENAUG_POOL_PATH": str(tmp_path / "pool.db"),
           "GENAUG_POOL_CAPACITY_PER_LABEL": "8", "GENAUG_PORT": str(port)}
    server = subprocess.Popen([sys.executable, "-m", "genaug.cli", "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with Client(url) as client:
            client.wait_ready(timeout=120)
            model = client.info()["model"]
            assert model["kind"] == "tiny-random"
            # the weights hash covers the converted file: not the plain tiny-random's
            assert model["hash"] != tiny_model.weights_hash
            wait_pool(url, 8, timeout=180)
            pool = client.sample("wound-phases", n=24)
            assert pool.images.shape == (24, 64, 64, 3) and pool.images.std() > 0
    finally:
        server.terminate()
        server.wait(timeout=30)
