"""Train the tiny SDXL-architecture pipeline on a labelled image folder (not a service feature).

This is how genaug's embedded default generator (``tiny-digits``) was made, and how to remake
it: the same architecture as
:func:`genaug.service.pipeline.tiny.build_tiny_pipeline`, trained from a fixed seed in two
phases on the CPU:

1. **VAE** (AutoencoderKL): reconstruction MSE on ``[-1, 1]`` pixels plus a small KL term.
   Afterwards every training image is encoded once (posterior mean and std kept), and the VAE's
   ``scaling_factor`` is set so the scaled latents have unit standard deviation.
2. **UNet and both text encoders, jointly**: the epsilon-prediction loss of SDXL's noise
   schedule (scaled-linear betas, 1,000 steps), conditioned exactly as
   ``StableDiffusionXLPipeline`` conditions at inference (``encode_prompt``: penultimate
   hidden states of both encoders concatenated, text_encoder_2's pooled projection, the six
   ``text_time`` micro-conditioning numbers). Training the text encoders is what makes the
   class unmistakable: through frozen random encoders, word prompts that differ in one word
   stay too similar. A share of the examples (``--uncond-p``) gets the all-zero conditioning
   that the pipeline uses for an empty negative prompt, so classifier-free guidance works.

Data: ``DATA/<label>/*.png`` (any size; resized to 64x64 RGB) and a recipe file whose recipe
names the labels and their prompts (``recipes/digits.yaml``); every label trained on must
have a folder. To write scikit-learn's digits as such folders: ``python -m genaug.digits DIR``
(then ``DATA=DIR/generator``). ``--labels 0-4`` (or ``0,1,2,3,4``) trains on those of the
recipe's labels only (the other folders are not read): that is how ``tiny-digits-base``, a
stand-in for a foundation model that never saw the target classes, was made. Its text encoders
still take every prompt (the byte-level tokenizer is shared); the record names the labels it
was trained on, and the evaluation also samples the recipe's other labels (``fidelity_unseen``).

Outputs in ``OUT``:

* ``pipeline/``: a diffusers folder (``save_pretrained``, safetensors) with the record as
  ``trained_on.json``: ``genaug serve --model OUT/pipeline --default-size 64
  --default-steps 20 --default-guidance 3`` (a folder gets SDXL's defaults otherwise);
* ``unet.safetensors``: the UNet alone: ``genaug serve --model tiny-random --unet-weights
  OUT/unet.safetensors`` loads it over the (same-architecture) base;
* ``tiny_digits.safetensors`` (``NAME.safetensors`` with ``--name NAME``): every component in
  one file (keys prefixed ``unet.``, ``vae.``, ``text_encoder.``, ``text_encoder_2.``; the VAE
  scaling factor and the training record in the header): the embedded models' package-data
  format;
* ``trained_on.json``: data set, split, labels, steps, seed, script version, losses, time,
  fidelity;
* ``samples.png``: a grid of generated images per label (when ``--eval-per-label`` > 0).

``--install`` also copies the single file and the record (as ``NAME.json``) into
``service/weights/``, the package data the service loads for ``tiny-digits``
(``--name tiny_digits``, the default) and ``tiny-digits-base`` (``--name tiny_digits_base``).

Reproduce the shipped default (about 10 minutes on 2 CPU cores; see docs/benchmarks.md)::

    python -m genaug.digits /tmp/digits
    nice -n 10 python tools/train_tiny_generator.py --data /tmp/digits/generator \\
        --recipes recipes/digits.yaml --out /tmp/tiny-digits --install

and ``tiny-digits-base`` (digits 0-4 only)::

    nice -n 10 python tools/train_tiny_generator.py --data /tmp/digits/generator \\
        --recipes recipes/digits.yaml --labels 0-4 --name tiny_digits_base \\
        --out /tmp/tiny-digits-base --install
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# On a shared CPU, OpenMP threads that spin while waiting for a descheduled sibling burn
# several times the useful work (measured: 4.6 vs 0.43 CPU-s per UNet step with 2 threads).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SCRIPT_VERSION = "2"  # 2: --labels, --name, fidelity of unseen labels (weights unchanged)
ROOT = Path(__file__).resolve().parents[1]
PACKAGE_WEIGHTS = ROOT / "service" / "weights"
IMAGE_SIZE = 64
ADD_TIME_IDS = (IMAGE_SIZE, IMAGE_SIZE, 0, 0, IMAGE_SIZE, IMAGE_SIZE)  # as the pipeline sends

log = logging.getLogger("train_tiny_generator")


@dataclass
class Config:
    """One training run; every field is a flag (``--vae-steps`` ...)."""

    data: Path
    recipes: Path
    out: Path
    recipe: str | None = None
    labels: str | None = None
    name: str = "tiny_digits"
    dataset: str = "sklearn load_digits"
    split: str = "generator"
    seed: int = 0
    threads: int = 2
    vae_steps: int = 400
    vae_batch: int = 64
    vae_lr: float = 2e-3
    kl_weight: float = 1e-5
    unet_steps: int = 2000
    unet_batch: int = 128
    unet_lr: float = 2e-3
    text_lr: float = 1e-3
    uncond_p: float = 0.1
    ema: float = 0.995
    eval_per_label: int = 20
    eval_steps: int | None = None
    eval_guidance: float | None = None
    install: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def read_folder(data: Path, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``data/<label>/*.png`` for each label -> uint8 [N, 64, 64, 3], int64 [N] (label index)."""
    from PIL import Image

    images: list[np.ndarray] = []
    targets: list[int] = []
    for index, label in enumerate(labels):
        folder = data / label
        files = sorted(p for p in folder.glob("*") if p.suffix.lower() in {".png", ".jpg", ".jpeg"})
        if not files:
            raise SystemExit(
                f"train_tiny_generator: no images in {folder}; the recipe's label {label!r} "
                f"needs a folder DATA/{label}/ with images (python -m genaug.digits DIR writes "
                "the digits)"
            )
        for path in files:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
                images.append(np.asarray(rgb, dtype=np.uint8))
            targets.append(index)
    return np.stack(images), np.asarray(targets, dtype=np.int64)


