#!/usr/bin/env bash
# The one command for a lent GPU machine (the device tool), from the repository root:
#
#   python -m bench.gpu.gpu_wheels                   # here, once: the wheels it lacks -> .whl/
#   device run: command "bash bench/gpu/gpu_run.sh", carry [".whl"]
#   device run: command "bash bench/gpu/gpu_run.sh --plan sizes", carry [".whl"]
#   device run: command "bash bench/gpu/gpu_run.sh --plan options", carry [".whl"]
#   device run: command "bash bench/gpu/gpu_run.sh --plan fp8", carry [".whl"]   (FP8 diagnosis)
#   device run: command "bash bench/gpu/gpu_run.sh --plan speed", carry [".whl"]
#   device run: command "bash bench/gpu/gpu_run.sh --plan acceptance", carry [".whl"]
#
# `--plan acceptance` runs bench.gpu.acceptance (every user path at full size, a few steps
# each: acceptance.json, acceptance.log); any other arguments go to bench.gpu.gpu_sdxl.
# GPU_TESTS=1 first runs the gpu-marked tests (device
# pinning, bf16 and fp16, the NaN guard with an fp16 VAE, FP8 quantizing). What comes back
# under $OUT:
# env.txt (GPU, driver, versions), gpu_sdxl.log (the tables), gpu_sdxl.json (every figure,
# written after each cell, so a run cut short keeps what it measured), gpu_tests.log.
set -uo pipefail
OUT="${OUT:-/tmp/genaug-out}"
SITE="${GENAUG_SITE:-/tmp/genaug-site}"  # where the wheels and genaug are installed
mkdir -p "$OUT"

# The carried wheels, then genaug itself straight from the working tree (pyproject's
# package-dir mapping: genaug/, genaug.service = service/, ...), with no build step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || { echo "gpu_run: installing .whl/ failed" >&2; exit 1; }
# The whole genaug/ package (cli.py, jobs.py, experiments/, data files), then the mapped folders.
rm -rf "$SITE/genaug" && mkdir -p "$SITE/genaug"
cp -R genaug/. "$SITE/genaug/"
find "$SITE/genaug" -name __pycache__ -prune -exec rm -rf {} +
for part in service client trainer; do ln -s "$PWD/$part" "$SITE/genaug/$part"; done
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
        --format=csv
    echo "cpus: $(nproc)"
    # -P: the checkout's own genaug/ (which holds no service/) must not shadow $SITE/genaug.
    python3 -P - <<'PY'
import importlib.metadata as m
import sys

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
for name in ("diffusers", "transformers", "fastapi", "uvicorn", "pydantic", "httpx"):
    print(name, m.version(name))
import genaug.service.app  # noqa: F401  (the service imports with what was carried)
PY
} 2>&1 | tee "$OUT/env.txt"

if [ "${GPU_TESTS:-0}" = 1 ]; then
    python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/service/pipeline/test_worker.py \
        tests/service/pipeline/test_model_load.py tests/service/pipeline/test_adapters.py \
        tests/service/pipeline/test_quantize.py 2>&1 | tee "$OUT/gpu_tests.log"
fi
# -P and the checkout last on the path: bench from the working tree, genaug from $SITE.
if [ "${1:-}" = "--plan" ] && [ "${2:-}" = "acceptance" ]; then
    shift 2
    PYTHONPATH="$SITE:$PWD" python3 -P -m bench.gpu.acceptance --json "$OUT/acceptance.json" \
        "$@" 2>&1 | tee "$OUT/acceptance.log"
    exit "${PIPESTATUS[0]}"
fi
# --plan fp8: the FP8 diagnosis (bench/gpu/fp8_diagnose.py, 2-3 minutes on an H100) instead.
if [ "${1:-}" = "--plan" ] && [ "${2:-}" = "fp8" ]; then
    shift 2
    PYTHONPATH="$SITE:$PWD" python3 -P -m bench.gpu.fp8_diagnose --json "$OUT/fp8_diagnose.json" \
        "$@" 2>&1 | tee "$OUT/fp8_diagnose.log"
    exit "${PIPESTATUS[0]}"
fi
PYTHONPATH="$SITE:$PWD" python3 -P -m bench.gpu.gpu_sdxl --json "$OUT/gpu_sdxl.json" "$@" 2>&1 \
    | tee "$OUT/gpu_sdxl.log"
