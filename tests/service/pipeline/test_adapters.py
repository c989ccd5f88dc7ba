"""LoRA adapters: loaded at start through diffusers + peft, switched per batch, never reloaded.

The LoRA files are made here: peft adapters on a tiny UNet with the served architecture, their
up-projections drawn at random (a freshly initialised LoRA is a no-op), saved with
``StableDiffusionXLPipeline.save_lora_weights`` as diffusers-format safetensors.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from genaug.service.batching.items import GroupKey, Item
from genaug.service.pipeline.adapters import AdapterLoadError, UnknownAdapterError
from genaug.service.pipeline.load import LoadedModel, load_model
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings
from genaug.service.testing import make_lora

KEY = GroupKey(height=64, width=64, steps=3)


def item(seed: int, guidance: float = 5.0, **kw: object) -> Item:
    return Item(f"prompt {seed}", seed=seed, guidance=guidance, output_height=64,
                output_width=64, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("loras")
    return {"ink": make_lora(folder, "ink", seed=1), "chalk": make_lora(folder, "chalk", seed=2)}


@pytest.fixture(scope="module")
def worker(loras: dict[str, Path]) -> PipelineWorker:
    """A tiny model of its own: LoRA layers go into the UNet, so the session's shared model
    stays untouched."""
    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    return PipelineWorker.from_settings(
        model, Settings(loras=",".join(f"{n}={p}" for n, p in loras.items()))
    )


def test_adapters_load_at_start_with_their_hashes_and_none_active(
    worker: PipelineWorker, loras: dict[str, Path]
) -> None:
    assert worker.adapters.names == {"ink", "chalk"}
    assert worker.adapters.active is None
    info = worker.adapters.info()
    assert [i["name"] for i in info] == ["ink", "chalk"]
    for entry in info:
        path = loras[entry["name"]]
        assert entry["source"] == str(path)
        assert entry["hash"] == hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()
    assert worker.adapters.hash("ink") != worker.adapters.hash("chalk")
    assert worker.pipe.get_list_adapters() == {"unet": ["ink", "chalk"]}


def test_an_adapter_changes_the_image_and_none_restores_the_base_model(
    worker: PipelineWorker, tiny_model: LoadedModel
) -> None:
    base = PipelineWorker(tiny_model).run(KEY, [item(1)]).images[0]  # never saw a LoRA
    np.testing.assert_array_equal(worker.run(KEY, [item(1)]).images[0], base)
    ink = worker.run(GroupKey(height=64, width=64, steps=3, adapter="ink"), [item(1)]).images[0]
    assert np.abs(ink.astype(int) - base.astype(int)).mean() > 1
    assert worker.adapters.active == ("ink", 1.0)
    np.testing.assert_array_equal(worker.run(KEY, [item(1)]).images[0], base)
    assert worker.adapters.active is None


def test_two_adapters_in_consecutive_batches_switch_without_reloading(
    worker: PipelineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_reload(*args: object, **kwargs: object) -> None:
        raise AssertionError("an adapter was loaded again")

    monkeypatch.setattr(worker.pipe, "load_lora_weights", no_reload)

    def run(adapter: str | None, scale: float = 1.0) -> np.ndarray:
        key = GroupKey(height=64, width=64, steps=3, adapter=adapter, adapter_scale=scale)
        out = worker.run(key, [item(4), item(5, guidance=1.0)])
        assert out.errors == {}
        return np.stack(out.images)

    ink, chalk, ink_again = run("ink"), run("chalk"), run("ink")
    np.testing.assert_array_equal(ink, ink_again)
    assert not np.array_equal(ink, chalk)
    half = run("ink", 0.5)
    assert not np.array_equal(half, ink)
    np.testing.assert_array_equal(run("chalk"), chalk)
    np.testing.assert_array_equal(run("ink", 0.5), half)


def test_same_seed_and_adapter_alone_or_batched(worker: PipelineWorker) -> None:
    key = GroupKey(height=64, width=64, steps=3, adapter="chalk", adapter_scale=0.8)
    mates = [item(7), item(8, guidance=1.0, negative_prompt="x"), item(9, guidance=2.5,
             negative_prompt="", channels=1)]
    together = worker.run(key, mates)
    for it, image in zip(mates, together.images, strict=True):
        worker.run(GroupKey(height=64, width=64, steps=3, adapter="ink"), [it])  # switch away
        np.testing.assert_array_equal(worker.run(key, [it]).images[0], image)


def test_adapters_apply_to_img2img_too(worker: PipelineWorker) -> None:
    source = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    it = item(3, source=source)
    plain = worker.run(GroupKey(height=64, width=64, steps=3, mode="img2img", strength=0.7), [it])
    ink = worker.run(GroupKey(height=64, width=64, steps=3, mode="img2img", strength=0.7,
                              adapter="ink"), [it])
    assert plain.errors == {} and ink.errors == {}
    assert not np.array_equal(plain.images[0], ink.images[0])


def test_an_unknown_adapter_names_the_loaded_ones(worker: PipelineWorker) -> None:
    with pytest.raises(UnknownAdapterError, match="unknown adapter 'oil'.*chalk, ink") as info:
        worker.run(GroupKey(height=64, width=64, steps=3, adapter="oil"), [item(1)])
    assert info.value.known == ("chalk", "ink")


def test_unloadable_files_are_refused_at_start(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(AdapterLoadError, match="'gone'.*does not exist"):
        PipelineWorker(model, loras={"gone": missing})
    pickled = tmp_path / "lora.pt"
    pickled.write_bytes(b"\x80\x04")
    with pytest.raises(AdapterLoadError, match="not a .safetensors file"):
        PipelineWorker(model, loras={"pt": pickled})
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(AdapterLoadError, match="'bad'.*could not be loaded"):
        PipelineWorker(model, loras={"bad": garbage})
    unrelated = tmp_path / "unrelated.safetensors"
    save_file({"some.other.weight": torch.zeros(2, 2)}, str(unrelated))
    with pytest.raises(AdapterLoadError, match="'other'.*could not be loaded"):
        PipelineWorker(model, loras={"other": unrelated})
    prefix = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.lora"
    wrong_shape = tmp_path / "wrong_shape.safetensors"
    save_file({f"{prefix}.down.weight": torch.zeros(3, 7),
               f"{prefix}.up.weight": torch.zeros(5, 3)}, str(wrong_shape))
    with pytest.raises(AdapterLoadError, match="(?s)'shape'.*size mismatch"):
        PipelineWorker(model, loras={"shape": wrong_shape})
    assert model.pipeline.get_list_adapters() == {"unet": []}  # nothing half-loaded


# -- on a CUDA device (skipped without one) --------------------------------------------------


@pytest.mark.gpu
def test_cuda_img2img_and_lora(tmp_path: Path) -> None:
    lora = make_lora(tmp_path, "ink", seed=1)
    model = load_model(source="tiny-random", unet_weights=None, device="cuda:0", dtype="auto")
    worker = PipelineWorker(model, loras={"ink": lora})
    source = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    batch = [Item("v", seed=s, guidance=5.0, output_height=64, output_width=64, source=source)
             for s in (1, 2)]
    plain = worker.run(GroupKey(height=64, width=64, steps=4, mode="img2img", strength=0.6), batch)
    ink = worker.run(GroupKey(height=64, width=64, steps=4, mode="img2img", strength=0.6,
                              adapter="ink"), batch)
    assert plain.errors == {} and ink.errors == {}
    assert not np.array_equal(plain.images[0], plain.images[1])  # per-image seeds
    assert np.abs(plain.images[0].astype(int) - ink.images[0].astype(int)).mean() > 1