def parse_labels(spec: str | None, available: list[str]) -> list[str]:
    """``--labels``: ``"0-4"``, ``"0,1,2,3,4"`` or a mix (``"0-2,7"``) -> those of the recipe's
    labels, in the recipe's order; ``None``: all of them. A range needs integer labels."""
    if spec is None:
        return list(available)
    wanted: set[str] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if sep and lo.strip().isdigit() and hi.strip().isdigit():
            first, last = int(lo), int(hi)
            if first > last:
                raise SystemExit(f"train_tiny_generator: empty label range {part!r}")
            wanted.update(str(v) for v in range(first, last + 1))
        else:
            wanted.add(part)
    unknown = sorted(wanted - set(available))
    if unknown or not wanted:
        raise SystemExit(f"train_tiny_generator: --labels {spec!r}: the recipe has no labels "
                         f"{unknown}; it has {available}")
    return [label for label in available if label in wanted]


def read_recipe(path: Path, name: str | None) -> tuple[str, Any]:
    from genaug.service.recipes.load import load_recipes

    recipes = load_recipes(path)
    if name is None:
        if len(recipes) != 1:
            raise SystemExit(f"{path} holds recipes {sorted(recipes)}; choose one with --recipe")
        name = next(iter(recipes))
    if name not in recipes:
        raise SystemExit(f"{path} has no recipe {name!r}; it has {sorted(recipes)}")
    return name, recipes[name]


def train_vae(vae: Any, pixels: Any, cfg: Config, gen: Any) -> dict[str, float]:
    """Phase 1: reconstruction + KL on [-1, 1] pixels. Returns the final losses."""
    import torch

    vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.vae_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=cfg.vae_lr, total_steps=max(cfg.vae_steps, 1), pct_start=0.1
    )
    n = len(pixels)
    recent: list[float] = []
    started = time.monotonic()
    for step in range(cfg.vae_steps):
        idx = torch.randint(0, n, (cfg.vae_batch,), generator=gen)
        x = pixels[idx]
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(
            posterior.mean.shape, generator=gen
        )
        recon = vae.decode(z).sample
        mse = torch.nn.functional.mse_loss(recon, x)
        kl = posterior.kl().mean() / x[0].numel()
        loss = mse + cfg.kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        recent = (recent + [mse.item()])[-20:]
        if step % 50 == 0 or step == cfg.vae_steps - 1:
            log.info("vae  step %4d/%d  mse %.5f  kl %.2f  (%.1f s)", step + 1, cfg.vae_steps,
                     mse.item(), kl.item(), time.monotonic() - started)
    vae.eval()
    return {"vae_mse": float(np.mean(recent)) if recent else float("nan"),
            "vae_s": time.monotonic() - started}


