"""The GPU acceptance plan: every user path at full size, a few steps each, checked to work.

``bash bench/gpu/gpu_run.sh --plan acceptance`` runs it on a GPU machine (about 5 minutes on an
H100 with the install); ``python -m bench.gpu.acceptance --tiny`` runs the same code on the
tiny model and the CPU (tests/bench/test_gpu_sdxl_bench.py does, so the GPU run is never its first).
It checks that things work, not how fast: SDXL base 1.0 built from its configs with random
weights (:func:`bench.gpu._sdxl_model.build_sdxl`), 1024x1024, :data:`STEPS` steps. In order:

1. ``http``: text-to-image and img2img variants through HTTP (``start_service``, the client):
   shapes, seeds, images that are not blank.
2. ``nan_guard``: the VAE in float16 made to overflow (as SDXL's fp16 VAE does): the worker
   upcasts it and serves no black image (the tiny mode, in float32, poisons the decoder: the
   images fail with the NaN/Inf error, and none is served).
3. ``judge``: a CLIP-size encoder (ViT-L/14 image and text towers, random weights, saved as a
   local transformers folder) loaded as a judge's encoder; prompts-rule probabilities of the
   images from 1.
4. ``adapt``: ``genaug adapt``'s training (:func:`~genaug.service.adapt.train.adapt`) for a
   few steps at full size on the images from 1; its file's record; a second adapter derived
   from it (its up-projections negated, rank and header kept).
5. ``adapters``: both adapters served with ``GENAUG_COMPILE=regional``, hotswapped into one
   slot: after warm-up dynamo's ``error_on_recompile`` is on, requests go round adapter one,
   two, none and one at another scale, and the recompiles (the service's counter and dynamo's
   graph count) must stay 0; the adapters must change the image.
6. ``fp8_cuda_graphs``: ``GENAUG_QUANTIZE=fp8`` (where the device has it) with
   ``GENAUG_COMPILE=unet`` and ``GENAUG_COMPILE_MODE=reduce-overhead`` (CUDA graphs, each UNet
   call a marked step): served images, no recompile; and regional with CUDA graphs refused in
   one line.

Each check is written to ``--json`` as soon as it ends (``ok``, ``seconds``, what it found,
or the error); one that fails does not stop the others, and one that would start after
``--budget-s`` is recorded as skipped. The exit status is 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu._sdxl_model import build_sdxl, build_tiny, dynamo_counts
from bench.harness import main

PROMPT = "a photograph of an astronaut riding a horse on the moon, detailed, 8k"
#: Denoising steps of every generation here: enough to run every path, not to look good.
STEPS = 4
#: A seed as the planner draws them (63 bits).
SEED = 6_917_529_027_641_081_857
#: ``genaug adapt`` optimizer steps (one image per step).
ADAPT_STEPS = 3
ADAPT_RANK = 8


@dataclass
class Check:
    name: str
    ok: bool = False
    seconds: float = 0.0
    found: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None


@dataclass
class Run:
    """What the checks share: the arguments, the device, the images and files made."""

    args: argparse.Namespace
    device: Any
    dtype: Any
    folder: Path
    deadline: float
    checks: list[Check] = field(default_factory=list)
    images: Any = None  # uint8 [n, size, size, 3] from the http check
    loras: dict[str, Path] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.args.size)

    def build(self) -> Any:
        """A fresh model (each check that changes a model in place gets its own)."""
        if self.args.tiny:
            return build_tiny(self.device, self.dtype)
        return build_sdxl(self.device, self.dtype)

    def save(self) -> None:
        if self.args.json is not None:
            self.args.json.write_text(json.dumps(
                {"device": str(self.device), "tiny": bool(self.args.tiny), "size": self.size,
                 "steps": STEPS, "ok": all(c.ok for c in self.checks),
                 "checks": [vars(c) for c in self.checks]}, indent=2, default=str))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU (the test)")
    p.add_argument("--size", type=int, default=None, help="generation size (1024; tiny 64)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="skip a check that would start later (default 290; tiny: none)")
    p.add_argument("--only", default=None, help="comma-separated check names")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    args.size = args.size or (64 if args.tiny else 1024)
    if args.budget_s is None:
        args.budget_s = float("inf") if args.tiny else 290.0
    return args


def release(run: Run) -> None:
    import torch

    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def served(run: Run, model: Any, **settings: Any) -> Iterator[Any]:
    """``model`` behind ``create_app`` on 127.0.0.1, full size and :data:`STEPS` by default."""
    from genaug.local_service import free_port
    from genaug.service.settings import Settings
    from genaug.service.testing import start_service

    values: dict[str, Any] = dict(
        port=free_port(), max_batch_images=2, max_wait_ms=5, default_size=run.size,
        default_steps=STEPS, request_timeout_s=900, log_level="warning")
    values.update(settings)
    with start_service(model, settings=Settings(**values), record=False,
                       ready_timeout=900) as live:
        yield live


def not_blank(images: Any) -> bool:
    import numpy as np

    return bool(len(images)) and all(float(np.asarray(i).std()) > 0 for i in images)


# -- the checks ---------------------------------------------------------------------------


def check_http(run: Run, found: dict[str, Any]) -> None:
    from genaug.client import Client

    model = run.build()
    with served(run, model) as live, Client(live.url, timeout=900) as client:
        out = client.generate(PROMPT, n=2, seed=SEED, guidance=5.0, timeout_s=900)
        assert out.images.shape == (2, run.size, run.size, 3), out.images.shape
        assert int(out.seeds[0]) == SEED, out.seeds
        assert not_blank(out.images), "a blank text-to-image image"
        variants = client.variants(out.images[:1], PROMPT, strength=0.6, n_per_image=2,
                                   seed=SEED, timeout_s=900)
        assert variants.images.shape == (2, run.size, run.size, 3), variants.images.shape
        assert not_blank(variants.images), "a blank variant"
        info = client.info()
        found.update(model=info["model"]["kind"], device=info["device"].get("name"),
                     text_to_image=list(out.images.shape), variants=list(variants.images.shape))
    run.images = out.images
    del model
    release(run)


def check_nan_guard(run: Run, found: dict[str, Any]) -> None:
    import numpy as np
    import torch

    from genaug.service.batching.items import GroupKey, Item
    from genaug.service.metrics import Metrics
    from genaug.service.pipeline.worker import PipelineWorker

    model = run.build()
    worker = PipelineWorker(model, Metrics())
    vae = worker.pipe.vae
    with torch.no_grad():
        if run.device.type == "cuda":
            vae.to(torch.float16)  # SDXL's fp16 VAE overflows; make it, as the gpu tests do
            vae.decoder.conv_in.weight.mul_(6e4)
        else:  # float32 does not overflow: poison it, so the guard must refuse the images
            vae.decoder.conv_in.weight.fill_(float("nan"))
    items = [Item(PROMPT, seed=SEED + i, guidance=5.0, output_height=run.size,
                  output_width=run.size) for i in range(2)]
    out = worker.run(GroupKey(run.size, run.size, STEPS), items)
    served_rows = [i for i in range(2) if i not in out.errors]
    found.update(vae_upcast=worker.vae_upcast, failed=len(out.errors), served=len(served_rows))
    assert all("NaN/Inf" in m for m in out.errors.values()), out.errors
    assert all(np.asarray(out.images[i]).max() > 0 for i in served_rows), "a black image served"
    if run.device.type == "cuda":
        assert worker.vae_upcast, "the fp16 VAE was not upcast"
    else:
        assert len(out.errors) == 2, "a poisoned decode was served"
    del worker, model
    release(run)


def clip_folder(run: Run) -> Path:
    """A CLIP model with ViT-L/14's shapes (tiny: a small one) and random weights, saved as a
    local transformers folder with the repo's tokenizer."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    from genaug.service.pipeline.tiny import tiny_tokenizer_dir

    tokenizer = CLIPTokenizer.from_pretrained(tiny_tokenizer_dir(), local_files_only=True)
    if run.args.tiny:
        text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, image_size=32, patch_size=8)
        projection = 16
    else:  # openai/clip-vit-large-patch14
        text = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                    num_attention_heads=12)
        vision = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                      num_attention_heads=16, image_size=224, patch_size=14)
        projection = 768
    config = CLIPConfig(text_config={**text, "vocab_size": len(tokenizer)},
                        vision_config=vision, projection_dim=projection)
    folder = run.folder / "clip"
    CLIPModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_judge(run: Run, found: dict[str, Any]) -> None:
    import numpy as np

    from genaug.service.judge.encoders import load_encoder
    from genaug.service.judge.rules import PromptsRule

    assert run.images is not None, "needs the http check's images"
    encoder: Any = load_encoder(str(clip_folder(run)), run.device)
    rule = PromptsRule(encoder, {"astronaut": [PROMPT], "horse": ["a horse in a field"]},
                       encoder.logit_scale)
    p = rule.probabilities(encoder.images(run.images)).cpu().numpy()
    found.update(parameters=sum(x.numel() for x in encoder.model.parameters()),
                 probabilities=p.round(4).tolist())
    assert p.shape == (len(run.images), 2) and np.isfinite(p).all(), p
    assert np.allclose(p.sum(axis=1), 1.0, atol=1e-4), p


