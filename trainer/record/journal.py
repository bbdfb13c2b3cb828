"""A run's writes kept on disk until the tracking server has them: training never waits on it.

With ``mlflow.spool_dir`` and an http(s) tracking URI (a sweep sets each point's folder), the
recorder (trainer/record/tracking.py) appends every write, metrics, tags, params, texts, artifacts and
the run's end, to ``journal.jsonl`` there, one JSON line each, and a thread sends them in order.
Writes may follow the end (a CPU check landing after the run ended): the end's line then says
``close: false`` and a ``close`` line comes last; the journal is done once its last line is sent.
The byte offset sent so far is kept in ``journal.sent``. A server that is down holds nothing up:
the thread retries, the run's process waits for it at its end for at most ``DRAIN_S``, and what
is left is sent by ``python -m sweeper.sync`` (and by the sweep's own end) from the journal
alone. A line may be sent twice (a crash between sending and noting it): every write is
idempotent there, metrics too, as a metric is stored once per (key, step, time, value).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

FILE, SENT, FILES = "journal.jsonl", "journal.sent", "journal_files"
DONE = "journal.done.jsonl"  # a journal sent in full, kept: a sweep whose server is away reports from it
DRAIN_S = float(os.environ.get("SWEEPSCALE_SPOOL_DRAIN_S", "30"))  # a run's end waits this long for the server
RETRY_S = 2.0  # between attempts while the server is down
BATCH = 1000  # MLflow's limit of metrics per log_batch call


class Journal:
    """The journal of one run in ``folder``; its first line names the store and the run."""

    def __init__(
        self, folder: str | os.PathLike, uri: str | None = None, run_id: str | None = None, created: dict | None = None
    ) -> None:
        """With ``uri`` and ``run_id``, a new journal's first line; ``created``: what the run was
        created with (its name, tags and start), for a report built from the journal alone."""
        self.folder = Path(folder)
        self.path, self.sent_path = self.folder / FILE, self.folder / SENT
        self._lock = threading.Lock()
        if uri is not None and run_id is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.append({"op": "run", "uri": uri, "run_id": run_id, **(created or {})})

    def append(self, entry: dict[str, Any]) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def keep_file(self, source: Path, name: str) -> None:
        """An artifact: copied beside the journal now (its source may be gone when it is sent)."""
        (self.folder / FILES).mkdir(exist_ok=True)
        shutil.copyfile(source, self.folder / FILES / name)
        self.append({"op": "artifact", "name": name})

    def header(self) -> dict[str, Any]:
        with open(self.path) as f:
            return json.loads(f.readline())

    def unsent(self) -> list[tuple[int, dict[str, Any]]]:
        """(offset after it, entry) of each line not sent yet; a line still being written is left."""
        done = int(self.sent_path.read_text()) if self.sent_path.exists() else 0
        out = []
        with open(self.path, "rb") as f:
            f.seek(done)
            for line in f:
                if not line.endswith(b"\n"):
                    break
                done += len(line)
                out.append((done, json.loads(line)))
        return out

    def send(self, client: Any) -> bool:
        """Send what is unsent, noting each line once sent; True once its last line is sent (then
        the journal is renamed ``DONE``: nothing is left to send). Raises what the store raised."""
        run_id, ended = self.header()["run_id"], False
        for offset, entry in self.unsent():
            apply(client, run_id, entry, self.folder / FILES)
            tmp = self.sent_path.with_suffix(".tmp")
            tmp.write_text(str(offset))
            os.replace(tmp, self.sent_path)
            ended = entry["op"] == "close" or (entry["op"] == "end" and entry.get("close", True))
        if ended:  # nothing left to send: kept aside, not sent again
            shutil.rmtree(self.folder / FILES, ignore_errors=True)
            with open(self.folder / DONE, "ab") as kept, open(self.path, "rb") as sent:  # after a resumed run's first
                shutil.copyfileobj(sent, kept)
            self.path.unlink()
            self.sent_path.unlink(missing_ok=True)
        return ended


def apply(client: Any, run_id: str, entry: dict[str, Any], files: Path) -> None:
    """One journal line, written to the store."""
    from mlflow.entities import Metric, Param, RunTag

    op = entry["op"]
    if op == "metrics":
        metrics = [Metric(*m) for m in entry["metrics"]]
        for i in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in entry["tags"].items()])
    elif op == "params":
        client.log_batch(run_id, params=[Param(k, v) for k, v in entry["params"].items()])
    elif op == "text":
        client.log_text(run_id, entry["text"], entry["name"])
    elif op == "artifact":
        path = (files / entry["name"]).resolve()
        if path.parent != files.resolve():  # only what keep_file copied: a journal must not name other files
            print(f"journal line refused: artifact {entry['name']!r} is not in {files}", file=sys.stderr)
            return
        client.log_artifact(run_id, str(path))
    elif op == "end":
        client.set_terminated(run_id, entry["status"])
    # "close": nothing to write, the journal is done


class Sender(threading.Thread):
    """Sends a journal in the background while the run trains, retrying while the server is down."""

    def __init__(self, journal: Journal, client: Any) -> None:
        super().__init__(name="journal-sender", daemon=True)
        self.journal, self.client = journal, client
        self.wake = threading.Event()
        self.ended = threading.Event()  # the run's end is sent: the journal is gone
        self.error = ""  # the store's last error, while it fails

    def run(self) -> None:
        while not self.ended.is_set():
            self.wake.wait(RETRY_S)
            self.wake.clear()
            try:
                if self.journal.send(self.client):
                    self.ended.set()
                self.error = ""
            except Exception as e:  # the server is down or refuses: the journal keeps it all
                self.error = f"{type(e).__name__}: {e}"[:300]

    def drain(self, timeout: float) -> bool:
        """Wait until the run's end is sent, at most ``timeout`` seconds."""
        self.wake.set()
        return self.ended.wait(timeout)


def send_left(folder: str | os.PathLike) -> list[tuple[Path, str]]:
    """Send every journal under ``folder`` (``python -m sweeper.sync``, a sweep's end): (journal,
    what happened) for each, "sent", "sent, run still open" or the store's error."""
    from trainer.record.store import client

    out, away = [], set()
    for path in sorted(Path(folder).rglob(FILE)):
        journal = Journal(path.parent)
        uri = journal.header()["uri"]
        if uri in away:  # one wait per absent server, not one per journal
            out.append((path, "not sent: the tracking server did not answer"))
            continue
        try:
            ended = journal.send(client(uri))
            out.append((path, "sent" if ended else "sent, run still open"))
        except Exception as e:
            if server_away(e):
                away.add(uri)
            out.append((path, f"not sent: {type(e).__name__}: {e}"[:300]))
    return out


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