def encode_all(vae: Any, pixels: Any) -> tuple[Any, Any]:
    """Posterior mean and std of every image (unscaled latents)."""
    import torch

    means, stds = [], []
    with torch.no_grad():
        for chunk in torch.split(pixels, 256):
            dist = vae.encode(chunk).latent_dist
            means.append(dist.mean)
            stds.append(dist.std)
    return torch.cat(means), torch.cat(stds)


def train_unet(pipe: Any, latents: tuple[Any, Any], targets: Any, prompts: list[list[str]],
               cfg: Config, gen: Any) -> dict[str, float]:
    """Phase 2: UNet + both text encoders on the epsilon loss, label prompts as conditioning."""
    import torch

    unet, te1, te2 = pipe.unet, pipe.text_encoder, pipe.text_encoder_2
    mean, std = latents
    scale = float(pipe.vae.config.scaling_factor)
    alphas = pipe.scheduler.alphas_cumprod.to(torch.float32)
    n_train = len(alphas)
    flat_prompts = [p for group in prompts for p in group]
    # Which flat prompt row each label may use (a label with several prompts draws one).
    starts = np.cumsum([0] + [len(g) for g in prompts])
    for module in (unet, te1, te2):
        module.train()
    params = [
        {"params": list(unet.parameters()), "lr": cfg.unet_lr},
        {"params": list(te1.parameters()) + list(te2.parameters()), "lr": cfg.text_lr},
    ]
    opt = torch.optim.AdamW(params, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[cfg.unet_lr, cfg.text_lr], total_steps=max(cfg.unet_steps, 1), pct_start=0.05
    )
    trained = [p for group in params for p in group["params"]]
    ema = [p.detach().clone() for p in trained]
    time_ids = torch.tensor([ADD_TIME_IDS], dtype=torch.float32)
    n = len(targets)
    recent: list[float] = []
    started = time.monotonic()
    for step in range(cfg.unet_steps):
        idx = torch.randint(0, n, (cfg.unet_batch,), generator=gen)
        labels = targets[idx]
        z0 = (mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)) * scale
        t = torch.randint(0, n_train, (cfg.unet_batch,), generator=gen)
        noise = torch.randn(z0.shape, generator=gen)
        a = alphas[t].view(-1, 1, 1, 1)
        noisy = a.sqrt() * z0 + (1 - a).sqrt() * noise
        embeds, _, pooled, _ = pipe.encode_prompt(
            flat_prompts, device=torch.device("cpu"), num_images_per_prompt=1,
            do_classifier_free_guidance=False,
        )
        lo = torch.as_tensor(starts[:-1])[labels]
        count = torch.as_tensor(np.diff(starts))[labels]
        row = lo + (torch.rand(len(labels), generator=gen) * count).long()
        cond, pool = embeds[row], pooled[row]
        keep = (torch.rand(len(labels), generator=gen) >= cfg.uncond_p).float()
        cond = cond * keep.view(-1, 1, 1)
        pool = pool * keep.view(-1, 1)
        pred = unet(
            noisy, t, encoder_hidden_states=cond,
            added_cond_kwargs={"text_embeds": pool, "time_ids": time_ids.expand(len(t), -1)},
        ).sample
        loss = torch.nn.functional.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            decay = min(cfg.ema, (1 + step) / (10 + step))
            for e, p in zip(ema, trained, strict=True):
                e.mul_(decay).add_(p.detach(), alpha=1 - decay)
        recent = (recent + [loss.item()])[-50:]
        if step % 100 == 0 or step == cfg.unet_steps - 1:
            elapsed = time.monotonic() - started
            log.info("unet step %4d/%d  eps loss %.4f  (%.1f s, %.2f steps/s)", step + 1,
                     cfg.unet_steps, float(np.mean(recent)), elapsed,
                     (step + 1) / max(elapsed, 1e-9))
    with torch.no_grad():
        for e, p in zip(ema, trained, strict=True):
            p.copy_(e)
    for module in (unet, te1, te2):
        module.eval()
    elapsed = time.monotonic() - started
    return {"unet_eps_loss": float(np.mean(recent)) if recent else float("nan"),
            "unet_s": elapsed, "unet_steps_per_s": cfg.unet_steps / max(elapsed, 1e-9)}


