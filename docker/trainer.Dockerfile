# syntax=docker/dockerfile:1
#
# genaug reference trainer: TensorFlow on the GPUs the generator does not use. It never imports
# torch; it reaches the generator over HTTP (GENAUG_URL, GENAUG_API_KEY).
#
# Build from the repository root:
#     docker build -f docker/trainer.Dockerfile -t genaug-trainer:0.1.0 .
#
# The base image ships tensorflow 2.21.0 with CUDA; genaug[trainer] asks for tensorflow>=2.16,
# already satisfied, so pip keeps the base image's GPU build. constraints/cpu.txt pins only
# torch, which [trainer] does not install: passing it keeps the install identical to CI's.
ARG TF_VERSION=2.21.0
FROM tensorflow/tensorflow:${TF_VERSION}-gpu

ARG TF_VERSION
ARG GENAUG_UID=10001

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=1

WORKDIR /opt/genaug/src
COPY pyproject.toml ./
COPY constraints/ ./constraints/
COPY genaug/ ./genaug/
COPY service/ ./service/
COPY client/ ./client/
COPY feeding/ ./feeding/
COPY trainer/ ./trainer/
COPY torchfeed/ ./torchfeed/

# PIP_BREAK_SYSTEM_PACKAGES: the base image's Python is the system Python; installing into it
# is the point (it holds the GPU tensorflow), and the container is the isolation. The import
# check runs with -P: from this WORKDIR the source folder genaug/ would hide the install.
RUN python3 -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'genaug needs Python >= 3.11, base image has ' + sys.version)" \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -c constraints/cpu.txt ".[trainer]" \
 && python3 -c "import sys, tensorflow as tf; sys.exit(0 if tf.__version__ == '${TF_VERSION}' else 'tensorflow was replaced: ' + tf.__version__)" \
 && python3 -P -c "import genaug.trainer, genaug.client"

RUN useradd --uid ${GENAUG_UID} --user-group --create-home --shell /usr/sbin/nologin genaug \
 && mkdir -p /runs \
 && chown genaug:genaug /runs
USER genaug
WORKDIR /runs

ENTRYPOINT ["genaug"]
CMD ["train", "--help"]
