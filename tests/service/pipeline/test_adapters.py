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
from genaug.service.pipeline.adapters import (
    SLOT,
    AdapterLoadError,
    Adapters,
    UnknownAdapterError,
)
from genaug.service.pipeline.load import LoadedModel, load_model
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings
from genaug.service.testing import make_lora

KEY = GroupKey(height=64, width=64, steps=3)
#: Seeds as the planner draws them (63 bits).
SEEDS = (6_917_529_027_641_081_857, 4_611_686_018_427_387_913)


def item(seed: int, guidance: float = 5.0, **kw: object) -> Item:
    return Item(f"prompt {seed}", seed=seed, guidance=guidance, output_height=64,
                output_width=64, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("loras")
    return {"ink": make_lora(folder, "ink", seed=1), "chalk": make_lora(folder, "chalk", seed=2)}


def fresh_model() -> LoadedModel:
    """A tiny model of its own: LoRA layers go into the UNet, so the session's shared model
    stays untouched."""
    return load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")


@pytest.fixture(scope="module", params=["resident", "hotswap"])
def worker(request: pytest.FixtureRequest, loras: dict[str, Path]) -> PipelineWorker:
    """Both ways of serving adapters: resident (compile off: each adapter injected under its
    name) and hotswap (what GENAUG_COMPILE serves: one slot, no compile needed to test it)."""
    return PipelineWorker(fresh_model(), loras=loras, hotswap=request.param == "hotswap")


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
    assert [entry["rank"] for entry in info] == [4, 4]
    if worker.adapters.hotswap:
        assert worker.pipe.get_list_adapters() == {"unet": [SLOT]}
        assert worker.adapters.swap_info() == {"adapter_swap": "hotswap", "lora_max_rank": 4}
    else:
        assert worker.pipe.get_list_adapters() == {"unet": ["ink", "chalk"]}
        assert worker.adapters.swap_info() == {"adapter_swap": "resident",
                                               "lora_max_rank": None}


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


# -- hotswap: one slot for a compiled UNet ---------------------------------------------------


def subset_lora(source: Path, out: Path, keep: tuple[str, ...]) -> Path:
    """``source``'s weights for the projections named in ``keep`` only (``to_q``, ...)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(source))
    save_file({k: v for k, v in state.items() if any(f".{t}." in k for t in keep)}, str(out))
    return out


@pytest.fixture(scope="module")
def mixed_loras(
    tmp_path_factory: pytest.TempPathFactory, loras: dict[str, Path]
) -> dict[str, Path]:
    """Ranks 2, 4 and 8, and an adapter of only the query and key projections."""
    folder = tmp_path_factory.mktemp("mixed")
    return {
        "ink": loras["ink"],
        "thin": make_lora(folder, "thin", seed=3, rank=2),
        "wide": make_lora(folder, "wide", seed=4, rank=8),
        "qk": subset_lora(loras["chalk"], folder / "qk.safetensors", ("to_q", "to_k")),
    }


def test_the_slot_makes_the_images_resident_adapters_make(mixed_loras: dict[str, Path]) -> None:
    """Padded to rank 8, zero on the layers an adapter lacks, scaled through tensors: the
    same images as each adapter injected on its own, for every adapter, scale and none."""
    resident = PipelineWorker(fresh_model(), loras=mixed_loras)
    slot = PipelineWorker(fresh_model(), loras=mixed_loras, hotswap=True)
    assert slot.adapters.max_rank == 8
    assert [i["rank"] for i in slot.adapters.info()] == [4, 2, 8, 4]
    for adapter, scale in (("ink", 1.0), ("thin", 0.7), ("wide", 0.25), ("qk", 1.3),
                           (None, 1.0)):
        key = GroupKey(height=64, width=64, steps=2, adapter=adapter, adapter_scale=scale)
        batch = [item(11), item(12, guidance=1.0)]
        want = np.stack(resident.run(key, batch).images).astype(int)
        got = np.stack(slot.run(key, batch).images).astype(int)
        assert np.abs(got - want).max() <= 1, (adapter, scale)  # float32 sums of zero padding
    # The slot holds qk (loaded last): ink, thin, wide, qk are copies; "none" copies nothing.
    assert slot.adapters.switches == 4


def test_the_slot_keeps_each_adapters_own_weights_whatever_the_load_order(
    mixed_loras: dict[str, Path],
) -> None:
    """The slot is laid out by the adapter with the most layers (ink), here listed after one
    of fewer layers (qk): ink must still draw with ink's weights, not with what qk left in the
    slot (the save had followed the load order, and ink was saved from a slot holding qk)."""
    loras = {"qk": mixed_loras["qk"], "ink": mixed_loras["ink"]}
    resident = PipelineWorker(fresh_model(), loras=loras)
    slot = PipelineWorker(fresh_model(), loras=loras, hotswap=True)
    assert [i["name"] for i in slot.adapters.info()] == ["qk", "ink"]  # load order
    for adapter in ("ink", "qk", "ink"):
        key = GroupKey(height=64, width=64, steps=2, adapter=adapter, adapter_scale=1.0)
        batch = [item(21), item(22, guidance=1.0)]
        want = np.stack(resident.run(key, batch).images).astype(int)
        got = np.stack(slot.run(key, batch).images).astype(int)
        assert np.abs(got - want).max() <= 1, adapter


def test_switching_keeps_every_slot_tensor_in_place(loras: dict[str, Path]) -> None:
    """What a compiled graph guards on stays put: no tensor of the slot is replaced, and the
    scales stay tensors (diffusers' set_adapters would make them floats: a recompile)."""
    worker = PipelineWorker(fresh_model(), loras=loras, hotswap=True)
    unet = worker.pipe.unet
    from peft.tuners.lora import LoraLayer

    layers = [m for m in unet.modules() if isinstance(m, LoraLayer)]
    assert layers

    def identity() -> list[int]:
        params = [id(p) for n, p in unet.named_parameters() if "lora_" in n]
        return params + [id(m.scaling[SLOT]) for m in layers]

    before = identity()
    for adapter, scale in (("ink", 1.0), ("chalk", 0.5), (None, 1.0), ("chalk", 2.0)):
        worker.adapters.activate(adapter, scale)
        assert identity() == before
        assert all(isinstance(m.scaling[SLOT], torch.Tensor) for m in layers)
    assert float(layers[0].scaling[SLOT]) == pytest.approx(2.0)  # alpha 4 / rank 4 x 2.0
    worker.adapters.activate(None)
    assert all(float(m.scaling[SLOT]) == 0.0 for m in layers)


def test_what_cannot_share_the_slot_is_refused_in_one_line(
    tmp_path: Path, loras: dict[str, Path]
) -> None:
    from safetensors.torch import load_file, save_file

    wide = make_lora(tmp_path, "wide", seed=5, rank=8)
    with pytest.raises(AdapterLoadError) as info:
        PipelineWorker(fresh_model(), loras={"ink": loras["ink"], "wide": wide}, hotswap=True,
                       lora_max_rank=4)
    message = str(info.value)
    assert "\n" not in message
    assert "'wide'" in message and "rank 8, above GENAUG_LORA_MAX_RANK=4" in message
    assert "set GENAUG_LORA_MAX_RANK=8 or unset it" in message

    state = load_file(str(loras["ink"]))
    text = tmp_path / "text.safetensors"
    save_file({**state, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A"
               ".weight": torch.zeros(4, 32)}, str(text))
    with pytest.raises(AdapterLoadError, match=r"'text'.*text-encoder weights.*genaug adapt "
                       r"without --text-encoder\), or set GENAUG_COMPILE=off"):
        PipelineWorker(fresh_model(), loras={"text": text}, hotswap=True)

    qk = subset_lora(loras["ink"], tmp_path / "qk.safetensors", ("to_q", "to_k"))
    vo = subset_lora(loras["chalk"], tmp_path / "vo.safetensors", ("to_v", "to_out"))
    with pytest.raises(AdapterLoadError, match=r"'vo'.*cannot share the compiled UNet's "
                       r"adapter slot, laid out by 'qk'.*set GENAUG_COMPILE=off") as info:
        PipelineWorker(fresh_model(), loras={"qk": qk, "vo": vo}, hotswap=True)
    assert "\n" not in str(info.value)
    # Served resident (GENAUG_COMPILE=off), both load.
    assert PipelineWorker(fresh_model(), loras={"qk": qk, "vo": vo}).adapters.names == {"qk", "vo"}


def test_a_switch_is_a_copy_of_the_slot(loras: dict[str, Path]) -> None:
    """The cost the issue asks for, on the tiny model: what a switch copies and takes."""
    adapters = Adapters(fresh_model().pipeline, loras, hotswap=True)
    for i in range(1, 21):  # the slot holds chalk, loaded last: ink first
        adapters.activate("ink" if i % 2 else "chalk", 1.0)
    assert adapters.switches == 20
    assert adapters.switch_seconds / adapters.switches < 0.05


@pytest.mark.slow  # a regional compile of the tiny UNet on the CPU: 20-60 s
@pytest.mark.timeout(1800)
def test_ten_adapters_on_a_compiled_unet_never_recompile(tmp_path: Path) -> None:
    """The issue's case: ten adapters (two made by `genaug adapt`'s training, eight of ranks
    2 to 8), GENAUG_COMPILE=regional, requests going round them, the base and other scales.
    After warm-up dynamo raises on any recompile, and its graph count stays put: the compiled
    graph, not an eager fallback, served every batch. (Resident adapters recompiled at each
    switch: 10 recompiles over 22 requests.)"""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.utils import counters

    from genaug.service.adapt.train import AdaptConfig, AdaptData, adapt
    from genaug.service.pipeline.acceleration import Acceleration

    loras: dict[str, Path] = {}
    shots = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    for k in range(2):
        out = tmp_path / f"adapted{k}.safetensors"
        adapt(fresh_model(), AdaptData(shots, [["a sks circle"]] * 2, "0" * 16), out,
              AdaptConfig(steps=2, rank=4 * (k + 1), seed=k, batch_size=1, progress=False))
        loras[f"adapted{k}"] = out
    for k in range(8):
        loras[f"made{k}"] = make_lora(tmp_path, f"made{k}", seed=10 + k, rank=(2, 4, 8)[k % 3])
    settings = Settings(compile="regional", max_batch_images=2)
    torch._dynamo.reset()
    try:
        model = fresh_model()
        acceleration = Acceleration.setup(model, settings)
        worker = PipelineWorker(model, loras=loras, hotswap=True)
        assert worker.adapters.max_rank == 8
        acceleration.warm_up(worker, acceleration.plan(settings, [], defaults=(64, 2, 5.0)))
        graphs = int(counters["stats"]["unique_graphs"])
        assert graphs > 0
        names = [None, *loras]
        dynamo_config.error_on_recompile = True
        images = {}
        for i in range(22):
            name = names[i % len(names)]
            scale = 1.0 if i < len(names) else 0.5
            key = GroupKey(64, 64, 2, adapter=name, adapter_scale=scale)
            out = worker.run(key, [item(SEEDS[i % 2]), item(SEEDS[1 - i % 2], guidance=1.0)])
            assert out.errors == {}
            images[(name, scale)] = np.stack(out.images).astype(int)
        assert int(counters["stats"]["unique_graphs"]) == graphs
        assert worker.adapters.switches >= 20
        base = images[(None, 1.0)]
        assert all(np.abs(v - base).mean() > 0.5 for (n, s), v in images.items()
                   if n is not None and s == 1.0 and n.startswith("made"))
    finally:
        dynamo_config.error_on_recompile = False
        torch._dynamo.reset()


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
