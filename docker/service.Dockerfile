# syntax=docker/dockerfile:1
#
# genaug generation service: one SDXL pipeline on one GPU.
#
# Build from the repository root (the context must hold pyproject.toml and the packages):
#     docker build -f docker/service.Dockerfile -t genaug-service:0.1.0 .
#
# torch policy. The base image ships a CUDA build of torch, 2.13.0+cu128. CI pins
# torch==2.13.0 in constraints/cpu.txt and gets the CPU wheel from the PyTorch CPU index
# *by index URL*, not by the pin: the pin carries no local label (+cpu). PEP 440 ignores a
# candidate's local label when the specifier has none, so the installed 2.13.0+cu128
# satisfies torch==2.13.0 and pip leaves it alone. The image therefore uses the same
# constraints file as CI and never names the CPU index. TORCH_VERSION must equal the pin in
# constraints/cpu.txt (tests/docker/test_docker.py checks this; the build also asserts it below), or
# pip would replace the base image's torch with another wheel.
ARG TORCH_VERSION=2.13.0
ARG CUDA_FLAVOR=cuda12.8-cudnn9-runtime
FROM pytorch/pytorch:${TORCH_VERSION}-${CUDA_FLAVOR}

ARG TORCH_VERSION
ARG GENAUG_UID=10001

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    GENAUG_HOST=0.0.0.0 \
    GENAUG_DEVICE=cuda:0 \
    GENAUG_DTYPE=auto
# The pool's location is the deployment's choice, not the image's: GENAUG_POOL_PATH=/data/pool.db
# (compose, k8s deployment.yaml) or GENAUG_POOL_URL=postgresql://... for replicas; setting
# both is refused, so the image sets neither.

WORKDIR /opt/genaug/src
COPY pyproject.toml ./
COPY constraints/ ./constraints/
COPY genaug/ ./genaug/
COPY service/ ./service/
COPY client/ ./client/
COPY feeding/ ./feeding/
COPY trainer/ ./trainer/
COPY torchfeed/ ./torchfeed/
COPY recipes/ /opt/genaug/recipes/

# Same extras and constraints as CI (which installs -e .[dev] = [service] + test tools).
# The last check imports with -P: from this WORKDIR, the source folder genaug/ (which has no
# service/ inside: that mapping lives in the install) would hide the installed package.
# tests/docker/test_compose_install.py runs these steps in a fresh environment.
RUN python -m pip install -c constraints/cpu.txt ".[service]" \
 && python -c "import sys, torch; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '${TORCH_VERSION}' and torch.version.cuda else 'torch in the image is ' + torch.__version__ + ', expected ${TORCH_VERSION} with CUDA: keep TORCH_VERSION equal to the pin in constraints/cpu.txt')" \
 && python -P -c "import genaug.service, genaug.client"

# Non-root. /data and /compile-cache are the mount points of the pool's and the compile
# cache's volumes: a fresh named volume copies the directory's ownership, so the service can
# write pool.db and its compile cache entries there.
RUN useradd --uid ${GENAUG_UID} --user-group --create-home --shell /usr/sbin/nologin genaug \
 && mkdir -p /data /models /compile-cache \
 && chown genaug:genaug /data /compile-cache
USER genaug
WORKDIR /home/genaug
VOLUME ["/data", "/compile-cache"]

EXPOSE 8000

# Ready means the model is loaded and warm: until then /readyz answers 503 and urlopen raises.
# python, not curl: the base image is not guaranteed to ship curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]

CMD ["genaug", "serve", "--host", "0.0.0.0", "--port", "8000"]
