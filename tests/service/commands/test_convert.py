"""``genaug convert-unet``: real checkpoint files in, a servable safetensors UNet out.

The checkpoints are made from the tiny UNet the way training code saves them: wrapped in a
dict with an optimizer state and an ``argparse.Namespace`` of arguments (which
``torch.load(weights_only=True)`` refuses, as the user's own loader needed
``weights_only=False``), with ``module.``/``_orig_mod.`` prefixes.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from genaug.service.commands.convert_unet import ConvertError, convert_unet, find_unet_state
from genaug.service.pipeline.load import ModelLoadError, load_model
from genaug.service.pipeline.tiny import build_tiny_pipeline


@pytest.fixture(scope="module")
def unet_state() -> dict[str, torch.Tensor]:
    """The tiny UNet's weights, changed (a 'fine-tune': the service's output must change)."""
    unet: Any = build_tiny_pipeline(seed=3, batch_invariant=False).unet
    return {k: v.detach().clone() for k, v in unet.state_dict().items()}


def training_checkpoint(state: dict[str, torch.Tensor], *, wrapper: str = "model_state_dict",
                        prefix: str = "module._orig_mod.") -> dict[str, Any]:
    """What a training loop saves: weights, optimizer state, arguments, epoch."""
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    params[0].grad = torch.ones(2)
    optimizer.step()
    return {
        wrapper: {prefix + k: v for k, v in state.items()},
        "optimizer": optimizer.state_dict(),
        "args": argparse.Namespace(lr=1e-4, batch_size=8, output_dir="runs/x"),
        "epoch": 12,
    }


def test_a_checkpoint_that_needs_unpickling_is_refused_without_the_flag(
    unet_state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    src = tmp_path / "checkpoint_best.pt"
    torch.save(training_checkpoint(unet_state), str(src))
    # The service's own loader refuses it, and names the converter.
    with pytest.raises(ModelLoadError) as info:
        load_model(source="tiny-random", unet_weights=src, device="cpu", dtype="auto")
    assert "genaug convert-unet" in str(info.value) and "--trust-this-file" in str(info.value)
    # The converter refuses it too without the flag, and says why.
    dst = tmp_path / "unet.safetensors"
    with pytest.raises(ConvertError) as refused:
        convert_unet(src, dst, base="tiny-random")
    message = str(refused.value)
    assert "refusing to unpickle" in message and "--trust-this-file" in message
    assert "runs any code" in message
    assert not dst.exists()


@pytest.mark.parametrize(
    ("wrapper", "prefix"),
    [("model_state_dict", "module._orig_mod."), ("state_dict", "module."), ("ema", "unet."),
     ("unet_state_dict", "_orig_mod."), ("unet", "")],
)
def test_converted_weights_load_in_the_service(
    unet_state: dict[str, torch.Tensor], tmp_path: Path, wrapper: str, prefix: str
) -> None:
    src = tmp_path / "checkpoint.pt"
    torch.save(training_checkpoint(unet_state, wrapper=wrapper, prefix=prefix), str(src))
    dst = tmp_path / "out" / "unet.safetensors"
    result = convert_unet(src, dst, base="tiny-random", trust=True)
    assert result.ok and result.written == dst and result.unpickled
    assert result.location == wrapper and result.tensors == len(unet_state)
    written = load_file(str(dst))
    assert written.keys() == unet_state.keys()
    assert all(torch.equal(written[k], unet_state[k]) for k in unet_state)

    base = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    tuned = load_model(source="tiny-random", unet_weights=dst, device="cpu", dtype="auto")
    assert tuned.weights_hash != base.weights_hash
    assert torch.equal(tuned.pipeline.unet.conv_in.weight, unet_state["conv_in.weight"])


def test_plain_state_dict_needs_no_flag(unet_state: dict[str, torch.Tensor],
                                        tmp_path: Path) -> None:
    src = tmp_path / "plain.pth"
    torch.save({"module." + k: v for k, v in unet_state.items()}, str(src))
    result = convert_unet(src, tmp_path / "unet.safetensors", base="tiny-random")
    assert result.ok and not result.unpickled and result.location == "<top level>"


def test_a_whole_pickled_module_is_read_through_its_state_dict(tmp_path: Path) -> None:
    unet = build_tiny_pipeline(seed=4, batch_invariant=False).unet
    src = tmp_path / "model.pt"
    torch.save({"ema": unet, "step": 5}, str(src))
    result = convert_unet(src, tmp_path / "unet.safetensors", base="tiny-random", trust=True)
    assert result.ok and result.location == "ema"


def test_mismatch_prints_a_diff_and_writes_nothing(
    unet_state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    broken = dict(unet_state)
    del broken["conv_out.bias"]
    broken["conv_in.weight"] = torch.zeros(3, 3)
    broken["model.diffusion_model.input_blocks.0.weight"] = torch.zeros(1)
    src = tmp_path / "broken.pt"
    torch.save(training_checkpoint(broken), str(src))
    dst = tmp_path / "unet.safetensors"
    result = convert_unet(src, dst, base="tiny-random", trust=True)
    assert not result.ok and result.written is None and not dst.exists()
    assert result.missing == ["conv_out.bias"]
    assert result.unexpected == ["model.diffusion_model.input_blocks.0.weight"]
    assert result.mismatched == [("conv_in.weight", (3, 3), tuple(unet_state["conv_in.weight"]
                                                                    .shape))]
    diff = result.diff()
    assert "  - conv_out.bias" in diff
    assert "  + model.diffusion_model.input_blocks.0.weight" in diff
    assert "  ~ conv_in.weight (3, 3) vs (16, 4, 3, 3)" in diff


def test_key_picks_between_two_unets(unet_state: dict[str, torch.Tensor]) -> None:
    other = {k: v + 1 for k, v in unet_state.items()}
    shapes = {k: tuple(v.shape) for k, v in unet_state.items()}
    checkpoint = {"state_dict": unet_state, "ema": other}
    location, tensors, _, others = find_unet_state(checkpoint, shapes)
    assert location == "state_dict" and others == ["ema"]
    location, tensors, _, _ = find_unet_state(checkpoint, shapes, key="ema")
    assert location == "ema" and torch.equal(tensors["conv_in.weight"], other["conv_in.weight"])
    with pytest.raises(ConvertError, match="no entry 'nope'"):
        find_unet_state(checkpoint, shapes, key="nope")
    with pytest.raises(ConvertError, match="found no state dict of tensors"):
        find_unet_state({"epoch": 3}, shapes)


def test_base_is_a_diffusers_folder(unet_state: dict[str, torch.Tensor], tmp_path: Path) -> None:
    folder = tmp_path / "base"
    build_tiny_pipeline(batch_invariant=False).save_pretrained(str(folder))
    src = tmp_path / "unet_in.safetensors"
    save_file({"unet." + k: v.contiguous() for k, v in unet_state.items()}, str(src))
    result = convert_unet(src, tmp_path / "unet.safetensors", base=str(folder))
    assert result.ok and not result.unpickled
    loaded = load_model(source=folder, unet_weights=result.written, device="cpu", dtype="auto")
    assert torch.equal(loaded.pipeline.unet.conv_in.weight, unet_state["conv_in.weight"])


def test_cli_refuses_then_converts(
    unet_state: dict[str, torch.Tensor], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from genaug.cli import main

    src = tmp_path / "checkpoint_best.pt"
    torch.save(training_checkpoint(unet_state), str(src))
    dst = tmp_path / "unet.safetensors"
    args = ["convert-unet", str(src), str(dst), "--base", "tiny-random"]
    assert main(args) == 2  # in this process: the refusal; the conversion below as a command
    assert "--trust-this-file" in capsys.readouterr().err
    assert not dst.exists()
    done = subprocess.run([sys.executable, "-m", "genaug.cli", *args, "--trust-this-file"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "model_state_dict" in done.stdout and "ignored" not in done.stdout
    assert f"wrote {dst}" in done.stdout and dst.is_file()