def sample(pipe: Any, prompts: list[str], seeds: list[int], steps: int, guidance: float) -> Any:
    import torch

    out = []
    with torch.inference_mode():
        for i in range(0, len(prompts), 50):
            images = pipe(
                prompts[i:i + 50], num_inference_steps=steps, guidance_scale=guidance,
                height=IMAGE_SIZE, width=IMAGE_SIZE, output_type="np",
                generator=[torch.Generator().manual_seed(s) for s in seeds[i:i + 50]],
            ).images
            out.append((np.clip(images, 0, 1) * 255).round().astype(np.uint8))
    return np.concatenate(out)


def pack_state(pipe: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
        for key, value in getattr(pipe, name).state_dict().items():
            state[f"{name}.{key}"] = value.detach().contiguous().clone()
    return state


def run(cfg: Config) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    from genaug.service.pipeline.tiny import build_tiny_pipeline

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    recipe_name, recipe = read_recipe(cfg.recipes, cfg.recipe)
    all_labels = list(recipe.label_names)
    labels = parse_labels(cfg.labels, all_labels)
    prompts = [list(recipe.labels[label].prompts) for label in labels]
    images, targets_np = read_folder(cfg.data, labels)
    log.info("data: %d images in %d labels from %s; recipe %r", len(images), len(labels),
             cfg.data, recipe_name)
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    targets = torch.from_numpy(targets_np)

    load1 = os.getloadavg()[0]
    started = time.monotonic()
    cpu_started = time.process_time()
    pipe: Any = build_tiny_pipeline(seed=cfg.seed, batch_invariant=False)
    record: dict[str, Any] = {}
    record.update(train_vae(pipe.vae, pixels, cfg, gen))
    mean, std = encode_all(pipe.vae, pixels)
    scaling = float(1.0 / (mean + std * torch.randn(mean.shape, generator=gen)).std())
    pipe.vae.register_to_config(scaling_factor=scaling)
    log.info("vae scaling factor %.5f", scaling)
    record.update(train_unet(pipe, (mean, std), targets, prompts, cfg, gen))
    train_s = time.monotonic() - started
    cpu_s = time.process_time() - cpu_started
    load2 = os.getloadavg()[0]

    steps = cfg.eval_steps or recipe.steps
    guidance = cfg.eval_guidance if cfg.eval_guidance is not None else recipe.guidance
    trained_on = {
        "dataset": cfg.dataset,
        "split": cfg.split,
        "images": int(len(images)),
        "labels": {label: prompts[i] for i, label in enumerate(labels)},
        "recipe": recipe_name,
        "recipe_labels": len(all_labels),
        "vae_steps": cfg.vae_steps,
        "unet_steps": cfg.unet_steps,
        "batch": {"vae": cfg.vae_batch, "unet": cfg.unet_batch},
        "seed": cfg.seed,
        "script": "tools/train_tiny_generator.py",
        "script_version": SCRIPT_VERSION,
        "scaling_factor": scaling,
        "vae_mse": round(record["vae_mse"], 5),
        "unet_eps_loss": round(record["unet_eps_loss"], 4),
        "train_s": round(train_s, 1),
        "train_cpu_s": round(cpu_s, 1),
        "threads": cfg.threads,
        "load_average": [round(load1, 2), round(load2, 2)],
        "sample_steps": steps,
        "sample_guidance": guidance,
    }
    log.info("trained in %.1f s wall, %.1f CPU-s (vae %.1f s, unet %.1f s at %.2f steps/s); "
             "load average %.2f -> %.2f", train_s, cpu_s, record["vae_s"], record["unet_s"],
             record["unet_steps_per_s"], load1, load2)

    if cfg.eval_per_label > 0:
        trained_on.update(evaluate(pipe, recipe, all_labels, labels, cfg, steps, guidance))

    cfg.out.mkdir(parents=True, exist_ok=True)
    folder = cfg.out / "pipeline"
    if folder.exists():
        shutil.rmtree(folder)
    pipe.save_pretrained(str(folder), safe_serialization=True)
    save_file({k: v.detach().contiguous() for k, v in pipe.unet.state_dict().items()},
              str(cfg.out / "unet.safetensors"))
    meta = {"scaling_factor": repr(scaling), "trained_on": json.dumps(trained_on, sort_keys=True)}
    packed = cfg.name + ".safetensors"
    save_file(pack_state(pipe), str(cfg.out / packed), metadata=meta)
    text = json.dumps(trained_on, indent=2, sort_keys=True) + "\n"
    (cfg.out / "trained_on.json").write_text(text)
    (folder / "trained_on.json").write_text(text)
    if cfg.install:
        PACKAGE_WEIGHTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cfg.out / packed, PACKAGE_WEIGHTS / packed)
        shutil.copyfile(cfg.out / "trained_on.json", PACKAGE_WEIGHTS / (cfg.name + ".json"))
        log.info("installed into %s", PACKAGE_WEIGHTS)
    log.info("wrote %s (pipeline/, unet.safetensors, %s, trained_on.json)", cfg.out, packed)
    return trained_on