def check_adapt(run: Run, found: dict[str, Any]) -> None:
    import numpy as np
    from safetensors import safe_open
    from safetensors.torch import save_file

    from genaug.service.adapt.train import AdaptConfig, AdaptData, adapt
    from genaug.service.pipeline.lora_record import read_record

    assert run.images is not None, "needs the http check's images"
    model = run.build()
    images = np.concatenate([run.images, run.images[:, :, ::-1]])  # 4 shots
    data = AdaptData(images=np.ascontiguousarray(images),
                     prompts=[["a photo of a sks astronaut"]] * len(images), data_hash="0" * 16)
    one = run.folder / "one.safetensors"
    record = adapt(model, data, one, AdaptConfig(steps=ADAPT_STEPS, rank=ADAPT_RANK,
                                                 batch_size=1, progress=False))
    assert read_record(one).get("base_hash") == model.weights_hash
    losses = [float(x) for x in record["losses"]]
    assert record["steps"] == ADAPT_STEPS and all(np.isfinite(losses)), record
    # The second adapter: the first's up-projections negated (another adapter, same layers,
    # same rank, the same header: made for this model).
    two = run.folder / "two.safetensors"
    with safe_open(str(one), framework="pt") as f:
        metadata = f.metadata()
        state = {k: (-f.get_tensor(k) if "lora_B" in k or "lora.up" in k else f.get_tensor(k))
                 for k in f.keys()}
    save_file(state, str(two), metadata=metadata)
    run.loras = {"one": one, "two": two}
    found.update(steps=record["steps"], losses=losses, file_mb=one.stat().st_size / 2**20)
    del model
    release(run)


