"""An adaptive search: Optuna asks for a trial the moment a slot frees, never a batch at a time.

    python -m sweeper -m hydra/sweeper=search 'lr=tag(log,interval(0.001,1))' nproc=1,2 \\
        hydra.sweeper.n_trials=24 hydra.sweeper.objective=test/precision

Each trial is a point like a grid's (its nproc decides its shape and so its warm workers' queue;
sweeper/runners/warm.py streams its tickets), recorded as a child run tagged with its trial number.
The sweep keeps as many trials in flight as the machine has GPUs (or cores, on CPU), and one more;
each one whose run ends with its training is told to the study (its run's metric, or its time to a
target precision), and the next is asked at once. The study lives
in Optuna's storage (by default ``optuna.db`` beside a SQLite MLflow store): the same command run
again goes on with the same study until it holds ``n_trials`` trials; trials an interrupted sweep
left unfinished are asked again with their values.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from typing import Any

from sweeper import display
from sweeper.points import Point
from sweeper.search.options import SearchOptions, check, pruner, storage_for, study_name
from sweeper.search.space import label, overrides, split
from trainer import metrics
from trainer.errors import ConfigError
from trainer.lifecycle import progress
from trainer.lifecycle.queue_files import TRAINED
from trainer.ranks.processes import alive, owner

INTERRUPTED = "interrupted"  # the study's user attribute: trials whose sweep ended first (asked again on resume)
SWEEPER = "sweeper"  # a trial's user attribute: "host pid" of the sweeper running it

# fANOVA apportions the objective's variance over the keys: with fewer trials it ranked noise (#49:
# nproc "mattered" after 5 trials). Below this the report says nothing of importance.
IMPORTANCE_TRIALS = 10


class Search:
    """The study, and the trials of this sweep: point index == trial number."""

    def __init__(
        self,
        arguments: list[str],
        opts: SearchOptions,
        tracking_uri: str,
        make_point: Callable[[int, list[str], str], Point],
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's own lines say what it does
        self.space, self.fixed = split(arguments)
        self.opts, self.make_point = opts, make_point
        check(opts)
        self.storage = storage_for(opts.storage, tracking_uri)
        self.name = opts.study_name or study_name(self.space, self.fixed, opts)
        self.study: Any = None  # opened once the sweep's checks passed (open)
        self.trials: dict[int, Any] = {}  # point index -> its trial, asked and not yet told
        self.seen: dict[int, int] = {}  # point index -> the epochs of its progress reported to the study
        self.stopping: set[int] = set()  # points asked to stop (pruned)
        self.points: list[Point] = []  # every point this sweep asked for, in order
        self.width = 1  # trials kept in flight (open)

    def open(self, width: int) -> int:
        """Open (or resume) the study, ``width`` trials to keep in flight; returns how many trials
        an interrupted sweep left, asked again first."""
        import optuna
        from sqlalchemy.exc import SQLAlchemyError

        self.width = max(1, width)
        try:
            self.study = optuna.create_study(
                study_name=self.name,
                storage=self.storage,
                pruner=pruner(self.opts, self.width),
                direction=self.opts.direction,
                load_if_exists=True,
            )
        except (ImportError, OSError, ValueError, SQLAlchemyError, optuna.exceptions.OptunaError) as e:
            raise ConfigError(
                f"hydra.sweeper.storage={self.storage}: Optuna could not open it ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200]}); e.g. sqlite:///optuna.db or postgresql+psycopg2://user@host/db"
            ) from None
        # Seeded by the trials so far: a resumed study must not draw its first trials' values again.
        seed = None if self.opts.seed is None else self.opts.seed + len(self.study.trials)
        with warnings.catch_warnings():  # constant_liar is "experimental" since Optuna 2.8: said once is enough
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.study.sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)  # in flight: no repeats
        return self._recover()

    def _recover(self) -> int:
        """Trials a sweep left RUNNING whose sweeper is gone: failed as interrupted, their values
        queued to be asked again. Returns how many."""
        from optuna.trial import TrialState

        again = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            who = str(t.user_attrs.get(SWEEPER, "")).split()
            if len(who) == 2 and who[0] == owner().split()[0] and alive(int(who[1])):
                raise ConfigError(
                    f"study {self.name} in {self.storage} is searched by another sweeper ({' '.join(who)}) "
                    "right now; wait for its end, or name another with hydra.sweeper.study_name=..."
                )
            self.study.tell(t.number, state=TrialState.FAIL)
            self._mark_interrupted([t.number])
            self.study.enqueue_trial(t.params, skip_if_exists=False)
            again += 1
        return again

    def _mark_interrupted(self, numbers: list[int]) -> None:
        """Trials failed by an interruption, not by their values: they do not count (a study's user attribute)."""
        seen = set(self.study.user_attrs.get(INTERRUPTED, []))
        self.study.set_user_attr(INTERRUPTED, sorted(seen | set(numbers)))

    def counted(self) -> int:
        """Trials the study holds that count towards n_trials: ended, but not by an interruption."""
        from optuna.trial import TrialState

        ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        skip = set(self.study.user_attrs.get(INTERRUPTED, []))
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=ended) if t.number not in skip)

    def left(self) -> int:
        """Trials still to ask: n_trials less those counted and those in flight."""
        return max(0, self.opts.n_trials - self.counted() - len(self.trials))

    def ask(self, n: int) -> list[Point]:
        """Up to ``n`` new trials as points (planned by the caller); a trial whose config cannot
        run (a ConfigError) is told failed at once, with its reason."""
        out = []
        for _ in range(min(n, self.left())):
            trial = self.study.ask(self.space)
            trial.set_user_attr(SWEEPER, owner())
            values = overrides(trial.params)
            try:  # the trial's number in its run's name: two trials may ask for one config
                point = self.make_point(
                    trial.number, [*self.fixed, *values], ",".join([f"trial={trial.number}", *label(trial.params)])
                )
            except ConfigError as e:
                self.study.tell(trial, state=_state("FAIL"))
                display.console.print(f"trial {trial.number} ({','.join(values)}) cannot run: {e}")
                continue
            self.trials[point.index] = trial
            self.points.append(point)
            out.append(point)
        return out

    def step(
        self,
        finished: dict[int, BaseException | None],
        run_of: Callable[[Point], Any],
        ready: Callable[[list[Point]], list[Point]],
    ) -> list[Point]:
        """Tell the trials that ended (``finished``: point index -> its job's error) with their runs
        (``run_of``), then ask for as many as the slots they freed: ``ready`` plans and writes them,
        keeping those to run. The new points to queue."""
        for point in [p for p in self.points if p.index in self.trials]:
            if point.index in finished:
                self.tell(point, run_of(point), finished[point.index])
            elif (point.dir / TRAINED).exists():  # trained, its CPU check still computing: told once its run ended
                if (run := run_of(point)) is not None and run.info.status != "RUNNING":
                    self.tell(point, run, None)
            elif self.opts.pruner != "none":
                self._judge(point)
        new: list[Point] = []
        while len(self.trials) < self.width and self.left() > 0:  # a trial ready tells at once is asked again
            new += ready(self.ask(self.width - len(self.trials)))
        return new

    def _judge(self, point: Point) -> None:
        """A running trial's new epochs reported to the study; pruned, its run asked to stop."""
        trial, seen = self.trials[point.index], self.seen.get(point.index, 0)
        for line in progress.read(point.dir, seen):
            seen += 1
            value = line.get(self.opts.objective)
            if value is None or point.index in self.stopping:
                continue
            trial.report(float(value), int(line["epoch"]))
            if trial.should_prune():
                why = f"pruned by the search's {self.opts.pruner} pruner: {self.opts.objective}={value:.4g}"
                progress.ask_stop(point.dir, f"{why} at epoch {line['epoch']}")
                self.stopping.add(point.index)
        self.seen[point.index] = seen

    def tell(self, point: Point, run: Any, error: BaseException | None) -> None:
        """The trial's result: its run's objective metric, or failed (no run, an error, no metric)."""
        trial = self.trials.pop(point.index, None)
        if trial is None:
            return
        value = None if run is None or error is not None else self.value(point, run)
        if run is not None:
            trial.set_user_attr("run_id", run.info.run_id)
        if error is None and run is not None and metrics.TAG_STOPPED in run.data.tags:  # it stopped when asked
            self.study.tell(trial, state=_state("PRUNED"))
            return
        if value is None:
            self.study.tell(trial, state=_state("FAIL"))
            why = error or f"its run recorded no {self.opts.objective}"
            display.console.print(f"trial {trial.number} ({point.name}) failed: {str(why).splitlines()[0][:200]}")
            return
        self.study.tell(trial, value)

    def value(self, point: Point, run: Any) -> float | None:
        """The trial's objective: its run's metric, or its training seconds to report.target (from
        the epochs it wrote; infinity where it never reached the target: the study ranks it last)."""
        if self.opts.objective != metrics.TIME_TO_TARGET:
            return run.data.metrics.get(self.opts.objective)
        from sweeper.report.analysis import seconds_to_target

        lines = progress.read(point.dir)
        precision = [
            (x["epoch"], x[metrics.TEST_PRECISION]) for x in lines if x.get(metrics.TEST_PRECISION) is not None
        ]
        seconds = seconds_to_target(precision, [(x["epoch"], x[metrics.EPOCH_TIME]) for x in lines], self.opts.target)
        return math.inf if seconds is None else seconds

    def fail(self, point: Point, error: BaseException) -> None:
        """A trial that cannot run here (its config refused): failed, with its reason, and no point."""
        self.points.remove(point)
        self.tell(point, None, error)

    def interrupted(self) -> None:
        """The sweep stopped with trials in flight: failed as interrupted, asked again next time."""
        for trial in self.trials.values():
            self.study.tell(trial, state=_state("FAIL"))
            self.study.enqueue_trial(trial.params, skip_if_exists=False)
        self._mark_interrupted([t.number for t in self.trials.values()])
        self.trials.clear()

    def best(self) -> float | None:
        """The study's best value so far (this sweep's trials and earlier ones), or None."""
        try:
            return float(self.study.best_value)
        except ValueError:  # no trial completed
            return None

    def importances(self) -> dict[str, float]:
        """Each searched key's share of the objective's variance (Optuna's fANOVA, seeded), where
        the study has IMPORTANCE_TRIALS completed trials and more than one key; else empty."""
        import optuna
        from optuna.trial import TrialState

        complete = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if len(self.space) < 2 or len(complete) < IMPORTANCE_TRIALS:
            return {}
        try:
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            found = optuna.importance.get_param_importances(self.study, evaluator=evaluator)
        except (RuntimeError, ValueError):  # e.g. every trial with one value: nothing to apportion
            return {}
        return {k: float(v) for k, v in found.items()}

    def describe(self, importance: dict[str, float]) -> str:
        """The parent run's tag (JSON): the study, where it lives, towards what, what was searched
        and how much each searched key mattered."""
        doc = {
            "study": self.name,
            "storage": self.storage,
            "objective": self.opts.objective,
            "direction": self.opts.direction,
            "searched": list(self.space),
            "log": [k for k, d in self.space.items() if getattr(d, "log", False)],  # sampled on a log scale
            "importance": importance,
            "target": self.opts.target,
        }
        return json.dumps(doc)

    def summary(self) -> str:
        """Where the study stands and its best trial so far, in a line."""
        from optuna.trial import TrialState

        pruned = len(self.study.get_trials(deepcopy=False, states=(TrialState.PRUNED,)))
        head = f"study {self.name}: {self.counted()} of {self.opts.n_trials} trials" + (
            f" ({pruned} pruned)" if pruned else ""
        )
        try:
            best = self.study.best_trial
        except ValueError:
            return f"{head}; none completed yet ({self.storage})"
        values = ",".join(overrides(best.params))
        return (
            f"{head}; best {self.opts.objective}={best.value:.4g} in trial {best.number} ({values}), "
            f"run {best.user_attrs.get('run_id', '-')}"
        )


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]
