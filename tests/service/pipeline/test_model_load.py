"""Model loading: the tiny pipeline, diffusers folders, UNet overrides, and refusals."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub reads it

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from genaug.service.pipeline.device import resolve_device, resolve_dtype
from genaug.service.pipeline.load import LoadedModel, ModelLoadError, load_model
from genaug.service.pipeline.tiny import build_tiny_pipeline

STEPS = 4
GUIDANCE = 5.0  # > 1: classifier-free guidance doubles the UNet batch


def generate(pipeline: Any, prompts: list[str], seeds: list[int]) -> np.ndarray:
    """Run the real SDXL __call__ path; return uint8 images [N, H, W, 3]."""
    with torch.inference_mode():
        images = pipeline(
            prompts,
            num_inference_steps=STEPS,
            guidance_scale=GUIDANCE,
            height=64,
            width=64,
            generator=[torch.Generator().manual_seed(s) for s in seeds],
            output_type="np",
        ).images
    assert np.isfinite(images).all()
    uint8: np.ndarray = (images * 255).round().astype(np.uint8)
    return uint8


def load_tiny(unet_weights: Path | None = None) -> LoadedModel:
    return load_model(source="tiny-random", unet_weights=unet_weights, device="cpu", dtype="auto")


def perturbed_unet_state(pipeline: Any) -> dict[str, torch.Tensor]:
    """The tiny UNet's weights with its output convolution changed (a 'fine-tune')."""
    state = {k: v.detach().clone().contiguous() for k, v in pipeline.unet.state_dict().items()}
    state["conv_out.weight"] = state["conv_out.weight"] * 3.0 + 0.01
    return state


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_tiny()


@pytest.fixture(scope="module")
def tiny_reference(tiny: LoadedModel) -> np.ndarray:
    return generate(tiny.pipeline, ["a red square"], [7])


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-diffusers")
    build_tiny_pipeline(batch_invariant=False).save_pretrained(str(folder))
    return folder


# --- tiny pipeline ------------------------------------------------------------------------


def test_tiny_is_deterministic(tiny: LoadedModel, tiny_reference: np.ndarray) -> None:
    again = load_tiny()
    assert re.fullmatch(r"[0-9a-f]{16}", tiny.weights_hash)
    assert again.weights_hash == tiny.weights_hash
    assert (tiny.kind, tiny.source, tiny.trained_on) == ("tiny-random", "tiny-random", None)
    assert tiny.device == torch.device("cpu") and tiny.dtype == torch.float32
    assert tiny_reference.shape == (1, 64, 64, 3)
    np.testing.assert_array_equal(generate(again.pipeline, ["a red square"], [7]), tiny_reference)
    # A different seed of the weights is a different model.
    other = build_tiny_pipeline(seed=1)
    assert not torch.equal(
        other.unet.conv_in.weight,
        tiny.pipeline.unet.conv_in.weight,
    )


def test_tiny_keeps_the_callers_rng_state() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_pipeline()
    assert torch.equal(torch.rand(3), expected)


def test_image_depends_on_its_seed_not_its_batch_mates(tiny: LoadedModel) -> None:
    prompts = [f"object {i}, studio light" for i in range(8)]
    seeds = [11, 3, 42, 1000, 5, 77, 123456789, 9]
    batch = generate(tiny.pipeline, prompts, seeds)
    assert batch.shape == (8, 64, 64, 3)
    assert len({img.tobytes() for img in batch}) == 8  # seeds and prompts matter
    for i in (0, 3, 7):
        alone = generate(tiny.pipeline, [prompts[i]], [seeds[i]])
        np.testing.assert_array_equal(alone[0], batch[i])
    # Same seed and prompt in another batch position, among other batch mates.
    shuffled = generate(tiny.pipeline, [prompts[5], prompts[3]], [seeds[5], seeds[3]])
    np.testing.assert_array_equal(shuffled[1], batch[3])


# --- diffusers folders --------------------------------------------------------------------