def check_adapters(run: Run, found: dict[str, Any]) -> None:
    import numpy as np
    import torch
    import torch._dynamo.config as dynamo_config

    from genaug.client import Client

    assert run.loras, "needs the adapt check's files"
    torch._dynamo.reset()
    model = run.build()
    loras = ",".join(f"{name}={path}" for name, path in run.loras.items())
    started = time.perf_counter()
    with served(run, model, compile="regional", loras=loras, max_batch_images=1) as live:
        found["ready_s"] = round(time.perf_counter() - started, 1)
        with Client(live.url, timeout=900) as client:
            speed = client.info()["acceleration"]
            assert speed["adapter_swap"] == "hotswap", speed
            graphs = dynamo_counts()[0]
            dynamo_config.error_on_recompile = True  # a recompile now fails its request
            try:
                made: dict[str, Any] = {}
                requests = 0
                for adapter, scale in (("one", 1.0), ("two", 1.0), (None, None), ("one", 0.5),
                                       ("two", 1.0), (None, None)):
                    options: dict[str, Any] = {"adapter": adapter} if adapter else {}
                    if scale is not None and adapter is not None:
                        options["adapter_scale"] = scale
                    out = client.generate(PROMPT, n=1, seed=SEED, guidance=5.0,
                                          timeout_s=900, **options)
                    made[f"{adapter}@{scale}"] = out.images[0].astype(np.int16)
                    requests += 1
            finally:
                dynamo_config.error_on_recompile = False
            recompiles = live.metric("genaug_recompiles_total")
            found.update(requests=requests, recompiles=recompiles,
                         graphs_after_warmup=dynamo_counts()[0] - graphs,
                         lora_max_rank=speed["lora_max_rank"])
    assert recompiles == 0 and found["graphs_after_warmup"] == 0, found
    assert np.abs(made["one@1.0"] - made["None@None"]).mean() > 0, "adapter one changed nothing"
    assert np.abs(made["one@1.0"] - made["two@1.0"]).mean() > 0, "one and two drew the same"
    del model
    torch._dynamo.reset()
    release(run)


