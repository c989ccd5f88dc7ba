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
