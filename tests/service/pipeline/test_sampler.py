"""genaug's sampler: per-image guidance in one UNet call, checked against diffusers' own loop.

Reference checks call ``StableDiffusionXLPipeline.__call__`` and
``StableDiffusionXLImg2ImgPipeline.__call__`` with ``output_type="latent"`` on the same
components and require equal latents, bit for bit (the CPU, float32). Batch invariance is
checked on the default (per-sample) tiny pipeline: an image equals itself generated alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from genaug.service.batching.items import SCHEDULERS, GroupKey, Item
from genaug.service.pipeline.denoising import step_kwargs
from genaug.service.pipeline.load import LoadedModel, load_model
from genaug.service.pipeline.schedulers import SCHEDULER_CLASSES, Schedulers, UnknownSchedulerError
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.pipeline.worker import PipelineWorker

PROMPTS = ["a red circle", "a blue square", "a green triangle"]
SEEDS = [11, 12, 13]


def item(prompt: str = "a cat", seed: int = 1, guidance: float = 5.0, **kw: Any) -> Item:
    kw.setdefault("output_height", 64)
    kw.setdefault("output_width", 64)
    return Item(prompt, seed=seed, guidance=guidance, **kw)


def generators(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def sources(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(n)]


@pytest.fixture(scope="module")
def worker(tiny_model: LoadedModel) -> PipelineWorker:
    return PipelineWorker(tiny_model)


@pytest.fixture(scope="module")
def batched_worker(tiny_model: LoadedModel) -> Iterator[PipelineWorker]:
    """The same weights, truly batched (``batch_invariant=False``), as a GPU runs them."""
    pipeline = build_tiny_pipeline(batch_invariant=False)
    yield PipelineWorker(dataclasses.replace(tiny_model, pipeline=pipeline))


def record_unet(monkeypatch: pytest.MonkeyPatch, worker: PipelineWorker) -> list[tuple[int, float]]:
    """(rows, timestep) of every UNet call."""
    unet = worker.pipe.unet
    inner = unet.forward
    calls: list[tuple[int, float]] = []

    def forward(sample: torch.Tensor, timestep: torch.Tensor, *args: Any, **kw: Any) -> Any:
        calls.append((int(sample.shape[0]), float(timestep)))
        return inner(sample, timestep, *args, **kw)

    monkeypatch.setattr(unet, "forward", forward)
    return calls


# -- against diffusers' own loop --------------------------------------------------------------


@pytest.mark.parametrize("pipeline", ["per-sample", "batched"])
@pytest.mark.parametrize(
    ("guidance", "negatives"),
    [(5.0, None), (7.5, ["", "blurry", "a dog"]), (1.0, None), (0.0, ["ignored"] * 3)],
    ids=["cfg-zeros", "cfg-text", "no-cfg", "no-cfg-negative-ignored"],
)
def test_a_shared_guidance_batch_equals_the_stock_pipeline_exactly(
    request: pytest.FixtureRequest,
    pipeline: str,
    guidance: float,
    negatives: list[str] | None,
) -> None:
    w: PipelineWorker = request.getfixturevalue(
        "worker" if pipeline == "per-sample" else "batched_worker"
    )
    key = GroupKey(height=64, width=64, steps=3)
    items = [
        item(p, s, guidance, negative_prompt=None if negatives is None else negatives[i])
        for i, (p, s) in enumerate(zip(PROMPTS, SEEDS, strict=True))
    ]
    with torch.inference_mode():
        ours = w.sampler.denoise(key, items)
        stock = w.pipe(
            prompt=PROMPTS,
            negative_prompt=negatives,
            num_inference_steps=3,
            guidance_scale=guidance,
            generator=generators(SEEDS),
            output_type="latent",
        ).images
    torch.testing.assert_close(ours, stock, rtol=0, atol=0)


def test_scheduler_noise_is_drawn_per_image_as_diffusers_does(
    batched_worker: PipelineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """euler_a draws fresh noise every step from each image's generator; the stock pipeline
    with the same scheduler instance gives the same latents."""
    key = GroupKey(height=64, width=64, steps=3, scheduler="euler_a")
    items = [item(p, s, 4.0) for p, s in zip(PROMPTS, SEEDS, strict=True)]
    with torch.inference_mode():
        ours = batched_worker.sampler.denoise(key, items)
        monkeypatch.setattr(batched_worker.pipe, "scheduler",
                            batched_worker.schedulers.get("euler_a"))
        stock = batched_worker.pipe(
            prompt=PROMPTS, num_inference_steps=3, guidance_scale=4.0,
            generator=generators(SEEDS), output_type="latent",
        ).images
    torch.testing.assert_close(ours, stock, rtol=0, atol=0)


def test_img2img_equals_the_stock_img2img_pipeline_exactly(worker: PipelineWorker) -> None:
    srcs = sources(3)
    key = GroupKey(height=64, width=64, steps=4, mode="img2img", strength=0.6)
    items = [
        item(p, s, 5.0, source=src)
        for p, s, src in zip(PROMPTS, SEEDS, srcs, strict=True)
    ]
    with torch.inference_mode():
        ours = worker.sampler.denoise(key, items)
        stock = worker.sampler.img2img(
            prompt=PROMPTS,
            image=[Image.fromarray(src) for src in srcs],
            strength=0.6,
            num_inference_steps=4,
            guidance_scale=5.0,
            generator=generators(SEEDS),
            output_type="latent",
        ).images
    torch.testing.assert_close(ours, stock, rtol=0, atol=0)


def test_img2img_shares_every_weight_with_the_text_pipeline() -> None:
    """from_pipe reuses the component objects and keeps their dtype (its default would cast
    every shared component to float32)."""
    model = load_model(source=None, unet_weights=None, device="cpu", dtype="bfloat16")
    w = PipelineWorker(model)
    img2img = w.sampler.img2img
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        ours, theirs = getattr(w.pipe, name), getattr(img2img, name)
        assert ours is theirs
        for (key, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items(),
                                    strict=True):
            assert a.data_ptr() == b.data_ptr(), f"{name}.{key} was copied"
        assert next(ours.parameters()).dtype == torch.bfloat16
    out = w.run(GroupKey(height=64, width=64, steps=2, mode="img2img", strength=0.5),
                [item(source=sources(1)[0])])
    assert out.errors == {} and out.images[0].shape == (64, 64, 3)


# -- one UNet call per step, guidance per image ------------------------------------------------


def test_mixed_guidance_shares_one_unet_call_per_step(
    worker: PipelineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_unet(monkeypatch, worker)
    items = [
        item("a", 1, 7.5),
        item("b", 2, 1.0, negative_prompt="ignored"),
        item("c", 3, 2.0, negative_prompt=""),
        item("d", 4, 0.5),
        item("e", 5, 3.0, output_height=32, output_width=48, channels=1),
    ]
    out = worker.run(GroupKey(height=64, width=64, steps=3), items)
    assert out.errors == {}
    # 3 guided images: 3 unconditional + 5 conditional rows, one call per step
    assert [rows for rows, _ in calls] == [8, 8, 8]
    calls.clear()
    worker.run(GroupKey(height=64, width=64, steps=3), [item("a", 1, 1.0), item("b", 2, 0.0)])
    assert [rows for rows, _ in calls] == [2, 2, 2]  # nobody guided: no unconditional half


def test_per_image_guidance_semantics(worker: PipelineWorker) -> None:
    key = GroupKey(height=64, width=64, steps=2)

    def latents(it: Item) -> torch.Tensor:
        with torch.inference_mode():
            return worker.sampler.denoise(key, [it])

    plain = latents(item(guidance=1.0))
    # guidance <= 1: no guidance, so the negative prompt and the value itself are ignored
    torch.testing.assert_close(latents(item(guidance=1.0, negative_prompt="x")), plain,
                               rtol=0, atol=0)
    torch.testing.assert_close(latents(item(guidance=0.3)), plain, rtol=0, atol=0)
    guided = latents(item(guidance=5.0))
    assert not torch.equal(guided, plain)
    # None is zeros, "" is the encoded empty prompt: two different negatives
    assert not torch.equal(latents(item(guidance=5.0, negative_prompt="")), guided)
    assert not torch.equal(latents(item(guidance=5.0, negative_prompt="blurry")), guided)
    assert not torch.equal(latents(item(guidance=6.0)), guided)


@pytest.mark.parametrize("mode", ["text", "img2img"])
@pytest.mark.parametrize("scheduler", ["default", "euler_a"])
def test_an_image_is_the_same_alone_or_in_a_mixed_batch(
    worker: PipelineWorker, mode: str, scheduler: str
) -> None:
    """Guidance, negative prompt, output size and channels differ between batch mates; each
    output is bit-identical to the same item made alone (and the source too, for img2img)."""
    srcs = sources(5, seed=3)
    key = GroupKey(height=64, width=64, steps=3, scheduler=scheduler, mode=mode,  # type: ignore[arg-type]
                   strength=0.7 if mode == "img2img" else 1.0)
    kinds: list[dict[str, Any]] = [
        {"guidance": 7.5},
        {"guidance": 1.0, "negative_prompt": "x", "output_height": 32, "output_width": 40},
        {"guidance": 3.0, "negative_prompt": "", "channels": 1},
        {"guidance": 5.0, "negative_prompt": "blurry", "output_height": 96, "output_width": 96},
        {"guidance": 0.0},
    ]
    items = [
        item(f"prompt {i}", 100 + i, source=srcs[i] if mode == "img2img" else None, **kw)
        for i, kw in enumerate(kinds)
    ]
    together = worker.run(key, items)
    assert together.errors == {}
    for it, image in zip(items, together.images, strict=True):
        assert image.shape == it.output_shape
        np.testing.assert_array_equal(image, worker.run(key, [it]).images[0])
    # and per-seed reproducibility: the batch again, in another order
    again = worker.run(key, items[::-1])
    for image, repeat in zip(together.images, again.images[::-1], strict=True):
        np.testing.assert_array_equal(image, repeat)


# -- schedulers --------------------------------------------------------------------------------


def test_every_scheduler_name_builds_once_from_the_model_config(worker: PipelineWorker) -> None:
    schedulers = Schedulers(worker.pipe)
    model_config = worker.pipe.scheduler.config
    for name in SCHEDULERS:
        built = schedulers.get(name)
        assert schedulers.get(name) is built  # cached: one instance per name
        if name == "default":
            # the model's own scheduler, as this worker's instance (schedulers keep step state)
            assert type(built) is type(worker.pipe.scheduler)
            assert built is not worker.pipe.scheduler
            assert dict(built.config) == dict(model_config)
            continue
        assert type(built).__name__ == SCHEDULER_CLASSES[name][0]
        assert built.config.num_train_timesteps == model_config.num_train_timesteps
        assert built.config.beta_schedule == model_config.beta_schedule
        assert built.config.prediction_type == model_config.prediction_type
    assert schedulers.get("dpmpp_2m_karras").config.use_karras_sigmas is True
    assert schedulers.get("dpmpp_2m").config.use_karras_sigmas is False
    assert schedulers.get("dpmpp_2m") is not schedulers.get("dpmpp_2m_karras")
    assert schedulers.describe("euler_a") == "euler_a (EulerAncestralDiscreteScheduler)"
    # The few-step distillations' own: Euler over trailing timesteps, TCD at gamma 0.3.
    assert schedulers.get("euler_trailing").config.timestep_spacing == "trailing"
    assert schedulers.get("euler").config.timestep_spacing != "trailing"
    assert step_kwargs(schedulers.get("tcd"), [])["eta"] == 0.3
    assert "eta" not in step_kwargs(schedulers.get("lcm"), [])
    with pytest.raises(UnknownSchedulerError, match="unknown scheduler 'ddim'.*euler_a"):
        schedulers.get("ddim")


def test_every_scheduler_makes_finite_distinct_images(worker: PipelineWorker) -> None:
    images = {}
    for name in SCHEDULERS:
        out = worker.run(GroupKey(height=64, width=64, steps=4, scheduler=name),
                         [item(seed=5), item(seed=6, guidance=1.0)])
        assert out.errors == {}, name
        images[name] = out.images[0]
    # euler is the tiny model's own scheduler: same image; every other sampler differs
    np.testing.assert_array_equal(images["euler"], images["default"])
    others = [images[n] for n in SCHEDULERS if n not in ("default", "euler")]
    for i, a in enumerate(others):
        assert not np.array_equal(a, images["default"])
        for b in others[i + 1:]:
            assert not np.array_equal(a, b)


def test_a_keys_scheduler_overrides_the_setting(tiny_model: LoadedModel) -> None:
    configured = PipelineWorker(tiny_model, scheduler="euler_a")
    plain = PipelineWorker(tiny_model)
    assert configured.schedulers.describe() == "euler_a (EulerAncestralDiscreteScheduler)"
    assert plain.schedulers.describe() == "default (EulerDiscreteScheduler)"
    its = [item(seed=9)]
    by_setting = configured.run(GroupKey(height=64, width=64, steps=3), its).images[0]
    by_key = plain.run(GroupKey(height=64, width=64, steps=3, scheduler="euler_a"), its).images[0]
    np.testing.assert_array_equal(by_setting, by_key)
    overridden = configured.run(GroupKey(height=64, width=64, steps=3, scheduler="dpmpp_2m"), its)
    assert not np.array_equal(overridden.images[0], by_setting)
    with pytest.raises(UnknownSchedulerError):
        plain.run(GroupKey(height=64, width=64, steps=3, scheduler="nope"), its)


# -- img2img -----------------------------------------------------------------------------------


def test_strength_chooses_how_much_of_the_schedule_runs(
    worker: PipelineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_unet(monkeypatch, worker)
    text_steps = worker.schedulers.get("default")
    src = sources(1)[0]
    run_steps = {}
    for strength in (1.0, 0.5, 0.25, 0.01):
        calls.clear()
        out = worker.run(GroupKey(height=64, width=64, steps=8, mode="img2img",
                                  strength=strength), [item(source=src)])
        assert out.errors == {}
        run_steps[strength] = [t for _, t in calls]
    text_steps.set_timesteps(8)
    full = [float(t) for t in text_steps.timesteps]
    assert run_steps[1.0] == full  # strength 1: the whole schedule, from the noisiest step
    assert run_steps[0.5] == full[4:]
    assert run_steps[0.25] == full[6:]
    assert run_steps[0.01] == full[7:]  # at least one step (diffusers would run none)


@pytest.mark.parametrize("strength", [0.0, -0.1, 1.5])
def test_strength_outside_its_bounds_is_refused(worker: PipelineWorker, strength: float) -> None:
    key = GroupKey(height=64, width=64, steps=4, mode="img2img", strength=strength)
    with pytest.raises(ValueError, match=r"strength .* outside \(0, 1\]"):
        worker.run(key, [item(source=sources(1)[0])])


def test_strength_sets_how_far_from_the_source_the_result_can_go(
    worker: PipelineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a UNet that predicts no noise, Euler keeps the starting latents, so the result is
    the source's latents plus the noise of the strength's first step: near 0 the source
    survives almost unchanged; at 1 the noise (sigma ~8 here) swamps it."""
    unet = worker.pipe.unet
    monkeypatch.setattr(unet, "forward",
                        lambda sample, *a, **k: (torch.zeros_like(sample),))
    src_a, src_b = sources(2, seed=7)
    vae = worker.pipe.vae

    def clean(src: np.ndarray) -> torch.Tensor:
        """The source's latents as the sampler draws them: the posterior sample is the first
        draw of the item's generator (seed 3)."""
        pixels = torch.from_numpy(src).permute(2, 0, 1)[None].float() / 255 * 2 - 1
        with torch.inference_mode():
            posterior = vae.encode(pixels).latent_dist
        draw = torch.randn(posterior.mean.shape, generator=torch.Generator().manual_seed(3))
        latents: torch.Tensor = (posterior.mean + posterior.std * draw) * vae.config.scaling_factor
        return latents

    def result(src: np.ndarray, strength: float) -> torch.Tensor:
        key = GroupKey(height=64, width=64, steps=20, mode="img2img", strength=strength)
        with torch.inference_mode():
            return worker.sampler.denoise(key, [item(seed=3, source=src)])

    z_a, z_b = clean(src_a), clean(src_b)
    near, far_a, far_b = result(src_a, 0.02), result(src_a, 1.0), result(src_b, 1.0)
    # both are the source's latents plus the same noise (same seed), scaled by the sigma of
    # the strength's first step: ~0.03 at strength 0.02, ~10 at strength 1
    ratio = float((near - z_a).norm() / (far_a - z_a).norm())
    assert 0 < ratio < 0.01
    torch.testing.assert_close(near - z_a, (far_a - z_a) * ratio, rtol=1e-3, atol=1e-4)
    assert (far_a - z_a).norm() > 5 * z_a.norm()  # at 1 the noise swamps the source
    # two sources, same seed, strength 1: they differ only by their own latents
    torch.testing.assert_close(far_a - far_b, z_a - z_b, rtol=1e-4, atol=1e-4)


