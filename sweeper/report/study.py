"""A sweep's study as plain data, read from the tracking store alone.

A sweep's parent run lists its points in the artifact ``points.json`` (name, config hash, and for
points a resumed sweep skipped, the FINISHED run it reused); its children carry the sweep id.
Nothing here draws or writes: :mod:`sweeper.report.analysis` computes, the figures draw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from sweeper.points import POINTS_ARTIFACT
from sweeper.report.analysis import Divergence, divergence
from trainer import metrics

SAMPLED = 2000  # values of one metric's history a report reads at most (a loss logged every step: 10^6)
CHECK_TAGS = (metrics.TAG_CHECK, metrics.TAG_REFERENCE, metrics.TAG_REFERENCE_KEY)  # set when a check lands
# Config keys that say where a run is recorded or how it is started, not what it computes.
BOOKKEEPING = ("mlflow.", "mpi.", "check.cache_dir", "fault.", "profile", "save.checkpoint_dir", "save.progress_dir")


@dataclass
class Point:
    """One point of the study: its run, its config and what it recorded."""

    name: str
    run_id: str
    sweep_id: str
    status: str
    config: dict[str, Any]  # the run's flattened config, typed back from MLflow's strings
    metrics: dict[str, float]
    tags: dict[str, str]
    # (step, value) series: train/loss by iteration; the others by epoch.
    loss: list[tuple[int, float]] = field(default_factory=list)
    loss_epoch: list[tuple[int, float]] = field(default_factory=list)
    precision: list[tuple[int, float]] = field(default_factory=list)
    epoch_s: list[tuple[int, float]] = field(default_factory=list)
    batch_ms_repeats: list[float] = field(default_factory=list)
    reused: bool = False  # a FINISHED run of an earlier sweep that this sweep skipped
    start_ms: int | None = None  # the child run's span in MLflow
    end_ms: int | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    @property
    def nproc(self) -> int:
        return int(self.config.get("nproc", 1))

    def without_check(self) -> Point:
        """This point without what its CPU check logs (its errors and tags), which may land after the
        rest: what every figure but the weight error's is drawn from, so that a figure drawn while
        the checks land (sweeper/track/early_report.py) is not drawn again once they have."""
        return replace(
            self,
            metrics={k: v for k, v in self.metrics.items() if not k.startswith(metrics.CHECK_PREFIX)},
            tags={k: v for k, v in self.tags.items() if k not in CHECK_TAGS},
        )

    def only_check(self) -> Point:
        """This point as the weight error's figure reads it: its config and its check's errors, so
        that a figure drawn once the checks landed is not drawn again for a change elsewhere."""
        return Point(
            self.name,
            self.run_id,
            self.sweep_id,
            self.status,
            self.config,
            metrics={k: v for k, v in self.metrics.items() if k.startswith(metrics.CHECK_PREFIX)},
            tags={},
        )

    @cached_property
    def diverged(self) -> Divergence | None:
        """Where the loss turned NaN or rose past its start (None: it did not)."""
        return divergence(self.loss)


@dataclass
class Sweep:
    """A parent run: what was asked, where and when."""

    sweep_id: str
    run_id: str
    name: str
    status: str
    command: str
    overrides: str
    host: str
    commit: str
    version: str
    start_ms: int
    end_ms: int | None
    folder: str
    search: dict[str, Any] = field(default_factory=dict)  # a search's: study, objective, direction, searched keys


@dataclass
class Study:
    sweeps: list[Sweep]
    points: list[Point]
    missing: list[tuple[str, str]] = field(default_factory=list)  # (point, why) without a run
    # Every run a sweep ran itself, a point's failed run that a later sweep redid included: its cost.
    runs: list[Point] = field(default_factory=list)

    @property
    def label(self) -> str:
        return "+".join(s.sweep_id for s in self.sweeps)


def typed(text: str) -> Any:
    """MLflow keeps params as strings: give back the int, float, bool or None they were."""
    if text in ("None", "null"):
        return None
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def series(client: Any, run_id: str, key: str, most: int = SAMPLED) -> list[tuple[int, float]]:
    """A metric's (step, value) history, ``most`` values at most, evenly spread with its first and
    last: a figure's worth, whatever the run's length. A SQL store samples it in the database; a
    store that cannot reads it whole and keeps as many (MLflow's own fallback)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)  # MlflowClient has no public door
    if store is None or not hasattr(store, "get_metric_history_bulk_interval"):
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
    return sorted((m.step, m.value) for m in store.get_metric_history_bulk_interval([run_id], key, most, None, None))


def point_of(run: Any, name: str, reused: bool = False) -> Point:
    """A point as its run's summary holds it: config, last metrics and tags, no series."""
    return Point(
        name=name,
        run_id=run.info.run_id,
        sweep_id=run.data.tags.get(metrics.TAG_SWEEP_ID, ""),
        status=run.info.status,
        config={k: typed(v) for k, v in run.data.params.items() if not k.startswith(BOOKKEEPING)},
        metrics=dict(run.data.metrics),
        tags=dict(run.data.tags),
        reused=reused,
        start_ms=run.info.start_time,
        end_ms=run.info.end_time,
    )


def load_point(client: Any, run: Any, name: str, reused: bool = False) -> Point:
    """The point with its series; with the timings of the run that timed it again alone, where the
    sweep did (sweeper/track/retime.py)."""
    point, rid = point_of(run, name, reused), run.info.run_id
    point.loss = series(client, rid, metrics.TRAIN_LOSS)
    point.loss_epoch = series(client, rid, metrics.TRAIN_LOSS_EPOCH)
    point.precision = series(client, rid, metrics.TEST_PRECISION)
    point.epoch_s = series(client, rid, metrics.EPOCH_TIME)
    point.batch_ms_repeats = [v for _s, v in series(client, rid, metrics.BATCH_MS_REPEAT)]
    again = point.tags.get(metrics.TAG_TIMED_AGAIN_BY)
    if again:
        alone = client.get_run(again)
        repeats = [v for _s, v in series(client, again, metrics.BATCH_MS_REPEAT)]
        point = timed_again(point, alone, repeats)
    return point


def timed_again(point: Point, alone: Any, repeats: list[float]) -> Point:
    """``point`` with the timing figures (and their tags) of ``alone``, the run that timed it again
    alone at its sweep's end; what it trained and held stays its own."""
    own = {k: v for k, v in point.metrics.items() if not metrics.timing_metric(k)}
    taken = {k: v for k, v in alone.data.metrics.items() if metrics.timing_metric(k)}
    tags = {k: v for k, v in point.tags.items() if k not in metrics.TIMING_TAGS}
    tags.update({k: v for k, v in alone.data.tags.items() if k in metrics.TIMING_TAGS})
    return replace(point, metrics=own | taken, tags=tags, batch_ms_repeats=repeats)


def load_sweep(run: Any) -> Sweep:
    tags, params = run.data.tags, run.data.params
    return Sweep(
        sweep_id=tags.get(metrics.TAG_SWEEP_ID, run.info.run_id[:8]),
        run_id=run.info.run_id,
        name=run.info.run_name or "",
        status=run.info.status,
        command=tags.get(metrics.TAG_COMMAND, ""),
        overrides=params.get("sweep.overrides", ""),
        host=tags.get("sweepscale.host", ""),
        commit=tags.get(metrics.TAG_GIT_COMMIT, ""),
        version=tags.get(metrics.TAG_VERSION, ""),
        start_ms=run.info.start_time,
        end_ms=run.info.end_time,
        folder=tags.get(metrics.TAG_SWEEP_DIR, ""),
        search=json.loads(tags.get(metrics.TAG_SEARCH, "{}")),
    )


def planned_points(client: Any, parent_id: str) -> list[dict[str, Any]] | None:
    """The parent's list of points, or None for a sweep recorded before it was kept."""
    try:
        path = client.download_artifacts(parent_id, POINTS_ARTIFACT)
    except Exception:  # MLflow raises its own errors for a missing artifact
        return None
    with open(path) as f:
        return json.load(f)


def load(client: Any, parents: list[Any]) -> Study:
    """The study of one or more sweeps: every planned point's run, reused ones included."""
    sweeps = [load_sweep(p) for p in parents]
    by_name: dict[str, Point] = {}
    missing: list[tuple[str, str]] = []
    runs: list[Point] = []
    for sweep, parent in zip(sweeps, parents):
        children = client.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{metrics.TAG_SWEEP_ID}` = '{sweep.sweep_id}'",
            max_results=50000,
        )
        own = {
            r.info.run_name: r
            for r in children
            if r.info.run_id != parent.info.run_id and metrics.TAG_TIMED_AGAIN_FOR not in r.data.tags
        }
        planned = planned_points(client, parent.info.run_id)
        if planned is None:  # no list: every child is a point
            planned = [{"name": n} for n in sorted(own)]
        for entry in planned:
            name = entry["name"]
            if name in own:
                point = load_point(client, own[name], name)
                runs.append(point)
            elif entry.get("reused_run"):
                point = load_point(client, client.get_run(entry["reused_run"]), name, reused=True)
            else:
                missing.append((name, entry.get("why", "no run recorded")))
                continue
            earlier = by_name.get(name)
            # Several sweeps of one study: a FINISHED run wins over a failed one, a later over an earlier.
            if earlier is None or point.status == "FINISHED" or earlier.status != "FINISHED":
                by_name[name] = point
    missing = [(n, why) for n, why in missing if n not in by_name]
    return Study(sweeps, list(by_name.values()), missing, runs)