def test_saved_folder_loads_offline(saved_dir: Path, tiny_reference: np.ndarray) -> None:
    loaded = load_model(source=saved_dir, unet_weights=None, device="cpu", dtype="float32")
    assert loaded.kind == "diffusers"
    assert loaded.source == str(saved_dir)
    assert re.fullmatch(r"[0-9a-f]{16}", loaded.weights_hash)
    assert loaded.dtype == torch.float32
    again = load_model(source=saved_dir, unet_weights=None, device="cpu", dtype="auto")
    assert again.weights_hash == loaded.weights_hash
    # Same weights, same image: exactly the unwrapped tiny pipeline's output, and within
    # float noise of the batch-invariant one (which evaluates the CFG pair one by one).
    image = generate(loaded.pipeline, ["a red square"], [7])
    reference = build_tiny_pipeline(batch_invariant=False)
    np.testing.assert_array_equal(image, generate(reference, ["a red square"], [7]))
    assert np.abs(image.astype(int) - tiny_reference.astype(int)).max() <= 1


def test_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        load_model(source=tmp_path / "nope", unet_weights=None, device="cpu", dtype="auto")
    assert "GENAUG_MODEL" in str(info.value)


def test_non_diffusers_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="model_index.json") as info:
        load_model(source=tmp_path, unet_weights=None, device="cpu", dtype="auto")
    assert "not a diffusers pipeline folder" in str(info.value)


def test_broken_diffusers_folder_is_a_model_load_error(saved_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text((saved_dir / "model_index.json").read_text())
    with pytest.raises(ModelLoadError, match="could not load the diffusers folder"):
        load_model(source=broken, unet_weights=None, device="cpu", dtype="auto")


# --- single file ---------------------------------------------------------------------------


def test_single_file_needs_safetensors(tmp_path: Path) -> None:
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"\x80\x04")
    with pytest.raises(ModelLoadError, match="not a .safetensors file"):
        load_model(source=ckpt, unet_weights=None, device="cpu", dtype="auto")


def test_single_file_config_must_be_a_diffusers_folder(tmp_path: Path) -> None:
    ckpt = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(2)}, str(ckpt))
    with pytest.raises(ModelLoadError, match="GENAUG_SINGLE_FILE_CONFIG"):
        load_model(
            source=ckpt,
            unet_weights=None,
            device="cpu",
            dtype="auto",
            single_file_config=tmp_path,
        )


def test_single_file_without_config_never_downloads(tmp_path: Path) -> None:
    ckpt = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(2)}, str(ckpt))
    with pytest.raises(ModelLoadError, match="single-file checkpoint") as info:
        load_model(source=ckpt, unet_weights=None, device="cpu", dtype="auto")
    assert "GENAUG_SINGLE_FILE_CONFIG" in str(info.value)


# --- UNet weight overrides -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["safetensors", "pt-raw", "pt-state_dict", "pt-unet"])
def test_unet_override_changes_hash_and_output(
    fmt: str, tiny: LoadedModel, tiny_reference: np.ndarray, tmp_path: Path
) -> None:
    state = perturbed_unet_state(tiny.pipeline)
    if fmt == "safetensors":
        path = tmp_path / "unet.safetensors"
        save_file(state, str(path))
    else:
        path = tmp_path / "unet.pt"
        wrapped = {
            "pt-raw": state,
            "pt-state_dict": {"state_dict": state},
            "pt-unet": {"unet": state},
        }
        torch.save(wrapped[fmt], str(path))
    tuned = load_tiny(unet_weights=path)
    assert tuned.kind == "tiny-random"
    assert tuned.weights_hash != tiny.weights_hash
    assert re.fullmatch(r"[0-9a-f]{16}", tuned.weights_hash)
    assert torch.equal(tuned.pipeline.unet.conv_out.weight, state["conv_out.weight"])
    image = generate(tuned.pipeline, ["a red square"], [7])
    assert not np.array_equal(image, tiny_reference)
    # The hash is of content, not of the file name.
    renamed = path.rename(tmp_path / f"renamed{path.suffix}")
    assert load_tiny(unet_weights=renamed).weights_hash == tuned.weights_hash


