"""The sweep in MLflow: a parent run, child runs found by sweep id, resume by config hash."""

from __future__ import annotations

import shlex
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeper.config import FLAGS
from sweeper.folders import ending_note
from sweeper.points import NOT_NAMES, POINTS_ARTIFACT, Point
from sweeper.track import sweep_file
from trainer import metrics
from trainer.ranks.processes import alive, owner
from trainer.record import journal, store

SEND_BUDGET_S = 1.0  # a handed-off run's lines sent per look, at most this long (a worker may write faster)
PARENT_JOURNAL = "parent"  # the sweep folder's subfolder where its parent's end waits for an absent server


def points_json(points: list[Point], reused: dict[str, str]) -> list[dict]:
    """The parent's list of points (``points.json``): each one's name, config hash and the FINISHED
    run it reuses (``reused``: config hash -> run id), if any."""
    return [{"name": p.name, "config_hash": p.config_hash, "reused_run": reused.get(p.config_hash)} for p in points]


class SweepRecord:
    def __init__(self, uri: str, experiment: str, folder: Path | None = None) -> None:
        """``folder``: the sweep's, where the parent's state is kept for ``python -m sweeper.status``
        too (sweep_file.py)."""
        self.uri, self.experiment = store.absolute_uri(uri), experiment
        self.folder = folder
        self.client = store.client(self.uri)
        self.experiment_id = store.ensure_experiment(self.client, self.uri, experiment)
        self.parent_id: str | None = None
        self.started: tuple | None = None  # the parent's name, tags, params and points, once started

    def send_handed_off(self, folders: list[Path], budget_s: float | None = SEND_BUDGET_S) -> None:
        """The runs local warm workers handed off, sent from here, where MLflow is loaded: each
        point folder's journal (trainer/record/journal.py), for ``budget_s`` at most each (None: all
        of it). A journal that fails now is sent again at the next look, and at the sweep's end."""
        if store.sqlite_file(self.uri) is None:  # only a SQLite store's runs are handed off
            return
        # The journals there before any is sent: one begun meanwhile waits for the next look, after
        # what its worker wrote before it (its previous point's end), so that the store does not show
        # a worker's next run RUNNING beside its last one still RUNNING (a status read between).
        for folder in [f for f in folders if (f / journal.FILE).exists()]:
            try:
                journal.Journal(folder).send(self.client, budget_s=budget_s)
            except Exception:  # e.g. its first line being written: the next poll
                continue

    def finished_hashes(self) -> dict[str, str]:
        """config hash -> id of a FINISHED run of it in this experiment (the resume key)."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string="attributes.status = 'FINISHED'", max_results=50000
        )
        return {  # a point's retiming (sweeper/track/retime.py) times it: it stands for no point's result
            r.data.tags[metrics.TAG_CONFIG_HASH]: r.info.run_id
            for r in runs
            if metrics.TAG_CONFIG_HASH in r.data.tags and metrics.TAG_TIMED_AGAIN_FOR not in r.data.tags
        }

    def checkpointed(self, keys: dict[str, str]) -> dict[str, tuple[str, str, int]]:
        """config hash -> (run id, checkpoint folder, epoch) of a run of it that stopped before its end
        (FAILED at a time limit, KILLED by Ctrl-C or scancel) and left a checkpoint of its own: the
        next sweep resumes it there, in the same run, instead of starting again at epoch 1.
        ``keys``: config hash -> the point's checkpoint key (trainer/record/checkpoint.py)."""
        from trainer.record import checkpoint

        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string="attributes.status != 'FINISHED'",
            max_results=50000,
            order_by=["attributes.start_time DESC"],
        )
        found: dict[str, tuple[str, str, int]] = {}
        for r in runs:
            h, folder = r.data.tags.get(metrics.TAG_CONFIG_HASH), r.data.params.get("save.checkpoint_dir")
            if r.info.status not in ("FAILED", "KILLED") or h not in keys or h in found or folder in (None, "None"):
                continue
            try:
                ckpt = checkpoint.load(folder, keys[h])
            except Exception:  # another config's, or unreadable: the point starts afresh
                continue
            if ckpt is not None and ckpt.run_id == r.info.run_id:
                found[h] = (r.info.run_id, folder, ckpt.epoch)
        return found

    def start_parent(
        self, sweep_id: str, name: str, overrides: list[str], points: list[dict], scheduler: str, extra: dict[str, str]
    ) -> str:
        """The sweep's run: tagged so reports find it, with its list of points (``points.json``)."""
        tags = {
            metrics.TAG_SWEEP_ID: sweep_id,
            metrics.TAG_SCHEDULER: scheduler,
            "sweepscale.host": socket.gethostname(),
            metrics.TAG_SWEEPER: owner(),
            **extra,
        }
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.parent_id = run.info.run_id
        params = {"sweep.overrides": " ".join(overrides)[:6000] or "(none)", "sweep.points": str(len(points))}
        for key, value in params.items():
            self.client.log_param(self.parent_id, key, value)
        self.client.log_dict(self.parent_id, points, POINTS_ARTIFACT)
        self.started = (name, tags, params, points)  # for a report built offline (sweeper/track/offline_report.py)
        self._keep(sweep_id=sweep_id, name=name, status="RUNNING", points=points)
        return self.parent_id

    def replan(self, points: list[Point], reused: dict[str, str]) -> None:
        """The parent's list of points again, once a search has asked for all of its trials."""
        planned = points_json(points, reused)
        self.client.log_dict(self.parent_id, planned, POINTS_ARTIFACT)
        if self.started is not None:
            self.started = (*self.started[:3], planned)
        self._keep(points=planned)

    def children(self, sweep_id: str) -> dict[str, Any]:
        """Child runs of this sweep by run name (the point's overrides)."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{metrics.TAG_SWEEP_ID}` = '{sweep_id}'", max_results=50000
        )
        return {r.info.run_name: r for r in runs if r.info.run_id != self.parent_id}

    def log_parent(self, values: dict[str, float]) -> None:
        """Metrics of the sweep as a whole, on its parent run."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        if self.parent_id and values:
            self.client.log_batch(self.parent_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])

    def end_parent(self, status: str) -> None:
        if self.parent_id:
            self.client.set_terminated(self.parent_id, status)
            self._keep(status=status)

    def _keep(self, **fields: Any) -> None:
        """The parent's state in the sweep's folder too (sweep_file.py)."""
        if self.folder is not None:
            sweep_file.keep(self.folder, **fields)

    def close_orphans(
        self, live: Callable[[list[str]], set[str]]
    ) -> tuple[list[tuple[str, str]], dict[str, tuple[str, str]]]:
        """Sweeps of this host whose sweeper is gone (SIGKILL, a closed session) left their parent and
        children RUNNING: end them KILLED, saying why, but for a run whose scheduler job still runs
        (``live``, the runner's answer), which goes on and ends itself. Returns the sweeps closed (id,
        folder), and the runs going on: config hash -> (run id, job), for the sweep not to submit them again."""
        host = socket.gethostname()
        running = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"attributes.status = 'RUNNING' and tags.`{metrics.TAG_SWEEPER}` LIKE '{host} %'",
            max_results=1000,
        )
        closed, going_on = [], {}
        for parent in running:
            pid = int(parent.data.tags[metrics.TAG_SWEEPER].split()[1])
            if alive(pid):
                continue
            sweep_id = parent.data.tags[metrics.TAG_SWEEP_ID]
            folder = parent.data.tags.get(metrics.TAG_SWEEP_DIR, "")
            why = ending_note(folder) or f"its sweeper (pid {pid} on {host}) ended without closing the sweep's runs"
            kids = [r for r in self.children(sweep_id).values() if r.info.status == "RUNNING"]
            kids = [r for r in kids if r.info.run_id != parent.info.run_id]
            jobs = {r.info.run_id: r.data.tags.get(metrics.TAG_SLURM_JOB, "") for r in kids}
            running_jobs = live([job for job in jobs.values() if job])
            for run in kids:
                if jobs[run.info.run_id] in running_jobs:
                    going_on[run.data.tags[metrics.TAG_CONFIG_HASH]] = (run.info.run_id, jobs[run.info.run_id])
                    continue
                self.client.set_tag(run.info.run_id, metrics.TAG_ERROR, why)
                self.client.set_terminated(run.info.run_id, "KILLED")
            self.client.set_tag(parent.info.run_id, metrics.TAG_ERROR, why)
            self.client.set_terminated(parent.info.run_id, "KILLED")
            if folder and sweep_file.read(Path(folder)) is not None:
                sweep_file.keep(Path(folder), status="KILLED")
            closed.append((sweep_id, folder or sweep_id))
        return closed, going_on

    def abandon(self, error: BaseException, why: str = "") -> bool:
        """The sweep failed before its end (sbatch refused a job, the disk filled, ...): its parent and
        the runs still RUNNING end FAILED (KILLED on Ctrl-C), with ``why`` or the error. False where
        the store failed too (it is left be)."""
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        why = why or f"the sweep failed: {error}"
        try:
            if self.parent_id is None:
                return True
            sweep_id = self.client.get_run(self.parent_id).data.tags[metrics.TAG_SWEEP_ID]
            kids = [r for r in self.children(sweep_id).values() if r.info.status == "RUNNING"]
            for run in kids:
                self.client.set_tag(run.info.run_id, metrics.TAG_ERROR, why[-5000:])
                self.client.set_terminated(run.info.run_id, status)
            if self.client.get_run(self.parent_id).info.status == "RUNNING":
                closed = f"; runs closed so: {', '.join(r.info.run_name for r in kids)}" if kids else ""
                self.client.set_tag(self.parent_id, metrics.TAG_ERROR, f"{why}{closed}"[-5000:])
                self.client.set_terminated(self.parent_id, status)
                self._keep(status=status)
        except Exception:  # the store itself may be what failed
            return False
        return True

    def kill_running(self, sweep_id: str) -> list[str]:
        """Mark this sweep's still-RUNNING child runs KILLED (their jobs were cancelled)."""
        killed = []
        for name, run in self.children(sweep_id).items():
            if run.info.status == "RUNNING":
                self.client.set_terminated(run.info.run_id, "KILLED")
                killed.append(name)
        return killed


def parent_name(points: list[Point], overrides: list[str]) -> str:
    """``sweep hidden x nproc · epochs=3 · data mnist``: what the sweep varies, as its points' names
    say, then what sets it apart from another sweep of the same axes: the command's fixed keys and
    the data set."""
    keys = list(dict.fromkeys(part.split("=", 1)[0] for p in points for part in p.name.split(",") if "=" in part))
    parts = ["sweep " + " x ".join(keys) if len(points) > 1 and keys else f"sweep {points[0].name}"]
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if value and key not in keys and not key.startswith(NOT_NAMES) and key != "data.dir":
            parts.append(f"{key}={value}")
    data = points[0].trainer.data.dir
    parts.append(f"data {Path(data).name}" if data else "data embedded digits")
    return " · ".join(parts)[:250]


def command_line() -> str:
    """The command as the user typed it (our --dry-run/--force shorthands given back)."""
    flags = {v: k for k, v in FLAGS.items()}
    return shlex.join(["python", "-m", "sweeper", *(flags.get(a, a) for a in sys.argv[1:])])