def evaluate(pipe: Any, recipe: Any, all_labels: list[str], labels: list[str], cfg: Config,
             steps: int, guidance: float) -> dict[str, Any]:
    """Sample ``--eval-per-label`` images of every recipe label (seeds 10000+, in recipe order)
    and, for the digits, score them with :func:`genaug.digits.fidelity`: ``fidelity`` over the
    labels trained on, ``fidelity_unseen`` over the recipe's other labels (``--labels``)."""
    per = cfg.eval_per_label
    eval_prompts = [recipe.labels[label].prompts[0] for label in all_labels for _ in range(per)]
    seeds = [10_000 + k for k in range(len(eval_prompts))]
    t0 = time.monotonic()
    generated = sample(pipe, eval_prompts, seeds, steps, guidance)
    log.info("sampled %d images in %.1f s", len(generated), time.monotonic() - t0)
    cfg.out.mkdir(parents=True, exist_ok=True)
    _grid(generated, per, cfg.out / "samples.png")
    try:
        from genaug.digits import LABELS, fidelity_classifier, to_digits8
    except ImportError:
        return {}
    if not set(all_labels) <= set(LABELS):
        return {}
    asked = np.asarray([int(label) for label in all_labels for _ in range(per)])
    predicted = fidelity_classifier().predict(to_digits8(generated))
    hits = predicted == asked
    result: dict[str, Any] = {}
    per_label = {label: round(float(hits[i * per:(i + 1) * per].mean()), 4)
                 for i, label in enumerate(all_labels)}
    for key, group in (("fidelity", labels),
                       ("fidelity_unseen", [x for x in all_labels if x not in labels])):
        if not group:
            continue
        mask = np.isin(asked, [int(x) for x in group])
        share = float(hits[mask].mean())
        result[key] = {"share": round(share, 4), "images": int(mask.sum()), "steps": steps,
                       "guidance": guidance, "labels": group,
                       "per_label": {x: per_label[x] for x in group}}
        log.info("%s: %.1f %% of %d images (labels %s) labelled as asked (steps %d, "
                 "guidance %g)", key, 100 * share, int(mask.sum()), ",".join(group), steps,
                 guidance)
    return result


def _grid(images: np.ndarray, per: int, out: Path) -> None:
    """The first 10 images of each label, one row per label (the service's PNG grid)."""
    from genaug.wire import encode_png_grid

    cols = min(per, 10)
    first = images.reshape(-1, per, *images.shape[1:])[:, :cols]
    out.write_bytes(encode_png_grid(first.reshape(-1, *images.shape[1:]), columns=cols))


def parse(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="DATA/<label>/*.png")
    parser.add_argument("--recipes", type=Path, required=True, help="recipe file (labels, prompts)")
    parser.add_argument("--recipe", default=None, help="recipe name (when the file has several)")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    defaults = Config(data=Path(), recipes=Path(), out=Path())
    parser.add_argument("--labels", default=None,
                        help="train on these of the recipe's labels only, e.g. 0-4 or 0,1,2,3,4 "
                             "(default: all)")
    parser.add_argument("--name", default="tiny_digits",
                        help="file name of the single-file output and of --install's copies "
                             "(NAME.safetensors, NAME.json; default tiny_digits)")
    for name in ("dataset", "split", "seed", "threads", "vae_steps", "vae_batch", "vae_lr",
                 "kl_weight", "unet_steps", "unet_batch", "unet_lr", "text_lr", "uncond_p", "ema",
                 "eval_per_label", "eval_steps", "eval_guidance"):
        value = getattr(defaults, name)
        kind = type(value) if value is not None else (int if name == "eval_steps" else float)
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=value,
                            help=f"default {value}")
    parser.add_argument("--install", action="store_true",
                        help="copy the single file and trained_on.json into service/weights/")
    args = parser.parse_args(argv)
    return Config(**vars(args))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    cfg = parse(argv)
    record = run(cfg)
    keys = ("train_s", "unet_eps_loss", "vae_mse", "fidelity", "fidelity_unseen")
    sys.stdout.write(json.dumps({k: record[k] for k in keys if k in record}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
