"""Recording a run in MLflow: rank 0 writes, in batches; any rank can mark the run failed.
Which store, and opening it: trainer/record/store.py."""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import metrics
from trainer.ranks import sigterm
from trainer.record import journal
from trainer.record.store import client, ensure_experiment

BATCH = 1000  # MLflow's limit of metrics per log_batch call
Tags = dict[str, str] | Callable[[], dict[str, str]]  # a run's tags, or a function giving them when it is created
Setup = Callable[["Recorder"], None]


class Recorder:
    """One MLflow run, written by rank 0 with batched calls.

    With ``background`` the run is created (and ``setup`` run on it) in a thread while training
    starts: :meth:`metric` and :meth:`set_tags` only queue, every call that needs the run waits for
    the thread, and the first such call raises the thread's error, so the run fails with it.

    With ``handoff`` (a folder: a warm worker's point, its sweeper at hand) the run is *handed
    off*: this process never opens the store for it; every write goes to a journal there, and the
    sweeper, which has MLflow loaded, creates and sends the run (trainer/record/journal.py)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str | None,
        tags: Tags,
        setup: Setup | None = None,
        background: bool = False,
        resume: str | None = None,
        spool: str | None = None,
        handoff: str | None = None,
    ) -> None:
        """``tags``: the run's, or a function giving them (called where the run is created).
        ``resume``: the id of a run to go on recording into (a checkpoint's) instead of a new one.
        ``spool``: with a tracking server (http), a folder where the writes wait for it (trainer/record/journal.py)."""
        self.uri = uri
        self._spool = spool if uri.startswith(("http://", "https://")) else None
        self.journal: journal.Journal | None = None
        self._sender: journal.Sender | None = None
        self.client: Any = None
        self._run_id: str | None = None
        self._metrics: list[tuple[str, float, int, int]] = []  # (key, value, ms since the epoch, step)
        self._tags: dict[str, str] = {}  # queued until the run exists
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._logged: set[tuple[str, int]] = set()  # a resumed run's (key, step) pairs, never logged twice
        self._handed = handoff is not None and resume is None and self._spool is None
        if resume is not None:
            self._reopen(resume, tags() if callable(tags) else tags)
            return
        opening = (experiment, run_name, tags, setup, int(time.time() * 1000))  # started now, created maybe later
        if self._handed:
            self._hand_off(handoff, *opening)
            return
        if not background:
            self._open(*opening)
            return
        self._thread = threading.Thread(target=self._open_catching, args=opening, name="mlflow-run", daemon=True)
        self._thread.start()

    def _open(self, experiment: str, run_name: str | None, tags: Tags, setup: Setup | None, start_ms: int) -> None:
        tags = tags() if callable(tags) else tags
        self.client = client(self.uri)
        exp_id = ensure_experiment(self.client, self.uri, experiment)
        self._run_id = self.client.create_run(exp_id, start_time=start_ms, tags=tags, run_name=run_name).info.run_id
        self._start_journal({"name": run_name, "tags": tags, "start_ms": start_ms})
        if setup is not None:
            setup(self)

    def _hand_off(
        self, folder: str, experiment: str, run_name: str | None, tags: Tags, setup: Setup | None, start_ms: int
    ) -> None:
        """The run as a journal in ``folder`` whose first line says how to create it."""
        tags = {**(tags() if callable(tags) else tags), journal.HANDOFF_TAG: uuid.uuid4().hex}
        created = {"experiment": experiment, "name": run_name, "tags": tags, "start_ms": start_ms}
        self.journal = journal.Journal(folder, self.uri, None, created)
        if setup is not None:
            setup(self)

    @property
    def handed_off(self) -> bool:
        """Whether the run is a journal that the sweeper creates and sends."""
        return self._handed

    def _reopen(self, run_id: str, tags: dict[str, str]) -> None:
        """The run RUNNING again, with the (key, step) pairs it already holds: a resumed epoch that
        the store got before the process was stopped is not logged twice."""
        self.client = client(self.uri)
        self._run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        run = self.client.get_run(run_id)
        if metrics.TAG_ERROR in run.data.tags:  # the stop it resumes from is no longer its end
            self.client.delete_tag(run_id, metrics.TAG_ERROR)
        for key in run.data.metrics:
            self._logged |= {(key, m.step) for m in self.client.get_metric_history(run_id, key)}
        self._start_journal()
        self.set_tags(tags)

    def _start_journal(self, created: dict | None = None) -> None:
        """From here on every write goes through the journal, sent by a thread."""
        if self._spool is not None:
            self.journal = journal.Journal(self._spool, self.uri, self._run_id, created)
            self._sender = journal.Sender(self.journal, self.client)
            self._sender.start()

    def _write(self, entry: dict[str, Any]) -> None:
        with sigterm.deferred():  # a line written whole
            self.journal.append(entry)
        if self._sender is not None:  # a handed-off run's is the sweeper
            self._sender.wake.set()

    def _open_catching(self, *opening: Any) -> None:
        try:
            self._open(*opening)
        except BaseException as e:  # kept for the main thread: raised by the next call that needs the run
            self._error = e

    def _wait(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    def _ready(self) -> str | None:
        """The run's id, once created; None for a handed-off run (its writes go to the journal).
        Raises the opening's error once (a failure path may still record into a run that exists),
        then, while there is no run, a RuntimeError."""
        if self._handed:
            return None
        self._wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._run_id is None:
            raise RuntimeError(f"no MLflow run: it could not be created in {self.uri}")
        return self._run_id

    @property
    def run_id(self) -> str | None:
        """None for a handed-off run whose sender has not created it yet."""
        return self._ready() or (self.journal.run_id() if self._handed else None)

    def settled_run_id(self) -> str | None:
        """The run's id, or None where it could not be created; waits for the opening, never raises."""
        self._wait()
        return self._run_id

    # Each method waits for the run (_ready) before it imports MLflow: importing it in two threads at
    # once can find its circular imports half done.
    def log_params(self, params: dict[str, Any]) -> None:
        run_id = self._ready()
        if self.journal is not None:
            return self._write({"op": "params", "params": {k: str(v) for k, v in params.items()}})
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in params.items()]
        with sigterm.deferred():
            for i in range(0, len(items), 100):
                self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        """Sent now if the run exists, else with the next :meth:`flush`."""
        self._tags.update({k: str(v) for k, v in tags.items()})
        if self._thread is None or not self._thread.is_alive():
            self._send_tags()

    def _send_tags(self) -> None:
        run_id = self._ready()
        if self._tags and self.journal is not None:
            self._write({"op": "tags", "tags": self._tags})
        elif self._tags:
            from mlflow.entities import RunTag

            with sigterm.deferred():
                self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in self._tags.items()])
        self._tags = {}

    def metric(self, key: str, value: float, step: int = 0) -> None:
        """Queue one value; nothing is sent until :meth:`flush`."""
        self._metrics.append((key, float(value), int(time.time() * 1000), int(step)))

    def flush(self) -> None:
        self._send_tags()
        run_id = self._ready()
        queued = [m for m in self._metrics if (m[0], m[3]) not in self._logged]  # (key, value, ms, step)
        if self.journal is not None:  # training goes on; the thread (or the sweeper) sends them
            if queued:
                self._write({"op": "metrics", "metrics": [list(m) for m in queued]})
            self._metrics = []
            return
        from mlflow.entities import Metric

        metrics_ = [Metric(*m) for m in queued]
        with sigterm.deferred():  # an epoch's write, whole: SIGTERM mostly lands here
            for i in range(0, len(metrics_), BATCH):
                self.client.log_batch(run_id, metrics=metrics_[i : i + BATCH])
        self._metrics = []  # kept where the store refused them: the failure path sends them again

    def log_text(self, text: str, name: str) -> None:
        if self.journal is not None:
            return self._write({"op": "text", "text": text, "name": name})
        run_id = self._ready()
        with sigterm.deferred():
            self.client.log_text(run_id, text, name)

    def log_npz(self, name: str, arrays: dict[str, Any]) -> None:
        import numpy as np

        run_id = self._ready()
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / name
            np.savez(path, **arrays)
            if self.journal is not None:
                self.journal.keep_file(path, name)
                if self._sender is not None:
                    self._sender.wake.set()
            else:
                with sigterm.deferred():
                    self.client.log_artifact(run_id, str(path))

    def finish(self, status: str = "FINISHED", close: bool = True) -> None:
        """End the run. Without ``close`` more writes follow its end (a check still computing):
        :meth:`close` says when they are done."""
        self.flush()
        self._end(status, close)

    def close(self) -> None:
        """The writes that followed a ``finish(close=False)`` are done: a journal sends its last line."""
        self.flush()
        if self.journal is not None:
            self._write({"op": "close"})
            self._drain()

    def fail(self, status: str, error: str, rank: int) -> None:
        """End the run FAILED or KILLED, keeping the error (its last lines as a tag, all as a text)."""
        self.set_tags({metrics.TAG_ERROR: error_tag(error, rank)})
        self.flush()
        self.log_text(error, f"error-rank{rank}.txt")
        self._end(status)

    def _end(self, status: str, close: bool = True) -> None:
        if self.journal is None:
            run_id = self._ready()
            with sigterm.deferred():
                self.client.set_terminated(run_id, status)
            return
        self._write({"op": "end", "status": status, "close": close, "end_ms": int(time.time() * 1000)})
        if close:
            self._drain()

    def _drain(self) -> None:
        if self._handed:  # sent by the sweeper; the worker waits for it at its end (trainer/worker.py)
            return
        if not self._sender.drain(journal.DRAIN_S):  # the server is down: the journal keeps it all
            print(
                f"the tracking server did not take run {self._run_id} in {journal.DRAIN_S:g} s "
                f"({self._sender.error}); it waits in {self.journal.path}: `python -m sweeper.sync "
                f"{self.journal.folder}` sends it",
                file=sys.stderr,
            )


def mark_ended(uri: str, run_id: str, status: str, error: str, rank: int) -> None:
    """From any rank: keep the traceback with the run and end it FAILED or KILLED."""
    c = client(uri)
    c.set_tag(run_id, metrics.TAG_ERROR, error_tag(error, rank))
    c.log_text(run_id, error, f"error-rank{rank}.txt")
    c.set_terminated(run_id, status)


def journal_ended(folder: str, status: str, error: str, rank: int) -> None:
    """From another rank than 0 of a handed-off run (no run id, no MLflow): the same, appended to rank
    0's journal in ``folder``, which the sweeper sends; nothing where rank 0 has not begun it."""
    book = journal.Journal(folder)
    if book.path.exists():
        book.append({"op": "tags", "tags": {metrics.TAG_ERROR: error_tag(error, rank)}})
        book.append({"op": "text", "text": error, "name": f"error-rank{rank}.txt"})
        book.append({"op": "end", "status": status, "end_ms": int(time.time() * 1000)})


def error_tag(error: str, rank: int) -> str:
    """A failed run's error tag: the rank and the traceback's last lines."""
    tail = "\n".join(error.strip().splitlines()[-5:])
    return f"rank {rank}: {tail}"[-5000:]
