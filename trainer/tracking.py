"""Recording a run in MLflow: rank 0 writes, in batches; any rank can mark the run failed.

The tracking URI and experiment come from the config, else from MLFLOW_TRACKING_URI and
MLFLOW_EXPERIMENT_NAME, else ``sqlite:///mlflow.db`` and "sweepscale", with artifacts in
``mlruns/`` beside the SQLite file.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from trainer import metrics

DEFAULT_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "sweepscale"
BATCH = 1000  # MLflow's limit of metrics per log_batch call


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def experiment_name(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _artifact_root(uri: str) -> str | None:
    """For a SQLite store, artifacts go to mlruns/ beside the database file."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///") :]).expanduser().resolve()
    return (db.parent / "mlruns").as_uri()


def ensure_experiment(mlflow_client: Any, uri: str, name: str) -> str:
    """The experiment's id, created if missing. It carries MLflow's experiment kind tag
    (``mlflow.experimentKind``: custom model development), without which MLflow 3's UI opens the
    experiment on its traces page instead of the runs table; an existing experiment without the
    tag gets it (one that has a kind keeps it)."""
    kind = {metrics.TAG_EXPERIMENT_KIND: metrics.EXPERIMENT_KIND}
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is None:
        try:
            return mlflow_client.create_experiment(name, artifact_location=_artifact_root(uri), tags=kind)
        except Exception:  # another process created it first
            exp = mlflow_client.get_experiment_by_name(name)
            if exp is None:
                raise
    if metrics.TAG_EXPERIMENT_KIND not in exp.tags:
        mlflow_client.set_experiment_tag(exp.experiment_id, metrics.TAG_EXPERIMENT_KIND, metrics.EXPERIMENT_KIND)
    return exp.experiment_id


class Recorder:
    """One MLflow run, written by rank 0 with batched calls."""

    def __init__(self, uri: str, experiment: str, run_name: str | None, tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, Param

        self._Metric, self._Param = Metric, Param
        self.uri = uri
        self.client = client(uri)
        exp_id = ensure_experiment(self.client, uri, experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id
        self._metrics: list[Any] = []

    def log_params(self, params: dict[str, Any]) -> None:
        items = [self._Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def metric(self, key: str, value: float, step: int = 0) -> None:
        """Queue one value; nothing is sent until :meth:`flush`."""
        self._metrics.append(self._Metric(key, float(value), int(time.time() * 1000), step))

    def flush(self) -> None:
        for i in range(0, len(self._metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=self._metrics[i : i + BATCH])
        self._metrics = []

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_npz(self, name: str, arrays: dict[str, Any]) -> None:
        import numpy as np

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / name
            np.savez(path, **arrays)
            self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status)


def mark_ended(uri: str, run_id: str, status: str, error: str, rank: int) -> None:
    """From any rank: keep the traceback with the run and end it FAILED or KILLED."""
    c = client(uri)
    tail = "\n".join(error.strip().splitlines()[-5:])
    c.set_tag(run_id, metrics.TAG_ERROR, f"rank {rank}: {tail}"[-5000:])
    c.log_text(run_id, error, f"error-rank{rank}.txt")
    c.set_terminated(run_id, status)
