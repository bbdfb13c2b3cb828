# syntax=docker/dockerfile:1
# The GPU image: CUDA 12 runtime (cuBLAS, NVRTC, NCCL), CuPy, MPICH from the `mpich` wheel (srun
# --mpi=pmi2 starts one rank per GPU), the trainer and sweeper.
#   docker build -f docker/gpu.Dockerfile -t sweepscale:gpu .
#   docker run --gpus all sweepscale:gpu python -m trainer device=gpu
ARG CUDA=nvidia/cuda:12.6.3-runtime-ubuntu24.04

FROM ${CUDA} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends "python3.12=3.12.3-*" "python3.12-venv=3.12.3-*" \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# Dependencies first, pinned, in their own layer: a code change does not reinstall them.
COPY docker/requirements.lock ./
RUN pip install -r requirements.lock "cupy-cuda12x==14.2.0"
COPY pyproject.toml README.md ./
COPY conf conf
COPY trainer trainer
COPY sweeper sweeper
COPY hydra_plugins hydra_plugins
RUN pip install --no-deps -e . --config-settings editable_mode=compat

FROM ${CUDA}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends "python3.12=3.12.3-*" \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1001 sweepscale
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH MLFLOW_TRACKING_URI=sqlite:////data/mlflow.db
RUN install -d -o sweepscale -g sweepscale /data
USER 1001:1001
WORKDIR /data
VOLUME /data
CMD ["python", "-m", "trainer", "device=gpu"]
