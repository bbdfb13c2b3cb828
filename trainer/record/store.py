"""Which MLflow store a run records into, and opening it.

The tracking URI and experiment come from the config, else from MLFLOW_TRACKING_URI and
MLFLOW_EXPERIMENT_NAME, else ``sqlite:///mlflow.db`` and "sweepscale", with artifacts in
``mlruns/`` beside the SQLite file.

A new SQLite store starts as a copy of MLflow's empty schema. MLflow builds a new store's tables
by running every migration since its first version: 1.2-1.5 s of CPU, the same for every new store
of an MLflow version, on the critical path of a user's first sweep in a folder. The first new store
of each MLflow version is kept, emptied of its one row (the Default experiment, which MLflow
creates on every open where it is missing, with the folder of the store being opened); later new
stores start as its copy, and MLflow opens the copy as any store, checking its schema. Kept in the
user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``) under ``sweepscale/mlflow-stores``: removing
it costs the next new store the migrations, nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import metrics
from trainer.errors import ConfigError

DEFAULT_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "sweepscale"
AHEAD = "SWEEPSCALE_STORE"  # set by a sweeper for its warm workers: the store their points record into
_ahead: threading.Thread | None = None


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def absolute_uri(uri: str) -> str:
    """Jobs run in other folders (and on other nodes): make a relative SQLite path absolute."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


NAME_MAX = 500  # MLflow's longest experiment name


def experiment_name(configured: str | None) -> str:
    """The experiment: mlflow.experiment, else MLFLOW_EXPERIMENT_NAME, else the default; a name MLflow
    would refuse (once a rank had started) is a ConfigError here."""
    name = configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    if len(name) > NAME_MAX:
        where = "mlflow.experiment" if configured else "MLFLOW_EXPERIMENT_NAME"
        raise ConfigError(f"{where}: {len(name)} characters, MLflow takes at most {NAME_MAX}; name it shorter")
    return name


def open_ahead(uri: str | None = None, then: Callable[[], None] | None = None) -> threading.Thread:
    """In a thread, while the caller does other work: import MLflow's client (seconds) and, with
    ``uri``, open that store (SQLAlchemy's import, the schema's check, a new store's tables), which
    MLflow then keeps for this process's later clients of it. Once per process; :func:`client`
    waits for it (two threads importing MLflow at once can find each other's imports half done)."""
    global _ahead

    def work() -> None:
        with contextlib.suppress(Exception):  # the caller's own client says why
            load_mlflow()
            if uri:
                client(uri)
        if then is not None:
            then()

    if _ahead is None:
        # Modules the caller's thread may import meanwhile, first here: two threads importing the
        # modules of an import cycle at once can fail in one ("_DeadlockError ... importlib.resources.abc").
        import importlib.metadata
        import importlib.resources.abc  # noqa: F401

        _ahead = threading.Thread(target=work, name="open-store", daemon=True)
        _ahead.start()
    return _ahead


def load_mlflow() -> None:
    """Import MLflow's tracking client as mlflow-skinny has it, without pandas: MLflow imports pandas
    only to offer its pandas datasets, which no run of ours logs: its client and SQLAlchemy store
    import in 3.2-3.4 CPU-s instead of 3.9-4.2 (docs/benchmarks.md). pandas stays importable after."""
    if "mlflow.tracking" in sys.modules:
        return
    blocked = "pandas" not in sys.modules
    if blocked:
        # `import pandas` then raises ImportError, as where it is not installed: MLflow goes on without it
        sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        import mlflow.tracking  # noqa: F401
    finally:
        if blocked and sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]


def client(uri: str) -> Any:
    """A client of the store at ``uri``. Processes opening a new SQLite store take turns (MLflow's
    migrations, run by two at once, fail in one of them); it starts from MLflow's empty schema
    where kept (below)."""
    if _ahead is not None and _ahead is not threading.current_thread():
        _ahead.join()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in the sweep's output
    load_mlflow()
    from mlflow.tracking import MlflowClient

    if (db := sqlite_file(uri)) is None or not db.parent.is_dir():
        return MlflowClient(tracking_uri=uri)
    fd = os.open(db.parent, os.O_RDONLY)  # the database's folder is the lock: no file left behind
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        created = not db.exists() and not _seed(db)
        opened = MlflowClient(tracking_uri=uri)  # opens the store, creating its tables where missing
        if created:
            _keep(db)
        return opened
    finally:
        os.close(fd)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store's URI; None for any other store."""
    return Path(uri[len("sqlite:///") :]).expanduser().resolve() if uri.startswith("sqlite:///") else None


def _artifact_root(uri: str) -> str | None:
    """For a SQLite store, artifacts go to mlruns/ beside the database file."""
    return None if (db := sqlite_file(uri)) is None else (db.parent / "mlruns").as_uri()


def ensure_experiment(mlflow_client: Any, uri: str, name: str) -> str:
    """The experiment's id, created if missing, with MLflow's experiment kind tag (custom model
    development; an existing experiment without a kind gets it): without it MLflow 3's UI opens
    the experiment on its traces page instead of the runs table."""
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


def opens_in_background(uri: str) -> bool:
    """Whether a run in ``uri`` may be created while training starts: a SQLite file in an existing
    folder. Any other store is opened first, so that a wrong URI stops the run before it trains."""
    return (db := sqlite_file(uri)) is not None and db.parent.is_dir()


def template_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sweepscale" / "mlflow-stores"


def _template() -> Path | None:
    """This MLflow's template (its version in the name); None before MLflow is imported."""
    mlflow = sys.modules.get("mlflow")
    version = getattr(mlflow, "__version__", None)
    return None if version is None else template_folder() / f"mlflow-{version}.db"


def _seed(db: Path) -> bool:
    """Start the new store ``db`` (not there yet) as a copy of the template: False where there is
    none, or it could not be copied (MLflow then creates the store itself)."""
    template = _template()
    if template is None or not template.is_file():
        return False
    part = db.with_name(f".{db.name}.{os.getpid()}.part")  # renamed into place whole
    try:
        shutil.copyfile(template, part)
        os.replace(part, db)
    except OSError:
        part.unlink(missing_ok=True)
        return False
    return True


def _keep(db: Path) -> None:
    """Keep the store MLflow has just created at ``db`` (nothing in it but its Default experiment)
    as this version's template; a cache that cannot be written keeps nothing."""
    template = _template()
    if template is None or template.exists():
        return
    part = template.with_name(f".{template.name}.{os.getpid()}.part")
    with contextlib.suppress(OSError, sqlite3.Error):
        template.parent.mkdir(parents=True, exist_ok=True)
        source, copy = sqlite3.connect(db), sqlite3.connect(part)
        try:
            source.backup(copy)  # a consistent copy, whatever the journal mode
            copy.execute("DELETE FROM experiments")  # the Default experiment names this store's folder
            copy.commit()
        finally:
            source.close()
            copy.close()
        os.replace(part, template)
    part.unlink(missing_ok=True)


def bound_waits(seconds: float) -> None:
    """From now on in this process, a call to a tracking server gives up after about ``seconds`` (one
    try and one retry, each at most ``seconds / 2``): MLflow's own default retries for minutes."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(seconds / 2)))


def server_away(error: BaseException) -> bool:
    """Whether MLflow's error says the tracking server did not answer (refused, timed out, gone)."""
    text = str(error)
    return "API request to" in text and any(w in text for w in ("Max retries", "timeout", "Connection", "timed out"))
