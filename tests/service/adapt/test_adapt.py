"""``genaug adapt``: a labelled folder in, a LoRA the service loads out, made for one base.

The data are a few drawn shapes (circles, squares, triangles) at 40x40, resized to the shared
``shapes_recipe``'s 32x32; the base is ``tiny-random``; a handful of steps is enough to move
the adapter off its start.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from genaug.cli import main
from genaug.service.batching.items import GroupKey, Item
from genaug.service.pipeline.adapters import AdapterLoadError, Adapters
from genaug.service.pipeline.load import load_model
from genaug.service.pipeline.lora_record import read_record
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings

STEPS = 4
KEY = GroupKey(height=32, width=32, steps=3)


def write_data(
    root: Path, labels: tuple[str, ...] = ("circle", "square", "triangle")
) -> Path:
    yy, xx = np.mgrid[:40, :40]
    for label in labels:
        folder = root / label
        folder.mkdir(parents=True)
        for i in range(3):
            r = 8 + 3 * i
            if label == "circle":
                inside = (yy - 20) ** 2 + (xx - 20) ** 2 < r * r
            elif label == "square":
                inside = (abs(yy - 20) < r) & (abs(xx - 20) < r)
            else:  # a triangle standing on its base
                inside = (abs(yy - 20) < r) & (2 * abs(xx - 20) < yy - 20 + r)
            pixels = np.zeros((40, 40, 3), np.uint8)
            pixels[inside] = (255, 60 * i, 0)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def adapt_args(data: Path, recipes: Path, out: Path, *extra: str) -> list[str]:
    return ["adapt", str(data), "--recipes", str(recipes), "--recipe", "shapes", "--out",
            str(out), "--model", "tiny-random", "--steps", str(STEPS), "--batch-size", "2",
            "--lr", "1e-2", "--no-progress", "--no-check", *extra]  # the check: test_adapt_check


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    """One intra-op thread, as the session's tiny model: on a busy machine two spin-wait."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, shapes_recipe: str) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapt")
    recipes = root / "recipes.yaml"
    recipes.write_text(shapes_recipe)
    return {"data": write_data(root / "data"), "recipes": recipes, "root": root}


@pytest.fixture(scope="module")
def lora(files: dict[str, Path]) -> Path:
    out = files["root"] / "shapes.safetensors"
    assert main(adapt_args(files["data"], files["recipes"], out)) == 0
    return out


def item(seed: int) -> Item:
    return Item("a circle", seed=seed, guidance=3.0, output_height=32, output_width=32)


def test_adapt_records_base_data_steps_rank_and_losses(lora: Path) -> None:
    record = read_record(lora)
    base = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    assert record["base_hash"] == base.weights_hash
    assert record["base_model"] == "tiny-random"
    assert len(record["data_hash"]) == 16
    assert (record["steps"], record["rank"], record["images"]) == (STEPS, 32, 9)  # default rank
    assert record["interrupted"] is False and record["prediction_type"] == "epsilon"
    assert len(record["losses"]) == STEPS and all(np.isfinite(record["losses"]))


def test_the_lora_loads_through_the_service_path_and_changes_images_reproducibly(
    lora: Path,
) -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    worker = PipelineWorker.from_settings(model, Settings(loras=f"shapes={lora}"))
    assert worker.pipe.get_list_adapters() == {"unet": ["shapes"]}
    adapted = GroupKey(height=32, width=32, steps=3, adapter="shapes")
    first = worker.run(adapted, [item(1)]).images[0]
    base = worker.run(KEY, [item(1)]).images[0]
    again = worker.run(adapted, [item(1)]).images[0]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, base)


