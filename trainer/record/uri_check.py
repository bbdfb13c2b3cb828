"""The usual tracking-URI mistakes, found in a moment before any rank or job starts: MLflow
itself finds them only when a run is created, after minutes of retries for a server."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainer.errors import ConfigError

# Stores MLflow opens from a URI (a database URI may name its driver: postgresql+psycopg2).
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")
CONNECT_S = 3.0  # a server that does not accept a connection in this long is taken as down
ANSWER_S = 20.0  # and one that accepts it, this long to answer: a new server's first query took over 3 s under load


def check_uri(uri: str) -> None:
    """ConfigError naming ``mlflow.tracking_uri`` and the fix, for a URI MLflow cannot open."""
    from urllib.parse import urlparse

    where = f"mlflow.tracking_uri={uri}"
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+")[0]
    if "://" not in uri or scheme not in SCHEMES:
        raise ConfigError(
            f"{where}: not a tracking URI MLflow opens ({', '.join(SCHEMES)}); "
            "use sqlite:///path/to/mlflow.db or http://HOST:PORT of an `mlflow server`"
        )
    if scheme == "sqlite":
        _check_sqlite(where, Path(uri[len("sqlite:///") :]).expanduser())
    elif scheme in ("http", "https"):
        _check_server(where, uri, parsed.hostname or "", parsed.port or (443 if scheme == "https" else 80))
    elif scheme in ("postgresql", "mysql", "mssql"):
        _check_driver(where, uri, scheme)


def _check_server(where: str, uri: str, host: str, port: int) -> None:
    """Something accepts connections there, and it is an MLflow tracking server: its REST API answers."""
    import json
    import socket
    import urllib.error
    import urllib.request

    try:
        socket.create_connection((host, port), timeout=CONNECT_S).close()
    except OSError as e:
        raise ConfigError(
            f"{where}: no tracking server answers at {host}:{port} ({e}); start it "
            "(`mlflow server --host 127.0.0.1 --port 5000 ...`, docs/reference.md) or fix the URI"
        ) from None
    api = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        with urllib.request.urlopen(api, timeout=ANSWER_S) as answer:
            body = json.loads(answer.read() or b"{}")
        if isinstance(body, dict) and set(body) <= {"experiments", "next_page_token"}:  # MLflow's answer
            return
        said = "an answer that is not MLflow's"
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):  # an MLflow server behind authentication: the run's credentials decide
            return
        said = f"HTTP {e.code}"
    except (OSError, ValueError) as e:  # no answer in time, or not JSON
        said = str(e)
    raise ConfigError(
        f"{where}: {host}:{port} answers, but not as an MLflow tracking server (GET /api/2.0/mlflow/"
        f"experiments/search: {said}); point it at an `mlflow server` (docs/reference.md)"
    )


def _check_driver(where: str, uri: str, scheme: str) -> None:
    """A database URI needs its Python driver here, where the runs are written."""
    from sqlalchemy.engine.url import make_url

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ImportError as e:
        raise ConfigError(
            f"{where}: the {scheme} driver is not installed here ({e}); install it (e.g. `pip install "
            "psycopg2-binary` and use postgresql+psycopg2://...), or log to the tracking server's http:// URI"
        ) from None


def _check_sqlite(where: str, db: Path) -> None:
    if db.exists():
        if not os.access(db, os.R_OK | os.W_OK):
            raise ConfigError(f"{where}: the database {db} is not readable and writable by this user")
        return
    folder = db.resolve().parent
    try:  # the store creates the file: the folder must take a new file (a test beats os.access on /proc)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(
            f"{where}: cannot create the database in {folder} ({e.strerror}); point it at a writable folder"
        ) from None
