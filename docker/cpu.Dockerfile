# syntax=docker/dockerfile:1
# The slim CPU image: trainer and sweeper, MPICH from the `mpich` wheel (srun --mpi=pmi2 starts its
# ranks), mlflow with psycopg2: docker/compose.yaml's tracking server runs it too.
#   docker build -f docker/cpu.Dockerfile -t sweepscale:cpu .
ARG PYTHON=python:3.12.8-slim-bookworm

FROM ${PYTHON} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# Dependencies first, pinned, in their own layer: a code change does not reinstall them.
COPY docker/requirements.lock ./
RUN pip install -r requirements.lock
COPY pyproject.toml README.md ./
COPY conf conf
COPY trainer trainer
COPY sweeper sweeper
COPY hydra_plugins hydra_plugins
# Editable: Hydra finds conf/ beside the code, as in a checkout.
RUN pip install --no-deps -e . --config-settings editable_mode=compat

FROM ${PYTHON}
RUN useradd --create-home --uid 1000 sweepscale
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH MLFLOW_TRACKING_URI=sqlite:////data/mlflow.db
# /artifacts: the tracking server's (compose.yaml); a new named volume takes its owner from here.
RUN install -d -o sweepscale -g sweepscale /data /artifacts
USER 1000:1000
WORKDIR /data
VOLUME /data
CMD ["python", "-m", "trainer"]
