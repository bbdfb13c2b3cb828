"""A run's writes kept on disk until the tracking server has them: training never waits on it.

With ``mlflow.spool_dir`` and an http(s) tracking URI (a sweep sets each point's folder), the
recorder (trainer/record/tracking.py) appends every write, metrics, tags, params, texts, artifacts and
the run's end, to ``journal.jsonl`` there, one JSON line each, and a thread sends them in order.
Writes may follow the end (a CPU check landing after the run ended): the end's line then says
``close: false`` and a ``close`` line comes last; the journal is done once its last line is sent.

A local warm worker on a SQLite store *hands off* its runs (with ``HANDOFF_ENV``, set by its
sweeper): it never imports MLflow (seconds of CPU, and of the GIL while it trains); each run is
journaled by rank 0 from its start, not created (the first line has no run id, only what to create
it with; another rank that fails appends its error and the run's end), and the sweeper, which has
MLflow loaded, creates and sends it at every poll. The worker's end sends what its sweeper did not
(a sweeper gone). The first sender creates the run and notes its id in ``journal.run``; a lock on
the folder keeps two senders from sending a line twice at once. A run started before its sweep's
parent existed (sweeper/track/ahead.py) is told it in ``journal.parent``.
The byte offset sent is kept in ``journal.sent``. A server that is down holds nothing up: the
thread retries, the run's process waits for it at its end for at most ``DRAIN_S``, and what is
left is sent by ``python -m sweeper.sync`` (and by the sweep's end) from the journal alone. A line
may be sent twice (a crash between sending and noting it): every write is idempotent there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.errors import disk_full
from trainer.metrics import TAG_ERROR, TAG_PARENT

FILE, SENT, FILES = "journal.jsonl", "journal.sent", "journal_files"
RUN = "journal.run"  # a handed-off run's id, once its first sender created it
PARENT = "journal.parent"  # a handed-off run's parent run id, where its sweeper created the parent after it
DONE = "journal.done.jsonl"  # a journal sent in full, kept: a sweep whose server is away reports from it
DRAIN_S = float(os.environ.get("SWEEPSCALE_SPOOL_DRAIN_S", "30"))  # a run's end waits this long for the server
RETRY_S = 2.0  # between attempts while the server is down
BATCH = 1000  # MLflow's limit of metrics per log_batch call
HANDOFF_TAG = "sweepscale.handoff"  # a handed-off run's journal id: finds a run created but not noted
HANDOFF_ENV = "SWEEPSCALE_HANDOFF"  # "1": set by a sweeper that sends its warm workers' runs (no checkpoints)
# How long a worker's end waits for its live sweeper (it looks every sweep.poll_s) to send them, before it
# sends them itself, importing MLflow: 3-4 CPU-s, spent where CPU is short (a busy machine is where the
# sweeper is late: in a suite on two busy cores, 5 s passed for 4 of its workers); stopped (SIGTERM), less.
HANDOFF_WAIT_S = 30.0
STOPPED_WAIT_S = 5.0
PARENT_WAIT_S = 120.0  # and how much longer for a run started ahead of its parent, while the sweeper lives


class Journal:
    """The journal of one run in ``folder``; its first line names the store and the run."""

    def __init__(
        self, folder: str | os.PathLike, uri: str | None = None, run_id: str | None = None, created: dict | None = None
    ) -> None:
        """With ``uri``, a new journal's first line, naming ``run_id`` (None: a handed-off run, created
        from ``created`` by its first sender); ``created``: what the run was created with (its name,
        tags and start), for a report built from the journal alone."""
        self.folder = Path(folder)
        self.path, self.sent_path = self.folder / FILE, self.folder / SENT
        self.refused: list[str] = []  # the lines this process's sends refused (sweeper.sync says them)
        self._lock = threading.Lock()
        if uri is not None:
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

    def handed_off(self) -> bool:
        """Whether this is a handed-off run's journal: its first line names no run."""
        try:
            return self.header()["run_id"] is None
        except (OSError, ValueError):  # sent meanwhile, or its first line being written
            return False

    def awaits_parent(self) -> bool:
        """A handed-off run whose point started before its sweep's parent run existed, not yet told it."""
        try:
            head = self.header()
        except (OSError, ValueError):  # sent meanwhile, or its first line being written
            return False
        return head["run_id"] is None and TAG_PARENT not in head["tags"] and not (self.folder / PARENT).exists()

    def run_id(self) -> str | None:
        """The run's id: the first line's, or, for a handed-off run, the one its first sender created."""
        if (said := self.header()["run_id"]) is not None:
            return said
        return (self.folder / RUN).read_text() if (self.folder / RUN).exists() else None

    def _create(self, client: Any) -> str:
        """A handed-off run, created once: a sender that died before noting the id finds the run by its
        journal's tag instead of creating another."""
        from trainer.record.store import ensure_experiment

        head = self.header()
        tags, parent = head["tags"], self.folder / PARENT
        if TAG_PARENT not in tags and parent.exists():
            tags = {**tags, TAG_PARENT: parent.read_text()}
        exp_id = ensure_experiment(client, head["uri"], head["experiment"])
        tag, creating = head["tags"][HANDOFF_TAG], self.folder / f"{RUN}.creating"
        found = []
        if creating.exists():  # a sender died creating it: the run may exist
            found = client.search_runs([exp_id], f"tags.`{HANDOFF_TAG}` = '{tag}'", max_results=1)
        creating.touch()
        if found:
            run_id = found[0].info.run_id
        else:
            created = client.create_run(exp_id, start_time=head["start_ms"], tags=tags, run_name=head["name"])
            run_id = created.info.run_id
        tmp = self.folder / f"{RUN}.tmp"
        tmp.write_text(run_id)
        os.replace(tmp, self.folder / RUN)
        creating.unlink()
        return run_id

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

    def send(self, client: Any, budget_s: float | None = None) -> bool:
        """Send what is unsent, noting each line once sent; True once its last line is sent (then
        the journal is renamed ``DONE``: nothing is left to send). With ``budget_s``, stop after
        about that long (the rest at the next call). Raises what the store raised."""
        try:
            named = self.header()["run_id"] is not None
        except FileNotFoundError:  # another sender sent it all
            return True
        if named:  # one sender: the run's own process (or sweeper.sync after it)
            return self._send(client, budget_s)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a handed-off run's other sender waits its turn
            if not self.path.exists():  # the other sender sent it all
                return True
            return self._send(client, budget_s)
        finally:
            os.close(fd)

    def _send(self, client: Any, budget_s: float | None) -> bool:
        run_id, ended = self.run_id() or self._create(client), False
        deadline = None if budget_s is None else time.monotonic() + budget_s
        for offset, entries in _chunks(self.unsent()):
            if deadline is not None and time.monotonic() > deadline:
                return False
            for entry in entries:
                if refused := apply(client, run_id, entry, self.folder / FILES):
                    self.refused.append(refused)
                ended = ended or entry["op"] == "close" or (entry["op"] == "end" and entry.get("close", True))
            tmp = self.sent_path.with_suffix(".tmp")
            tmp.write_text(str(offset))
            os.replace(tmp, self.sent_path)
        if ended:  # nothing left to send: kept aside, not sent again
            shutil.rmtree(self.folder / FILES, ignore_errors=True)
            with open(self.folder / DONE, "ab") as kept, open(self.path, "rb") as sent:  # after a resumed run's first
                shutil.copyfileobj(sent, kept)
            self.path.unlink()
            self.sent_path.unlink(missing_ok=True)
        return ended