class _Payload:
    """Unpickling this runs code: it writes ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "pwned"))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    # The payload is live: a plain unpickle would write its marker.
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(probe)))
    assert probe.read_text() == "pwned"

    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"conv_in.weight": torch.zeros(1), "evil": _Payload(marker)}, str(path))
    with pytest.raises(ModelLoadError, match="refused to load UNet weights") as info:
        load_tiny(unet_weights=path)
    assert "weights_only=True" in str(info.value)
    assert "safetensors" in str(info.value)
    assert "genaug convert-unet" in str(info.value)
    assert not marker.exists()


def test_non_tensor_entries_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "unet.pth"
    torch.save({"state_dict": {"conv_in.weight": torch.zeros(1), "epoch": 3}}, str(path))
    with pytest.raises(ModelLoadError, match="non-tensor entries, e.g. epoch"):
        load_tiny(unet_weights=path)


def test_mismatched_unet_weights_list_keys(tiny: LoadedModel, tmp_path: Path) -> None:
    state = perturbed_unet_state(tiny.pipeline)
    del state["conv_out.bias"]
    state["model.diffusion_model.extra"] = torch.zeros(1)
    path = tmp_path / "unet.safetensors"
    save_file(state, str(path))
    with pytest.raises(ModelLoadError) as info:
        load_tiny(unet_weights=path)
    message = str(info.value)
    assert "1 missing keys (e.g. conv_out.bias)" in message
    assert "1 unexpected keys (e.g. model.diffusion_model.extra)" in message

    state = perturbed_unet_state(tiny.pipeline)
    state["conv_out.bias"] = torch.zeros(5)
    save_file(state, str(path))
    with pytest.raises(ModelLoadError, match=r"conv_out.bias \(5,\) vs \(4,\)"):
        load_tiny(unet_weights=path)


def test_the_service_finds_the_unet_where_convert_unet_does(
    tiny: LoadedModel, tmp_path: Path
) -> None:
    # One reader: a tensors-only training checkpoint (no unpickling needed) loads as it is,
    # found under its wrapper with its DDP/compile prefixes stripped.
    state = perturbed_unet_state(tiny.pipeline)
    path = tmp_path / "checkpoint.pt"
    torch.save({"model_state_dict": {"module._orig_mod." + k: v for k, v in state.items()},
                "epoch": 12}, str(path))
    tuned = load_tiny(unet_weights=path)
    assert torch.equal(tuned.pipeline.unet.conv_out.weight, state["conv_out.weight"])


def test_bad_unet_weights_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tiny(unet_weights=tmp_path / "missing.safetensors")
    odd = tmp_path / "unet.ckpt"
    odd.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="unknown extension '.ckpt'"):
        load_tiny(unet_weights=odd)
    junk = tmp_path / "unet.safetensors"
    junk.write_bytes(b"definitely not safetensors")
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_tiny(unet_weights=junk)


# --- device and dtype ------------------------------------------------------------------------


def test_resolve_device_cpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["mps", "rocm", "cuda:x", "cuda:-1", ""])
def test_resolve_device_rejects_unknown(spec: str) -> None:
    with pytest.raises(ModelLoadError, match="GENAUG_DEVICE"):
        resolve_device(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_refused(spec: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        load_model(source=None, unet_weights=None, device=spec, dtype="auto")
    message = str(info.value)
    assert f"device {spec!r} requested but CUDA is not available" in message
    assert "available: cpu" in message
    assert "GENAUG_DEVICE=cpu" in message


def test_cuda_index_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ModelLoadError) as info:
        resolve_device("cuda:2")
    message = str(info.value)
    assert "2 CUDA device(s) visible" in message
    assert "available: cpu, cuda:0, cuda:1" in message
    assert "GENAUG_DEVICE" in message
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_resolve_dtype() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("auto", cuda) == torch.bfloat16
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cuda) == torch.float16
    assert resolve_dtype("float32", cuda) == torch.float32
    with pytest.raises(ModelLoadError, match="GENAUG_DTYPE=float32 or GENAUG_DTYPE=bfloat16"):
        resolve_dtype("float16", cpu)
    with pytest.raises(ModelLoadError, match="auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", cpu)


def test_tiny_in_bfloat16_on_cpu() -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert model.pipeline.unet.dtype == torch.bfloat16
    assert model.weights_hash == load_tiny().weights_hash  # same weights, other precision
    assert generate(model.pipeline, ["a red square"], [7]).shape == (1, 64, 64, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_on_cuda(tiny: LoadedModel) -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cuda", dtype="auto")
    assert model.device.type == "cuda" and model.dtype == torch.bfloat16
    assert model.pipeline.unet.device.type == "cuda"
    assert model.weights_hash == tiny.weights_hash
    with torch.inference_mode():
        images = model.pipeline(
            ["a red square"] * 2,
            num_inference_steps=STEPS,
            guidance_scale=GUIDANCE,
            generator=[torch.Generator("cuda").manual_seed(s) for s in (1, 2)],
            output_type="np",
        ).images
    assert images.shape == (2, 64, 64, 3) and np.isfinite(images).all()
