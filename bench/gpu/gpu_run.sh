#!/usr/bin/env bash
# The GPU benchmarks on your own GPU machine, from the repository root; outputs under $OUT
# (default /tmp/genaug-out):
#
#   bash bench/gpu/gpu_run.sh                       # baseline and best at batch 1 and 8
#   bash bench/gpu/gpu_run.sh --plan sizes          # batch 4 and 16
#   bash bench/gpu/gpu_run.sh --plan options        # each acceleration option alone at batch 8
#   bash bench/gpu/gpu_run.sh --plan fp8            # the FP8 diagnosis
#   bash bench/gpu/gpu_run.sh --plan speed          # the speed goal's configurations and
#                                                   # speed turbo (a turbo LoRA, batch 16)
#   bash bench/gpu/gpu_run.sh --plan acceptance     # every user path at full size
#
# Where genaug[service,fp8] is installed (pip install -e '.[service,fp8]' with your CUDA
# torch), the scripts run in that environment. A GPU box that cannot reach a package index
# (an air-gapped cluster node) gets what it lacks from a connected machine: there,
# `python -m bench.gpu.gpu_wheels --present box-freeze.txt` (the box's `pip freeze`) fetches
# it into .whl/; copy the checkout with .whl/ to the box and run the same commands: the
# wheels are installed into $GENAUG_SITE (default /tmp/genaug-site) and genaug is put on the
# path from the working tree, with no build step.
#
# `--plan acceptance` runs bench.gpu.acceptance (every user path at full size, a few steps
# each: acceptance.json, acceptance.log); any other arguments go to bench.gpu.gpu_sdxl.
# GPU_TESTS=1 first runs the gpu-marked tests (device
# pinning, bf16 and fp16, the NaN guard with an fp16 VAE, FP8 quantizing). What it writes
# under $OUT:
# env.txt (GPU, driver, versions), gpu_sdxl.log (the tables), gpu_sdxl.json (every figure,
# written after each cell, so a run cut short keeps what it measured), gpu_tests.log.
set -uo pipefail
OUT="${OUT:-/tmp/genaug-out}"
SITE="${GENAUG_SITE:-/tmp/genaug-site}"  # where the wheels and genaug are installed
WHEELS="${GENAUG_WHEELS:-.whl}"          # what gpu_wheels fetched (an offline box)
mkdir -p "$OUT"

if compgen -G "$WHEELS/*.whl" > /dev/null; then
    # The wheels gpu_wheels fetched, then genaug itself straight from the working tree
    # (pyproject's package-dir mapping: genaug/, genaug.service = service/, ...), no build.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl || { echo "gpu_run: installing $WHEELS/ failed" >&2
                                              exit 1; }
    # The whole genaug/ package (cli.py, jobs.py, experiments/, data files), then the mapped
    # folders.
    rm -rf "$SITE/genaug" && mkdir -p "$SITE/genaug"
    cp -R genaug/. "$SITE/genaug/"
    find "$SITE/genaug" -name __pycache__ -prune -exec rm -rf {} +
    for part in service client trainer; do ln -s "$PWD/$part" "$SITE/genaug/$part"; done
    export PYTHONPATH="$SITE"
else
    # No wheels: the environment's own genaug (pip install -e '.[service,fp8]').
    export PYTHONPATH=""
    python3 -P -c "import genaug.service.app" 2>/dev/null || {
        echo "gpu_run: genaug[service,fp8] is not installed here and $WHEELS/ holds no" \
             "wheels: pip install -e '.[service,fp8]' (with your CUDA torch), or fetch" \
             "them with python -m bench.gpu.gpu_wheels on a machine that reaches PyPI" >&2
        exit 2; }
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# What the services of one plan compiled, kept for the next plan on this machine (an ignored
# folder of the tree: .cache/ is git-ignored): the acceptance plan's entries serve the speed
# plan's services that share their model, options and shapes.
export GENAUG_COMPILE_CACHE="${GENAUG_COMPILE_CACHE:-$PWD/.cache/genaug-compile}"

# A benchmark module of the checkout (bench/ is not installed), with genaug as installed: a
# folder holding only a link to bench/ goes on the path (-P: not the checkout itself, whose
# genaug/ folder, with no service/ in it, would shadow the installed package).
BENCH_PATH="$(mktemp -d)"
ln -s "$PWD/bench" "$BENCH_PATH/bench"
run_bench() {
    local module="$1"
    shift
    PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$BENCH_PATH" python3 -P -m "$module" "$@"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
        --format=csv
    echo "cpus: $(nproc)"
    python3 -P - <<'PY'
import importlib.metadata as m
import sys

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
for name in ("diffusers", "transformers", "fastapi", "uvicorn", "pydantic", "httpx"):
    print(name, m.version(name))
import genaug.service.app  # noqa: F401  (the service imports with what is installed)
PY
} 2>&1 | tee "$OUT/env.txt"

if [ "${GPU_TESTS:-0}" = 1 ]; then
    python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/service/pipeline/test_worker.py \
        tests/service/pipeline/test_model_load.py tests/service/pipeline/test_adapters.py \
        tests/service/pipeline/test_quantize.py 2>&1 | tee "$OUT/gpu_tests.log"
fi
if [ "${1:-}" = "--plan" ] && [ "${2:-}" = "acceptance" ]; then
    shift 2
    run_bench bench.gpu.acceptance --json "$OUT/acceptance.json" "$@" 2>&1 \
        | tee "$OUT/acceptance.log"
    exit "${PIPESTATUS[0]}"
fi
# --plan fp8: the FP8 diagnosis (bench/gpu/fp8_diagnose.py, 2-3 minutes on an H100) instead.
if [ "${1:-}" = "--plan" ] && [ "${2:-}" = "fp8" ]; then
    shift 2
    run_bench bench.gpu.fp8_diagnose --json "$OUT/fp8_diagnose.json" "$@" 2>&1 \
        | tee "$OUT/fp8_diagnose.log"
    exit "${PIPESTATUS[0]}"
fi
run_bench bench.gpu.gpu_sdxl --json "$OUT/gpu_sdxl.json" "$@" 2>&1 | tee "$OUT/gpu_sdxl.log"
exit "${PIPESTATUS[0]}"