def test_img2img_outputs_keep_their_own_seeds(worker: PipelineWorker) -> None:
    src = sources(1)[0]
    key = GroupKey(height=64, width=64, steps=3, mode="img2img", strength=0.8)
    out = worker.run(key, [item(seed=s, source=src) for s in (1, 2, 1)])
    assert out.errors == {}
    np.testing.assert_array_equal(out.images[0], out.images[2])
    assert not np.array_equal(out.images[0], out.images[1])


def test_a_bad_source_fails_alone(worker: PipelineWorker) -> None:
    key = GroupKey(height=64, width=64, steps=2, mode="img2img", strength=0.5)
    good = item(seed=1, source=sources(1)[0])
    items = [good, item(seed=2), item(seed=3, source=np.zeros((32, 32, 3), np.uint8))]
    out = worker.run(key, items)
    assert sorted(out.errors) == [1, 2]
    assert "no source" in out.errors[1] and "uint8 (64, 64, 3)" in out.errors[2]
    np.testing.assert_array_equal(out.images[0], worker.run(key, [good]).images[0])
    text = worker.run(GroupKey(height=64, width=64, steps=2), [good])
    assert list(text.errors) == [0] and "img2img key" in text.errors[0]


def test_workers_sharing_a_model_own_their_scheduler_state(tiny_model: Any) -> None:
    """Two services in one process share the loaded model (tests do); scheduler state (step
    index, multistep history) must not be shared, or concurrent batches break each other
    (IndexError: index 5 is out of bounds)."""
    import threading



    first, second = PipelineWorker(tiny_model), PipelineWorker(tiny_model)
    for name in ("default", "euler_a"):
        a, b = first.schedulers.get(name), second.schedulers.get(name)
        assert a is not b and a is not tiny_model.pipeline.scheduler
    key = GroupKey(height=64, width=64, steps=4)
    batch = [Item(f"p{i}", seed=i, guidance=5.0, output_height=64, output_width=64)
             for i in range(2)]
    alone = [np.stack(w.run(key, batch).images) for w in (first, second)]
    results: dict[int, list[np.ndarray]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def run(index: int, worker: PipelineWorker) -> None:
        try:
            for _ in range(4):
                results[index].append(np.stack(worker.run(key, batch).images))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for index in (0, 1):
        for images in results[index]:
            np.testing.assert_array_equal(images, alone[index])