def test_the_same_seed_adapts_to_the_same_weights(files: dict[str, Path], lora: Path) -> None:
    from safetensors.torch import load_file

    twin = files["root"] / "twin.safetensors"
    assert main(adapt_args(files["data"], files["recipes"], twin)) == 0
    a, b = load_file(str(lora)), load_file(str(twin))
    assert a.keys() == b.keys() and all(k.startswith("unet.") for k in a)
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_a_lora_for_another_base_is_refused_in_one_line(
    lora: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    with pytest.raises(AdapterLoadError) as info:
        Adapters(model.pipeline, {"shapes": lora}, base_hash="0123456789abcdef",
                 base_name="tiny-digits")
    message = str(info.value)
    assert "\n" not in message
    # both bases by name and by hash, and the fix
    assert f"adapted on base model tiny-random (weights {model.weights_hash})" in message
    assert "served model tiny-digits (weights 0123456789abcdef)" in message, message
    assert "serve it with --model tiny-random" in message, message
    assert not any(model.pipeline.get_list_adapters().values())  # refused before loading
    Adapters(model.pipeline, {"shapes": lora}, base_hash=model.weights_hash)  # its own: fine

    assert main(["adapt", "--check", str(lora), "--model", "tiny-digits"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was adapted on base" in err[0] and "tiny-digits" in err[0]
    assert main(["adapt", "--check", str(lora), "--model", "tiny-random"]) == 0


def test_ctrl_c_saves_a_usable_lora(tmp_path: Path) -> None:
    from genaug.service.adapt.train import AdaptConfig, AdaptData, adapt

    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    forward, calls = model.pipeline.unet.forward, []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    model.pipeline.unet.forward = interrupted
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    out = tmp_path / "cut.safetensors"
    record = adapt(model, AdaptData(images, [["a"], ["b"]], "0" * 16), out,
                   AdaptConfig(steps=10, batch_size=1, progress=False))
    assert record["interrupted"] is True and record["steps"] == 2
    assert read_record(out)["steps"] == 2
    fresh = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    Adapters(fresh.pipeline, {"cut": out}, base_hash=fresh.weights_hash)
    assert fresh.pipeline.get_list_adapters() == {"unet": ["cut"]}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("missing-label", "no images for label 'square'"),
        ("unknown-recipe", "has no recipe 'nope'; it has: shapes"),
        ("bad-out", "must end in .safetensors"),
        ("zero-steps", "--steps 0 must be >= 1"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str], change: str,
    expected: str,
) -> None:
    data = files["data"]
    if change == "missing-label":
        data = write_data(tmp_path / "data", labels=("circle",))
    args = adapt_args(data, files["recipes"], tmp_path / "x.safetensors")
    if change == "unknown-recipe":
        args[args.index("shapes")] = "nope"
    elif change == "bad-out":
        args[args.index("--out") + 1] = str(tmp_path / "x.pt")
    elif change == "zero-steps":
        args[args.index("--steps") + 1] = "0"
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("genaug adapt: ") and expected in err[0], err
    assert not (tmp_path / "x.safetensors").exists()


# -- on a CUDA device (skipped without one) --------------------------------------------------


@pytest.mark.gpu
def test_a_few_steps_on_the_sdxl_size_random_model(tmp_path: Path) -> None:
    """SDXL base 1.0's architecture (bench/gpu/sdxl configs, random weights) in bfloat16 at 1024²:
    gradient checkpointing, float32 adapters, the file loads back into the same pipeline."""
    import time

    import torch

    from genaug.service.adapt.train import AdaptConfig, AdaptData, adapt

    bench: Any = importlib.import_module("bench.gpu._sdxl_model")  # from the repository root
    device = torch.device("cuda:0")
    model = bench.build_sdxl(device, torch.bfloat16)
    images = np.random.default_rng(0).integers(0, 256, (2, 1024, 1024, 3), dtype=np.uint8)
    data = AdaptData(images, [["a photo of a wound"], ["a photo of a scar"]], "0" * 16)
    torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    record = adapt(model, data, tmp_path / "sdxl.safetensors",
                   AdaptConfig(steps=3, rank=8, lr=1e-4, batch_size=1, accumulation=2,
                               progress=False))
    seconds = time.monotonic() - started
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    sys.stderr.write(f"sdxl adapt: 3 steps x 2 micro-batches at 1024^2 in {seconds:.1f} s, "
                     f"peak {peak:.1f} GiB\n")
    assert record["steps"] == 3 and all(np.isfinite(record["losses"]))
    assert record["dtype"] == "bfloat16"
    fresh = bench.build_sdxl(device, torch.bfloat16)
    Adapters(fresh.pipeline, {"sdxl": tmp_path / "sdxl.safetensors"},
             base_hash=fresh.weights_hash)
    assert fresh.pipeline.get_list_adapters()["unet"] == ["sdxl"]


def test_the_printed_serve_line_works_and_another_base_is_refused_in_one_line(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import time

    import httpx

    from genaug.local_service import free_port

    out = tmp_path / "mine.safetensors"  # one step: the printed line is what is tested
    assert main([*adapt_args(files["data"], files["recipes"], out), "--steps", "1"]) == 0
    printed = capsys.readouterr().out
    line = next(x.strip() for x in printed.splitlines() if "genaug serve" in x)
    assert "--model tiny-random" in line and f"--recipes {files['recipes']}" in line, printed
    assert "adapter: {name: mine}" in printed, printed
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "GENAUG_POOL_PATH": str(tmp_path / "pool.db"), "GENAUG_PREGENERATE": "false",
           "GENAUG_TORCH_THREADS": "1"}
    # as printed (the shell line: the LoRA variable, then genaug serve), on a free port; and
    # the same line on another base, started at the same time (each start-up takes most of a
    # core for seconds: on two cores they overlap)
    port = free_port()
    server = subprocess.Popen(["bash", "-c", f"{line} --port {port}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wrong = line.replace("--model tiny-random", "--model tiny-digits")
    refused = subprocess.Popen(["bash", "-c", f"{wrong} --port {free_port()}"],
                               env={**env, "GENAUG_POOL_PATH": str(tmp_path / "other.db")},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "the printed serve line never became ready"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        info = httpx.get(f"http://127.0.0.1:{port}/v1/info", timeout=5).json()
        assert [a["name"] for a in info["adapters"]] == ["mine"], info["adapters"]
    finally:
        server.terminate()
        server.communicate(timeout=60)
        _, stderr = refused.communicate(timeout=120)
    # the same line on another base: refused at start-up in one line, no traceback
    assert refused.returncode != 0
    assert "Traceback" not in stderr, stderr
    said = [x for x in stderr.splitlines() if "adapted on base model" in x]
    assert len(said) == 1, stderr
    assert "tiny-random (weights" in said[0] and "served model tiny-digits (weights" in said[0]
    assert "serve it with --model tiny-random" in said[0], said[0]
