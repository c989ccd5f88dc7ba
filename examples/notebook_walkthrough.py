# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # genaug from a notebook
#
# A walkthrough of the synchronous client against a running genaug service: connect, see
# what model it runs, generate a grid and look at it, sample a recipe's pool, save images.
#
# Open this file in Jupyter (jupytext) or VS Code and run the cells in order, or run it as a
# script: `python examples/notebook_walkthrough.py [URL] [OUT_DIR]`. Each cell defines one
# step as a small function and runs it; the test suite calls `main(url, out_dir)`, which runs
# the same steps, so this file cannot drift from the API.
#
# Start a service first, in a terminal: `genaug serve` (the tiny CPU model, port 8000), or
# `genaug serve --recipes recipes/wound_phases.yaml` to also have a recipe pool to sample.
# `pip install 'genaug[client]'` is enough on the notebook side (Pillow to save PNGs).

# %%
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from genaug.client import AuthenticationError, Client, SampleResult, TransportError

URL = os.environ.get("GENAUG_URL", "http://127.0.0.1:8000")
OUT_DIR = Path("genaug-walkthrough")


# %% [markdown]
# ## 1. Connect
# `client_id` names this notebook in the service's fairness and in `GET /v1/clients` (the
# status page at the service's `/` shows it too). With API keys, pass `api_key=` or set
# `GENAUG_API_KEY`.

# %%
def connect(url: str = URL, *, timeout: float = 60.0) -> Client:
    client = Client(url, client_id="notebook-walkthrough")
    try:
        client.wait_ready(timeout=timeout)  # the model may still be loading
    except Exception:
        client.close()
        raise
    return client


# %% [markdown]
# ## 2. What is running
# The weights hash identifies the model exactly; keep it next to any images you save.

# %%
def describe(client: Client) -> dict[str, Any]:
    info = client.info()
    model = info["model"] or {}
    limits = info["limits"]
    print(f"genaug {info['version']} on {info['device']['name']} ({model.get('dtype')}), "
          f"ready={info['ready']}")
    print(f"model: {model.get('kind')} from {model.get('source')}, "
          f"weights {model.get('hash')}, scheduler {info['acceleration'].get('scheduler')}")
    print(f"defaults: {limits['default_size']} px, {limits['default_steps']} steps; "
          f"at most {limits['max_n']} images per request")
    return info


# %% [markdown]
# ## 3. Generate a grid and look at it
# `generate_png` returns one PNG (a grid when `n > 1`); `generate` returns the pixels as a
# numpy array with the seeds that reproduce them.

# %%
def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show_png(png: bytes, path: Path) -> Path:
    """Display inline in IPython/Jupyter; always save to ``path`` as well."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    if in_notebook():
        from IPython.display import Image, display

        display(Image(data=png))
    else:
        print(f"saved {path}")
    return path


def generate_grid(client: Client, out_dir: Path) -> tuple[Path, np.ndarray]:
    prompt = "depth image of a healing wound, top-down view"
    png = client.generate_png(prompt, n=4, seed=0)
    path = show_png(png, out_dir / "grid.png")
    result = client.generate(prompt, n=4, seed=0)  # same seeds: the same images, as arrays
    print(f"images {result.images.shape} {result.images.dtype}, seeds {result.seeds.tolist()}")
    return path, result.images


# %% [markdown]
# ## 4. Sample from a recipe's pool
# Recipes are named, labelled prompt sets the service pre-generates while idle. `sample`
# returns at once with what the pool holds (`wait_s` lets it generate the rest).

# %%
def sample_recipe(client: Client, *, n: int = 6, wait_s: float = 30.0) -> SampleResult | None:
    recipes = client.recipes()
    if not recipes:
        print("this service has no recipes (start it with --recipes FILE to get some)")
        return None
    recipe = recipes[0]
    print(f"recipe {recipe['name']!r}: labels {recipe['labels']}, fill {recipe['fill']}")
    batch = client.sample(recipe["name"], n=n, wait_s=wait_s)
    names = [batch.label_names[i] for i in batch.labels]
    print(f"sampled {len(batch)} of {n}: labels {names}")
    return batch


# %% [markdown]
# ## 5. Save to disk
# One folder per label, one file per image named by its seed (re-generating that seed with
# the same model hash gives the same image).

# %%
def save_images(batch: SampleResult, out_dir: Path) -> list[Path]:
    try:
        from PIL import Image
    except ImportError:
        path = out_dir / f"{batch.recipe}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, images=batch.images, labels=batch.labels, seeds=batch.seeds)
        print(f"saved {path} (pip install pillow for one PNG per image)")
        return [path]
    paths = []
    for image, label, seed in zip(batch.images, batch.labels, batch.seeds, strict=True):
        path = out_dir / batch.recipe / batch.label_names[int(label)] / f"{int(seed)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
        paths.append(path)
    print(f"saved {len(paths)} images under {out_dir / batch.recipe}")
    return paths


# %% [markdown]
# ## Run every step
# In a notebook, run this cell; as a script, `main()` runs. When the service is not running
# or wants a key, the error says what to do (`genaug serve`, `GENAUG_API_KEY`).

# %%
def main(url: str = URL, out_dir: str | Path = OUT_DIR) -> dict[str, Any]:
    """Run the walkthrough against ``url``, writing into ``out_dir``; returns what it made."""
    out = Path(out_dir)
    with connect(url) as client:
        info = describe(client)
        grid_path, images = generate_grid(client, out)
        batch = sample_recipe(client)
        saved = save_images(batch, out) if batch is not None and len(batch) else []
    return {"info": info, "grid": grid_path, "images": images, "sample": batch, "saved": saved}


if __name__ == "__main__":
    # A notebook kernel's argv is its own (-f kernel.json), not ours.
    args = [] if in_notebook() else sys.argv[1:]
    try:
        result = main(args[0] if args else URL, args[1] if len(args) > 1 else OUT_DIR)
    except (TransportError, AuthenticationError) as exc:
        if in_notebook():
            raise
        sys.exit(f"genaug: {exc}")
    except KeyboardInterrupt:  # Ctrl-C: one line, exit status 130 (a kernel shows its own)
        if in_notebook():
            raise
        print("genaug: interrupted; the images saved so far are kept", file=sys.stderr)
        sys.exit(130)
