"""Fetch the wheels a GPU box without a package index lacks, so the service runs there:
``.whl/`` (ignored).

An air-gapped GPU node often has Python, a CUDA torch and many packages (an NGC-style PyTorch
image), but not diffusers, FastAPI, uvicorn or pydantic, and it cannot reach PyPI. Run this on a
connected machine with the same checkout and genaug[service,fp8] installed; it works out what
to copy and downloads it here:

- start from genaug's ``service`` and ``fp8`` extras (read from ``pyproject.toml``,
  ``client`` included; ``fp8`` brings torchao, for ``GENAUG_QUANTIZE=fp8``);
- close over each package's ``Requires-Dist`` (markers evaluated for the box's CPython,
  ``--python``, 3.12 by default, on Linux x86_64);
- drop what the box already has: ``--present FILE`` (its ``pip freeze``), else
  :data:`PRESENT`, the packages of a typical CUDA PyTorch image; and torch always (the box's
  CUDA build is the one to use), except ``FORCE`` (typing-extensions: pydantic needs a recent
  one);
- pin each to the version installed in this environment (what the tests ran with) and
  ``pip download`` the manylinux x86_64 wheel for that Python (or the pure-Python one).

Usage, from the repository root::

    ssh gpu-box pip freeze > box.txt                         # what the box has
    python -m bench.gpu.gpu_wheels --present box.txt         # -> .whl/*.whl (git-ignored)
    python -m bench.gpu.gpu_wheels --present box.txt --dry-run   # list what would be fetched

Then copy the checkout with ``.whl/`` to the box and run the benchmarks there::

    bash bench/gpu/gpu_run.sh                   # first plan: baseline and best at batch 1 and 8
    bash bench/gpu/gpu_run.sh --plan sizes      # then batch 4 and 16
    bash bench/gpu/gpu_run.sh --plan options    # then each option alone at batch 8

``bench/gpu/gpu_run.sh`` installs the wheels into ``/tmp/genaug-site`` and puts genaug on the
path from the working tree (no build). A GPU machine that reaches PyPI needs none of this:
``pip install -e '.[service,fp8]'`` there, and ``gpu_run.sh`` runs in that environment.

Beside them, in a folder of its own that ``gpu_run.sh`` does not install (:data:`SIDE_WHEELS`):
torchao 0.17, torchao's release for torch 2.11, which the FP8 diagnosis (``bash
bench/gpu/gpu_run.sh --plan fp8``, :mod:`bench.gpu.fp8_diagnose`) tries in a process of its own
against the 0.18 that the ``fp8`` extra pins.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement

from bench.harness import ROOT, finish, main, make_parser

WHEELS = ROOT / ".whl"
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
#: The packages of a typical CUDA PyTorch image (an H100/H200 node's, 2026-11-17): what a box
#: is assumed to have when no ``--present`` file says.
PRESENT = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp
""".split())
FORCE = frozenset({"typing-extensions"})
NEVER = frozenset({"torch", "genaug"})
#: Folder under .whl/ -> a pinned wheel fetched into it, beside the ones installed (pure
#: Python or abi3: the same wheel for CPython 3.12).
SIDE_WHEELS = {"torchao-0.17": "torchao==0.17.0"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def service_requirements() -> list[Requirement]:
    """genaug's ``service`` and ``fp8`` extras with ``genaug[...]`` expanded, from
    pyproject.toml."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    out: list[Requirement] = []
    todo, done = ["service", "fp8"], set()
    while todo:
        extra = todo.pop()
        done.add(extra)
        for text in extras[extra]:
            req = Requirement(text)
            if normalize(req.name) == "genaug":
                todo += [e for e in req.extras if e not in done]
            else:
                out.append(req)
    return out


def read_present(path: Path) -> frozenset[str]:
    """The projects a ``pip freeze`` (or ``pip list --format=freeze``) lists, normalised."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-")):
            names.add(normalize(re.split(r"[=<>!~ @;\[]", line, maxsplit=1)[0]))
    return frozenset(names)


def to_carry(present: frozenset[str] = PRESENT, python: str = PYTHON) -> dict[str, str]:
    """Project name -> version installed here, for everything the GPU box lacks."""
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64",
               implementation_name="cpython", platform_python_implementation="CPython")
    carry: dict[str, str] = {}
    todo = service_requirements()
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        if name in NEVER or name in carry or (name in present and name not in FORCE):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"{req.name} is not installed here; install genaug[service,fp8] first"
            ) from None
        carry[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            active = sub.marker is None or any(
                sub.marker.evaluate({**env, "extra": extra}) for extra in ("", *req.extras)
            )
            if active:
                todo.append(sub)
    return dict(sorted(carry.items()))


def exclude_wheels_from_git() -> None:
    path = subprocess.run(
        ["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.strip()
    exclude = (ROOT / path).resolve()
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if "/.whl/" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a") as fh:
            fh.write("/.whl/\n")


def download(carry: dict[str, str], python: str = PYTHON) -> list[Path]:
    if WHEELS.exists():
        shutil.rmtree(WHEELS)  # one version of each: two would stop the install there
    WHEELS.mkdir()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for name, version in carry.items():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
             *platforms, "-d", str(WHEELS), f"{name}=={version}"],
            check=True,
        )
    for folder, requirement in SIDE_WHEELS.items():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
             *platforms, "-d", str(WHEELS / folder), requirement],
            check=True,
        )
    return sorted(WHEELS.glob("*.whl"))


def side_wheels() -> list[Path]:
    """The wheels of :data:`SIDE_WHEELS` fetched into their folders."""
    return sorted(w for folder in SIDE_WHEELS for w in (WHEELS / folder).glob("*.whl"))


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser((__doc__ or "").split("\n\n")[0], quick=False, threads=False)
    parser.add_argument("--dry-run", action="store_true", help="only list what to fetch")
    parser.add_argument("--present", type=Path, default=None,
                        help="the GPU box's `pip freeze` (default: a typical CUDA PyTorch "
                             "image's packages)")
    parser.add_argument("--python", default=PYTHON,
                        help="the GPU box's Python, major.minor (default %(default)s)")
    args = parser.parse_args(argv)
    present = PRESENT if args.present is None else read_present(args.present)
    carry = to_carry(present, args.python)
    for name, version in carry.items():
        print(f"{name}=={version}")
    for folder, requirement in SIDE_WHEELS.items():
        print(f"{requirement} (.whl/{folder}/, not installed: the FP8 diagnosis tries it)")
    result: dict[str, Any] = {"benchmark": "gpu_wheels", "carry": carry,
                              "side": dict(SIDE_WHEELS)}
    if args.dry_run:
        return finish(result, args.json)
    exclude_wheels_from_git()
    wheels = download(carry, args.python)
    total = sum(w.stat().st_size for w in [*wheels, *side_wheels()])
    print(f"{len(wheels)} wheels (+{len(side_wheels())} beside), {total / 2**20:.1f} MiB in "
          f"{WHEELS.relative_to(ROOT)}/")
    print("copy the checkout with .whl/ to the GPU box, then there: bash bench/gpu/gpu_run.sh")
    result.update(wheels=[w.name for w in wheels],
                  side_wheels=[str(w.relative_to(WHEELS)) for w in side_wheels()], bytes=total)
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