def _chunks(lines: list[tuple[int, dict[str, Any]]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The unsent lines in chunks of at most BATCH values, each sent as one ``batch`` of its metrics,
    params and tags (a later tag overriding an earlier one), then its other lines (texts, artifacts,
    the end) in their order: one store write for a whole run caught up at once, not one per line.
    The order within a chunk does not change what the store ends with, and a chunk sent again after
    a crash (its offset is noted once it is all sent) writes nothing new. (offset after it, entries)."""
    batch: dict[str, Any] = {"op": "batch", "metrics": [], "params": {}, "tags": {}}
    others: list[dict[str, Any]] = []
    last, size = 0, 0
    for offset, entry in lines:
        values = len(entry.get("metrics", [])) + len(entry.get("params", {})) + len(entry.get("tags", {}))
        if size and size + values > BATCH:
            yield last, [batch, *others]
            batch, others, size = {"op": "batch", "metrics": [], "params": {}, "tags": {}}, [], 0
        if entry["op"] in ("metrics", "params", "tags"):
            batch["metrics"] += entry.get("metrics", [])
            batch["params"].update(entry.get("params", {}))
            batch["tags"].update(entry.get("tags", {}))
            size += values
        else:
            others.append(entry)
        last = offset
    if last:
        yield last, ([batch] if size else []) + others


def apply(client: Any, run_id: str, entry: dict[str, Any], files: Path) -> str:
    """One journal line, written to the store; why it was refused, else ""."""
    from mlflow.entities import Metric, Param, RunTag

    op = entry["op"]
    if op == "batch":  # several lines' (_chunks): params and tags first, at most 100 of each a call
        metrics = [Metric(*m) for m in entry["metrics"]]
        params = [Param(k, v) for k, v in entry["params"].items()]
        tags = [RunTag(k, v) for k, v in entry["tags"].items()]
        while params or tags or metrics:
            p, t = params[:100], tags[:100]
            m = metrics[: BATCH - len(p) - len(t)]
            client.log_batch(run_id, metrics=m, params=p, tags=t)
            params, tags, metrics = params[len(p) :], tags[len(t) :], metrics[len(m) :]
    elif op == "metrics":
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
        # Only what keep_file copied: no other file named, nor the folder itself a link elsewhere.
        if files.is_symlink() or path.parent != files.parent.resolve() / files.name:
            said = f"artifact {entry['name']!r} is not in {files}"
            print(f"journal line refused: {said}", file=sys.stderr)
            return said
        client.log_artifact(run_id, str(path))
    elif op == "end":
        client.set_terminated(run_id, entry["status"], end_time=entry.get("end_ms"))  # when it ended, not when sent
        if entry["status"] == "FINISHED" and TAG_ERROR in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, TAG_ERROR)  # the sweeper's word when it closed the run unsent (a full disk)
    # "close": nothing to write, the journal is done
    return ""


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
    from trainer.record.store import client, server_away

    out, away = [], set()
    for path in sorted(Path(folder).rglob(FILE)):
        journal = Journal(path.parent)
        try:
            uri = journal.header()["uri"]
        except FileNotFoundError:  # a handed-off run's other sender (its worker's end) sent it all since the glob
            out.append((path, "sent"))
            continue
        except (ValueError, KeyError, TypeError) as e:  # not a journal's first line: nothing to send it to
            out.append((path, f"not sent: its first line is no journal's header ({type(e).__name__}: {e})"[:300]))
            continue
        if uri in away:  # one wait per absent server, not one per journal
            out.append((path, "not sent: the tracking server did not answer"))
            continue
        try:
            ended = journal.send(client(uri))
            what = "sent" if ended else "sent, run still open"
            refused = f"; {len(journal.refused)} line(s) refused ({journal.refused[0]})" if journal.refused else ""
            out.append((path, what + refused))
        except Exception as e:
            if server_away(e):
                away.add(uri)
            said = f"the disk is full ({full})" if (full := disk_full(e)) else f"{type(e).__name__}: {e}"
            out.append((path, f"not sent: {said}"[:300]))
    return out