def check_fp8_cuda_graphs(run: Run, found: dict[str, Any]) -> None:
    import torch

    from genaug.client import Client
    from genaug.service.pipeline.acceleration import AccelerationError
    from genaug.service.pipeline.acceleration_options import AccelerationOptions

    try:
        AccelerationOptions(compile="regional", compile_mode="reduce-overhead")
        raise AssertionError("regional compile with CUDA graphs was not refused")
    except AccelerationError as exc:
        assert "\n" not in str(exc) and "GENAUG_COMPILE=unet" in str(exc), exc
    fp8 = (run.device.type == "cuda"
           and torch.cuda.get_device_capability(run.device) >= (8, 9))
    found["fp8"] = fp8
    torch._dynamo.reset()
    model = run.build()
    settings: dict[str, Any] = dict(compile="unet", compile_mode="reduce-overhead",
                                    max_batch_images=1)
    if fp8:
        settings["quantize"] = "fp8"
    started = time.perf_counter()
    with served(run, model, **settings) as live, Client(live.url, timeout=900) as client:
        found["ready_s"] = round(time.perf_counter() - started, 1)
        speed = client.info()["acceleration"]
        marked = model.pipeline.unet.forward
        calls = marked.calls
        images = [client.generate(PROMPT, n=1, seed=SEED + i, guidance=5.0,
                                  timeout_s=900).images[0] for i in range(2)]
        found.update(quantized_layers=speed["quantized_layers"],
                     batch_sizes=speed["batch_sizes"],
                     marked_steps=marked.calls - calls,
                     recompiles=live.metric("genaug_recompiles_total"))
    assert not_blank(images), "a blank image with FP8 and CUDA graphs"
    assert found["recompiles"] == 0, found
    assert found["marked_steps"] == 2 * STEPS, found  # one marked step per UNet call
    if fp8:
        assert found["quantized_layers"] > 0, found
    del model
    torch._dynamo.reset()
    release(run)


CHECKS: dict[str, Callable[[Run, dict[str, Any]], None]] = {
    "http": check_http,
    "nan_guard": check_nan_guard,
    "judge": check_judge,
    "adapt": check_adapt,
    "adapters": check_adapters,
    "fp8_cuda_graphs": check_fp8_cuda_graphs,
}


def run_checks(args: argparse.Namespace) -> list[Check]:
    import torch

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
    else:
        device, dtype = torch.device("cuda"), torch.bfloat16
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CHECKS)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="genaug-acceptance-") as tmp:
        run = Run(args, device, dtype, Path(tmp), deadline=started + args.budget_s)
        for name in names:
            check = Check(name)
            run.checks.append(check)
            if time.monotonic() > run.deadline:
                check.skipped = f"past --budget-s {args.budget_s:g}"
            else:
                t0 = time.perf_counter()
                try:
                    CHECKS[name](run, check.found)
                    check.ok = True
                except Exception as exc:  # recorded; the other checks still run
                    check.error = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                check.seconds = round(time.perf_counter() - t0, 2)
            print(f"{name:16s} {'ok' if check.ok else 'SKIPPED' if check.skipped else 'FAILED'}"
                  f" {check.seconds:7.1f} s  {check.error or check.skipped or check.found}",
                  flush=True)
            run.save()
    return run.checks


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The plan's checks; exits 1 (after printing and saving every check) when one failed or
    was skipped, so the GPU command's status says whether the paths work."""
    args = parse_args(argv)
    checks = run_checks(args)
    passed = sum(c.ok for c in checks)
    print(f"acceptance: {passed}/{len(checks)} checks passed", flush=True)
    if passed != len(checks):
        raise SystemExit(1)
    return {"passed": passed, "checks": [asdict(c) for c in checks]}


if __name__ == "__main__":
    main(run)
