"""The generator's per-image guarantees: NaN guard, out-of-memory split, device and dtype."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch

from genaug.service.batching.items import GroupKey, Item
from genaug.service.metrics import Metrics
from genaug.service.pipeline.load import load_model
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.testing import LiveService

KEY = GroupKey(height=64, width=64, steps=2)


def items(n: int, base: int = 0, *, size: tuple[int, int] = (64, 64), **kw: Any) -> list[Item]:
    return [
        Item(f"prompt {i}", seed=base + i, guidance=5.0, output_height=size[0],
             output_width=size[1], **kw)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def bf16_model() -> Any:
    return load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="bfloat16")


def test_nonfinite_vae_output_upcasts_the_vae_and_is_never_served(bf16_model: Any) -> None:
    gen = PipelineWorker(bf16_model, Metrics())
    vae = gen.pipe.vae
    original = vae.decode
    poisoned: list[torch.dtype] = []

    def decode(latents: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = original(latents, *args, **kwargs)
        if vae.dtype != torch.float32:  # the low-precision VAE overflows, as SDXL's fp16 one does
            poisoned.append(vae.dtype)
            out[0][1] = float("nan")
        return out

    vae.decode = decode
    try:
        outcome = gen.run(KEY, items(3))
    finally:
        vae.decode = original
    assert poisoned == [torch.bfloat16]
    assert gen.vae_upcast and vae.dtype == torch.float32
    assert outcome.errors == {}
    assert [image.shape for image in outcome.images] == [(64, 64, 3)] * 3
    # the regenerated image is the fp32-VAE decode of the same latents, not a black square
    assert outcome.images[1].std() > 0
    again = gen.run(KEY, items(3))
    np.testing.assert_array_equal(again.images[1], outcome.images[1])


def test_nonfinite_latents_fail_only_their_own_image(tiny_model: Any) -> None:
    metrics = Metrics()
    gen = PipelineWorker(tiny_model, metrics)
    original = gen._denoise

    def denoise(key: GroupKey, batch: Any) -> torch.Tensor:
        latents = original(key, batch)
        latents[2] = float("inf")  # a UNet overflow for this seed
        return latents

    gen._denoise = denoise  # type: ignore[method-assign]
    outcome = gen.run(KEY, items(4))
    assert list(outcome.errors) == [2] and "NaN/Inf" in outcome.errors[2]
    clean = PipelineWorker(tiny_model).run(KEY, items(4))
    for i in (0, 1, 3):
        np.testing.assert_array_equal(outcome.images[i], clean.images[i])
    assert metrics.nonfinite_images._value.get() == 1


def test_out_of_memory_halves_the_batch_and_keeps_every_image(tiny_model: Any) -> None:
    gen = PipelineWorker(tiny_model)
    original = gen._denoise
    sizes: list[int] = []

    def denoise(key: GroupKey, batch: Any) -> torch.Tensor:
        sizes.append(len(batch))
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(key, batch)

    gen._denoise = denoise  # type: ignore[method-assign]
    outcome = gen.run(KEY, items(8, base=50))
    assert sizes == [8, 4, 2, 2, 4, 2, 2]  # halves until each part fits
    assert outcome.errors == {}
    clean = PipelineWorker(tiny_model).run(KEY, items(8, base=50))
    np.testing.assert_array_equal(np.stack(outcome.images), np.stack(clean.images))


def test_an_image_that_cannot_fit_alone_fails_alone(tiny_model: Any) -> None:
    gen = PipelineWorker(tiny_model)
    original = gen._denoise

    def denoise(key: GroupKey, batch: Any) -> torch.Tensor:
        if any(item.seed == 3 for item in batch):
            raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")
        return original(key, batch)

    gen._denoise = denoise  # type: ignore[method-assign]
    outcome = gen.run(KEY, items(4))
    assert list(outcome.errors) == [3] and "out of memory" in outcome.errors[3]


def test_other_errors_are_not_mistaken_for_out_of_memory(tiny_model: Any) -> None:
    gen = PipelineWorker(tiny_model)

    def denoise(key: GroupKey, batch: Any) -> torch.Tensor:
        raise RuntimeError("index 21 is out of bounds for dimension 0 with size 21")

    gen._denoise = denoise  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="out of bounds"):
        gen.run(KEY, items(2))


def test_output_resize_is_antialiased_and_exact_in_size(tiny_model: Any) -> None:
    out = PipelineWorker(tiny_model).run(KEY, items(2, size=(17, 33)))
    assert all(image.shape == (17, 33, 3) and image.dtype == np.uint8 for image in out.images)


def test_per_image_arguments_do_not_depend_on_batch_mates(tiny_model: Any) -> None:
    """Guidance, negative prompt, output size and channels may differ inside one batch; each
    image equals the same item generated alone."""
    worker = PipelineWorker(tiny_model)
    mixed = [
        Item("a", seed=1, guidance=5.0, output_height=64, output_width=64),
        Item("b", seed=2, guidance=1.5, output_height=32, output_width=48),
        Item("c", seed=3, guidance=5.0, output_height=64, output_width=64, negative_prompt=""),
        Item("d", seed=4, guidance=3.0, output_height=64, output_width=64, channels=1),
    ]
    together = worker.run(KEY, mixed)
    assert together.errors == {}
    for item, image in zip(mixed, together.images, strict=True):
        assert image.shape == item.output_shape
        alone = worker.run(KEY, [item]).images[0]
        np.testing.assert_array_equal(image, alone)


def test_requests_that_differ_in_guidance_share_one_batch_over_http(
    make_service: Callable[..., LiveService], tiny_model: Any
) -> None:
    """Through the real service (GENAUG_SCHEDULER=euler_a): three requests with their own
    guidance and negative prompt queue behind a held batch, run as one pipeline call, and each
    image equals its item made alone."""
    from genaug.client import Client

    live = make_service(max_batch_images=8, max_wait_ms=20, scheduler="euler_a")
    worker = live.worker
    assert worker is not None
    assert worker.inner.schedulers.describe() == "euler_a (EulerAncestralDiscreteScheduler)"
    asks = [(7.5, None), (1.0, "ignored"), (3.0, "")]
    with Client(live.url, timeout=60) as client, ThreadPoolExecutor(4) as pool:
        worker.gate.clear()
        worker.entered.clear()
        blocker = pool.submit(client.generate, "blocker", seed=1)
        assert worker.entered.wait(30), "the worker never started the blocker"
        futures = [
            pool.submit(client.generate, f"prompt {i}", seed=10 + i, guidance=g,
                        negative_prompt=negative)
            for i, (g, negative) in enumerate(asks)
        ]
        deadline = time.monotonic() + 30
        while live.metric("genaug_queue_images") < len(asks):
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.02)
        worker.gate.set()
        blocker.result(timeout=60)
        results = [f.result(timeout=60) for f in futures]
    assert len(worker.calls) == 2
    key, batch = worker.calls[1]
    assert key.scheduler == "default"  # the request named none: the setting applies
    assert sorted(it.guidance for it in batch) == sorted(g for g, _ in asks)
    alone = PipelineWorker(tiny_model, scheduler="euler_a")
    for i, result in enumerate(results):
        [it] = [it for it in batch if it.seed == 10 + i]
        np.testing.assert_array_equal(result.images[0], alone.run(key, [it]).images[0])


# -- on a CUDA device (skipped without one) --------------------------------------------------


@pytest.mark.gpu
def test_cuda_pinning_and_default_bf16() -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cuda:0", dtype="auto")
    assert model.device == torch.device("cuda:0") and model.dtype == torch.bfloat16
    for module in (model.pipeline.unet, model.pipeline.vae, model.pipeline.text_encoder):
        param = next(module.parameters())
        assert param.device == torch.device("cuda:0") and param.dtype == torch.bfloat16
    out = PipelineWorker(model).run(KEY, items(4))
    assert out.errors == {} and [image.shape for image in out.images] == [(64, 64, 3)] * 4


@pytest.mark.gpu
def test_cuda_fp16_vae_overflow_is_caught_and_upcast() -> None:
    model = load_model(source="tiny-random", unet_weights=None, device="cuda:0", dtype="float16")
    gen = PipelineWorker(model, Metrics())
    with torch.no_grad():  # make the fp16 decoder overflow, as SDXL's fp16 VAE does
        conv = gen.pipe.vae.decoder.conv_in
        conv.weight.mul_(6e4)
    out = gen.run(KEY, items(2))
    assert gen.vae_upcast and gen.pipe.vae.dtype == torch.float32
    assert out.errors == {} or all("NaN/Inf" in m for m in out.errors.values())
    served = [i for i in range(2) if i not in out.errors]
    # uint8 is always finite: what a NaN decode leaves behind is a black image (NaN casts to
    # 0), the silent failure the guard exists for. No served image may be one.
    assert all(out.images[i].dtype == np.uint8 and out.images[i].max() > 0 for i in served)


@pytest.mark.gpu
def test_cuda_bf16_per_image_guidance_matches_the_stock_pipeline() -> None:
    """On the device in bfloat16: a shared-guidance batch equals diffusers' own loop within
    bf16 rounding (kernels may differ between calls), and a mixed batch matches its images
    made alone within the same tolerance."""
    model = load_model(source="tiny-random", unet_weights=None, device="cuda:0", dtype="auto")
    worker = PipelineWorker(model)
    batch = items(3)
    with torch.inference_mode():
        ours = worker.sampler.denoise(KEY, batch)
        stock = worker.pipe(
            prompt=[it.prompt for it in batch], num_inference_steps=KEY.steps, guidance_scale=5.0,
            generator=[torch.Generator("cuda:0").manual_seed(it.seed) for it in batch],
            output_type="latent",
        ).images
    assert ours.dtype == torch.bfloat16 and ours.device == torch.device("cuda:0")
    torch.testing.assert_close(ours.float(), stock.float(), rtol=2e-2, atol=5e-2)
    mixed = [
        Item("a", seed=1, guidance=7.5, output_height=64, output_width=64),
        Item("b", seed=2, guidance=1.0, output_height=32, output_width=32, channels=1),
        Item("c", seed=3, guidance=3.0, output_height=64, output_width=64, negative_prompt=""),
    ]
    together = worker.run(KEY, mixed)
    assert together.errors == {}
    for it, image in zip(mixed, together.images, strict=True):
        alone = worker.run(KEY, [it]).images[0]
        assert np.abs(alone.astype(int) - image.astype(int)).max() <= 2

