"""The one UNet checkpoint reader and the one file hasher (service/pipeline/weights.py).

The service (``GENAUG_UNET_WEIGHTS``) and ``genaug convert-unet`` read checkpoints through
the same functions; only ``trust=True`` (the command's ``--trust-this-file``) ever unpickles.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from genaug.service.commands.convert_unet import ConvertError, read_unet_checkpoint
from genaug.service.pipeline.weights import (
    CheckpointError,
    NoUnetState,
    PickleRefused,
    compare_shapes,
    find_unet_state,
    hash_files,
    read_checkpoint,
    strip_prefixes,
)

STATE = {"conv_in.weight": torch.ones(2, 3), "conv_out.bias": torch.zeros(4)}
EXPECTED = {k: tuple(v.shape) for k, v in STATE.items()}


class _Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "pwned"))


# -- reading ---------------------------------------------------------------------------------


def test_strip_prefixes() -> None:
    assert strip_prefixes("module._orig_mod.unet.conv_in.weight") == "conv_in.weight"
    assert strip_prefixes("_orig_mod.module.conv_in.weight") == "conv_in.weight"
    assert strip_prefixes("conv_in.weight") == "conv_in.weight"
    assert strip_prefixes("down_blocks.0.module.weight") == "down_blocks.0.module.weight"


def test_safetensors_and_plain_pickles_are_read_without_unpickling_code(tmp_path: Path) -> None:
    st = tmp_path / "unet.safetensors"
    save_file(STATE, str(st))
    pt = tmp_path / "unet.pt"
    torch.save({"state_dict": STATE, "epoch": 3}, str(pt))
    for path in (st, pt):
        loaded = read_checkpoint(path)
        found = find_unet_state(loaded, EXPECTED)
        assert found.tensors.keys() == STATE.keys() and found.ignored == []


def test_a_pickle_with_code_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"conv_in.weight": torch.zeros(1), "evil": _Payload(marker)}, str(path))
    with pytest.raises(PickleRefused) as info:
        read_checkpoint(path)
    assert info.value.path == path and info.value.detail
    assert not marker.exists()
    # only genaug convert-unet --trust-this-file runs such a pickle, as asked
    with pytest.raises(ConvertError, match="--trust-this-file"):
        read_unet_checkpoint(path, trust=False)
    assert not marker.exists()
    loaded, unpickled = read_unet_checkpoint(path, trust=True)
    assert unpickled and marker.read_text() == "pwned" and set(loaded) == {"conv_in.weight",
                                                                           "evil"}


#: What torch's own refusal goes on to say: run it with the safety off, or allow-list the
#: object. genaug's refusals must quote none of it (the fix is convert-unet, or safetensors).
TORCH_ADVICE = ("weights_only` set to `False", "will likely succeed",
                "two options", "still be loaded", "add_safe_globals", "safe_globals(", "\x1b[",
                "Check the documentation of torch.load")


def test_the_pickle_refusal_is_genaugs_one_line_advice_and_it_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """A checkpoint saved the way a training loop saves one (the UNet under DDP's prefix in
    ``model_state_dict``, the optimizer's state, the run's ``argparse.Namespace``): the
    service's reader refuses it with one line that names the file, says it holds pickled
    objects and gives the fix; the fix, run as written, converts it; no layer quotes torch's
    advice to turn the safety off."""
    import argparse
    import shlex

    from genaug.cli import main
    from genaug.service.pipeline.load import ModelLoadError, load_model
    from genaug.service.pipeline.tiny import build_tiny_pipeline

    monkeypatch.delenv("GENAUG_MODEL", raising=False)
    unet: Any = build_tiny_pipeline(seed=3, batch_invariant=False).unet
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    params[0].grad = torch.ones(2)
    optimizer.step()
    src = tmp_path / "run 7" / "checkpoint_best.pt"  # a space: the command must quote it
    src.parent.mkdir()
    torch.save({"model_state_dict": {"module." + k: v for k, v in unet.state_dict().items()},
                "optimizer": optimizer.state_dict(),
                "args": argparse.Namespace(lr=1e-4, batch_size=8, output_dir="runs/7"),
                "epoch": 12}, str(src))
    with pytest.raises(torch.serialization.pickle.UnpicklingError) as raw:  # torch's own
        torch.load(str(src), weights_only=True)
    assert "weights_only" in str(raw.value) and "\n" in str(raw.value)  # what it would quote

    with pytest.raises(PickleRefused) as info:
        read_checkpoint(src)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{src} holds pickled objects"), message
    assert "argparse.Namespace" in message and info.value.detail == "argparse.Namespace"
    assert "or save the weights as .safetensors" in message
    assert not [p for p in (*TORCH_ADVICE, "weights_only=False") if p in message], message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained advice

    # the service's refusal (GENAUG_UNET_WEIGHTS) and the converter's (without the flag) carry
    # the same detail and no torch advice either (the converter names weights_only=False
    # itself: it is what its --trust-this-file does)
    with pytest.raises(ModelLoadError) as service:
        load_model(source="tiny-random", unet_weights=src, device="cpu", dtype="auto")
    with pytest.raises(ConvertError) as command:
        read_unet_checkpoint(src, trust=False)
    for refusal in (str(service.value), str(command.value)):
        assert "argparse.Namespace" in refusal and "--trust-this-file" in refusal, refusal
        assert not [p for p in TORCH_ADVICE if p in refusal], refusal

    # the fix, run exactly as the refusal writes it, makes a file the reader takes
    fix = message.split("convert it once: ", 1)[1].split(", or save", 1)[0]
    argv = shlex.split(fix)
    assert argv[:2] == ["genaug", "convert-unet"] and argv[-1] == "--trust-this-file", argv
    assert main(argv[1:]) == 0, capsys.readouterr()
    dst = Path(argv[3])
    assert dst == src.with_suffix(".safetensors")
    assert read_checkpoint(dst).keys() == unet.state_dict().keys()


def test_unreadable_files_are_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist or is not a file"):
        read_checkpoint(tmp_path / "missing.pt")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"definitely not safetensors")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file") as info:
        read_checkpoint(junk)
    assert str(info.value).startswith(str(junk)) and info.value.reason.startswith("is not")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="could not be read by torch.load"):
        read_checkpoint(empty)


def test_finds_the_unet_under_wrappers_and_names_what_is_left(tmp_path: Path) -> None:
    prefixed = {"module." + k: v for k, v in STATE.items()}
    found = find_unet_state({"model_state_dict": {**prefixed, "step": 1}, "epoch": 2}, EXPECTED)
    assert found.location == "model_state_dict" and found.ignored == ["step"]
    assert found.tensors.keys() == STATE.keys()
    found = find_unet_state({"state_dict": STATE, "ema": STATE}, EXPECTED)
    assert (found.location, found.others) == ("state_dict", ["ema"])
    assert find_unet_state({"a": {"b": STATE}}, EXPECTED, key="a.b").location == "a.b"
    with pytest.raises(NoUnetState, match="no entry 'c'"):
        find_unet_state({"a": {"b": STATE}}, EXPECTED, key="a.c")
    with pytest.raises(NoUnetState, match="found no state dict of tensors"):
        find_unet_state({"epoch": 3}, EXPECTED)


def test_compare_shapes_lists_what_differs() -> None:
    tensors = {"conv_in.weight": torch.ones(3, 3), "extra": torch.ones(1)}
    diff = compare_shapes(tensors, EXPECTED)
    assert not diff.ok
    assert diff.missing == ["conv_out.bias"] and diff.unexpected == ["extra"]
    assert diff.mismatched == [("conv_in.weight", (3, 3), (2, 3))]
    assert compare_shapes(STATE, EXPECTED).ok


# -- hashing ---------------------------------------------------------------------------------


def test_one_hasher_for_adapters_and_model_weights(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "unet").mkdir(parents=True)
    a = folder / "unet" / "a.safetensors"
    a.write_bytes(b"weights of a")
    # An adapter: 16 hex chars of blake2b over the bytes alone, so a rename changes nothing.
    assert hash_files([a], sizes=False) == hashlib.blake2b(a.read_bytes(),
                                                           digest_size=8).hexdigest()
    # The model's weights_hash: size then bytes, and the path within a folder when given.
    manual = hashlib.blake2b(digest_size=8)
    manual.update(b"unet/a.safetensors\0" + b"12\0" + b"weights of a")
    assert hash_files([a], root=folder) == manual.hexdigest()
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(b"\0unet-override\0")
    assert hash_files([a], hasher=hasher) == hasher.hexdigest()
