"""hydra/sweeper=search: an asynchronous Optuna search run through the real sweeper, workers and
ranks (CPU), its study in a real SQLite storage; resumed, interrupted and pruned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import sweeper_command
from tests.test_sweeper import SLURM, children_of, hang_report, parents, runs, slurm, sweep
from tests.test_trainer_runs import trainer
from trainer import metrics
from trainer.errors import ConfigError
from trainer.lifecycle import progress

pytestmark = pytest.mark.mpi

SPACE = ["hydra/sweeper=search", "lr=tag(log,interval(0.01,1))", "nproc=1,2"]
TINY = ["device=cpu", "data.n_train=400", "data.n_test=100", "launcher.cpus=2"]


def study(folder: Path):
    import optuna

    storage = f"sqlite:///{folder / 'optuna.db'}"
    (name,) = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


def states(s) -> list[str]:
    return [t.state.name for t in s.get_trials(deepcopy=False)]


def test_space_from_hydra_grammar():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from sweeper.search.space import overrides, split

    args = ["lr=tag(log,interval(0.001,1))", "nproc=1,2", "hidden=range(16,80,16)", "reg=interval(0,0.1)"]
    space, fixed = split([*args, "epochs=2"])
    assert space["lr"] == FloatDistribution(0.001, 1.0, log=True)
    assert space["nproc"] == CategoricalDistribution([1, 2])
    assert space["hidden"] == IntDistribution(16, 64, step=16)
    assert space["reg"] == FloatDistribution(0.0, 0.1)
    assert fixed == ["epochs=2"]
    assert overrides({"lr": 0.01, "nproc": 2}) == ["lr=0.01", "nproc=2"]
    with pytest.raises(ConfigError, match="at least one value to search"):
        split(["lr=0.1"])
    with pytest.raises(ConfigError, match="a log scale needs a low end above 0"):
        split(["lr=tag(log,interval(0,1))"])


def test_a_search_tells_its_trials_and_resumes(tmp_path, mlflow_uri):
    args = [*SPACE, *TINY, "epochs=2"]
    first = sweep([*args, "hydra.sweeper.n_trials=4"], tmp_path, figures=True)
    assert first.returncode == 0, first.stdout + first.stderr
    s = study(tmp_path)
    assert states(s) == ["COMPLETE"] * 4
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert len(kids) == 4 and {r.info.status for r in kids.values()} == {"FINISHED"}
    by_trial = {int(r.data.tags[metrics.TAG_TRIAL]): r for r in kids.values()}
    for t in s.trials:  # each trial's run has its values; its nproc gave its shape (the worker's ranks)
        run = by_trial[t.number]
        assert float(run.data.params["lr"]) == pytest.approx(t.params["lr"])
        assert int(run.data.params["nproc"]) == t.params["nproc"]
        assert run.data.metrics[metrics.TEST_PRECISION] == pytest.approx(t.value)
        assert run.data.tags[metrics.TAG_RANK_DEVICES].count("/cpu") == t.params["nproc"]
    best = max(kids.values(), key=lambda r: r.data.metrics[metrics.TEST_PRECISION])
    assert s.best_value == pytest.approx(best.data.metrics[metrics.TEST_PRECISION])
    assert s.best_trial.user_attrs["run_id"] == best.info.run_id
    assert json.loads(parent.data.tags[metrics.TAG_SEARCH])["study"] == s.study_name
    assert parent.data.metrics["search/best"] == pytest.approx(s.best_value)
    shares = {k: v for k, v in parent.data.metrics.items() if k.startswith("search/importance/")}
    assert shares == {}  # #49: fANOVA's shares from 4 trials ranked noise; none below IMPORTANCE_TRIALS
    assert json.loads(parent.data.tags[metrics.TAG_SEARCH])["log"] == ["lr"]  # the figure's lr axis is logarithmic
    assert list(tmp_path.glob("multirun/*/*/report/search.png"))

    again = sweep([*args, "hydra.sweeper.n_trials=6"], tmp_path)  # the same study goes on: two more trials
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 of 6 trials done" in again.stdout
    assert states(study(tmp_path)) == ["COMPLETE"] * 6
    newer = max(parents(mlflow_uri), key=lambda r: r.info.start_time)
    assert {r.data.tags[metrics.TAG_TRIAL] for r in children_of(mlflow_uri, newer.info.run_id).values()} == {"4", "5"}
    assert "RUNNING" not in {r.info.status for r in runs(mlflow_uri)} and len(runs(mlflow_uri)) == 6 + 2

    full = sweep([*args, "hydra.sweeper.n_trials=6"], tmp_path)  # nothing left to ask: said, nothing started
    assert full.returncode == 2 and "already holds its 6 trials; raise hydra.sweeper.n_trials" in full.stderr
    assert len(runs(mlflow_uri)) == 8 and len(list(tmp_path.glob("multirun/*/*"))) == 2


@slurm
def test_a_search_on_slurm_streams_its_trials_to_warm_allocations(tmp_path, mlflow_uri):
    """#50: the README's search with launcher=slurm. Trials are asked as allocations free, an
    allocation per shape (nproc is an axis) serving its trials warm; every trial's run FINISHED
    in the Slurm job that trained it, and no allocation outlives the sweep."""
    tiny = ["device=cpu", "data.n_train=400", "data.n_test=100", "epochs=2"]
    args = [*SPACE, *tiny, *SLURM, "launcher.array_parallelism=2", "hydra.sweeper.n_trials=5"]
    result = sweep(args, tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert states(study(tmp_path)) == ["COMPLETE"] * 5
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert len(kids) == 5 and {r.info.status for r in kids.values()} == {"FINISHED"}
    jobs = {r.data.tags[metrics.TAG_SLURM_JOB] for r in kids.values()}
    assert len(jobs) < 5, jobs  # warm: an allocation served more than one trial
    for run in kids.values():
        assert run.data.tags["sweepscale.world_size"] == run.data.params["nproc"]
    # The seal ends the workers that served, a worker that never took a trial is cancelled, pending or
    # not (Slurm tests run one at a time: any job listed is this sweep's); within seconds, not at once.
    deadline, left = time.monotonic() + 60, "?"
    while left and time.monotonic() < deadline:
        left = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30).stdout.strip()
        time.sleep(1)
    assert left == "", left


def test_time_to_target_as_the_objective(tmp_path, mlflow_uri):
    # Minimized by default; each trial told its training seconds to the target, by hand from its run.
    args = [*SPACE, *TINY, "epochs=5", "hydra.sweeper.n_trials=3", "hydra.sweeper.objective=time_to_target"]
    result = sweep([*args, "report.target=0.5"], tmp_path, figures=True)
    assert result.returncode == 0, result.stdout + result.stderr
    s = study(tmp_path)
    assert s.direction.name == "MINIMIZE" and states(s) == ["COMPLETE"] * 3
    from trainer.record import store

    client = store.client(mlflow_uri)
    (parent,) = parents(mlflow_uri)
    for run in children_of(mlflow_uri, parent.info.run_id).values():
        history = {
            k: client.get_metric_history(run.info.run_id, k) for k in (metrics.TEST_PRECISION, metrics.EPOCH_TIME)
        }
        seconds = {m.step: m.value for m in history[metrics.EPOCH_TIME]}
        reached = sorted(m.step for m in history[metrics.TEST_PRECISION] if m.value >= 0.5)
        expected = sum(v for e, v in seconds.items() if e <= reached[0]) if reached else float("inf")
        assert s.trials[int(run.data.tags[metrics.TAG_TRIAL])].value == pytest.approx(expected)
    assert list(tmp_path.glob("multirun/*/*/report/search.png"))


def process_tree(root: int) -> str:
    """``ps``'s lines of ``root`` and its descendants: state, kernel wait, age, command."""
    lines = subprocess.run(["ps", "-e", "-o", "pid,ppid,stat,wchan:24,etime,args"], capture_output=True, text=True)
    head, *rows = lines.stdout.splitlines()
    parent = {int(r.split()[0]): int(r.split()[1]) for r in rows}

    def mine(pid: int) -> bool:
        while pid not in (root, 0, 1) and pid in parent:
            pid = parent[pid]
        return pid == root

    return "\n".join([head] + [r[:300] for r in rows if mine(int(r.split()[0]))])


def test_an_interrupted_search_asks_its_trials_again(tmp_path, mlflow_uri):
    # Long trials; Ctrl-C (SIGINT to the sweeper) once one trains (the other waits for its cores, or trains too).
    args = [*SPACE, *TINY, "epochs=200", "hydra.sweeper.n_trials=2"]
    cmd = sweeper_command(args)
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while sum(r.info.status == "RUNNING" for r in runs(mlflow_uri)) < 2 and time.monotonic() < deadline:  # parent
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        tree = process_tree(proc.pid)  # before the kill: what each of its processes waits in
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the sweep outlived its Ctrl-C by 120 s\n{hang_report(tmp_path, out, '')}\n{tree}")
    assert proc.returncode == 130, out
    assert "RUNNING" not in {r.info.status for r in runs(mlflow_uri)}, out
    s = study(tmp_path)
    asked = sorted((t.params["lr"], t.params["nproc"]) for t in s.trials if t.state.name == "FAIL")
    assert len(asked) == 2 and s.user_attrs["interrupted"] == [0, 1]
    assert states(s).count("WAITING") == 2  # queued to be asked again

    resumed = sweep(args, tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    s = study(tmp_path)
    done = sorted((t.params["lr"], t.params["nproc"]) for t in s.trials if t.state.name == "COMPLETE")
    assert done == asked and "2 of 2 trials" in resumed.stdout
    status = [r.info.status for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
    assert status.count("FINISHED") == 2 and set(status) == {"FINISHED", "KILLED"}  # the interrupted: KILLED


def test_a_ctrl_c_inside_a_trials_store_write_interrupts_once_the_write_is_whole(tmp_path):
    """The watch asks and tells Optuna with interrupts held: a Ctrl-C that came halfway through a
    tell's SQL (CI's search once failed its interrupted trials on "database is locked") interrupts
    after it, the trial told in full and the store free for the sweep's last writes."""
    import optuna
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from sweeper.track.watch import interrupts_held

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=url, study_name="s")
    trial = study.ask()

    sent: list[str] = []

    def ctrl_c_mid_write(_conn, _cursor, statement, *_args) -> None:
        if not sent and statement.lstrip().upper().startswith(("UPDATE", "INSERT")):
            sent.append(statement)
            os.kill(os.getpid(), signal.SIGINT)

    event.listen(Engine, "before_cursor_execute", ctrl_c_mid_write)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_held():
            study.tell(trial, 0.5)
    finally:
        event.remove(Engine, "before_cursor_execute", ctrl_c_mid_write)
    assert sent  # the Ctrl-C came inside the tell's writes
    elsewhere = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    assert [(t.state.name, t.value) for t in elsewhere.trials] == [("COMPLETE", 0.5)]
    elsewhere.enqueue_trial({"lr": 0.1})  # a write: the store is not left locked
    assert len(elsewhere.trials) == 2


def test_pruned_trials_stop_between_epochs(tmp_path, mlflow_uri):
    # No trial reaches 0.99 on 400 digits: the threshold pruner stops each after an epoch or a few.
    prune = ["hydra.sweeper.pruner=threshold", "hydra.sweeper.prune_threshold=0.99", "hydra.sweeper.n_trials=3"]
    # 2000 epochs of 20 batches: minutes if nothing stopped them, whatever the machine's speed.
    result = sweep([*SPACE, *TINY, "epochs=2000", "batch_size=20", *prune], tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert states(study(tmp_path)) == ["PRUNED"] * 3 and "3 of 3 trials (3 pruned)" in result.stdout
    (parent,) = parents(mlflow_uri)
    assert parent.info.status == "FINISHED"
    from trainer.record import store

    client = store.client(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert len(kids) == 3
    for run in kids.values():
        assert run.info.status == "KILLED"
        assert "pruned by the search's threshold pruner" in run.data.tags[metrics.TAG_STOPPED]
        epochs = len(client.get_metric_history(run.info.run_id, metrics.TEST_PRECISION))
        assert 1 <= epochs < 2000  # stopped between epochs, every epoch it trained recorded
    assert len({r.data.tags[metrics.TAG_WORKER] for r in kids.values()}) <= 2  # a pruned point ends no worker


def test_a_run_reading_its_stop_as_the_sweeper_writes_it_reads_the_whole_reason(tmp_path):
    """A pruned trial's run reads ``stop`` between epochs while the sweeper writes it: it read the
    file created but not yet written, and tagged its run "asked" instead of why (CI, once)."""
    import threading

    folders = [tmp_path / str(i) for i in range(300)]
    for f in folders:
        f.mkdir()
    read, done = [], threading.Event()

    def run_reading() -> None:
        while not done.is_set():
            read.extend(w for f in folders if (w := progress.stop_asked(f)) is not None)

    reader = threading.Thread(target=run_reading)
    reader.start()
    for f in folders:
        progress.ask_stop(f, "pruned by the search's threshold pruner")
    done.set()
    reader.join()
    assert read and set(read) == {"pruned by the search's threshold pruner"}


def test_a_run_stops_when_its_sweep_asks(idx_dir, mlflow_uri, tmp_path):
    # The trainer's side alone, on two real ranks: a stop asked before the first epoch ends it after that epoch.
    folder = tmp_path / "point"
    folder.mkdir()
    progress.ask_stop(folder, "pruned by a test")
    args = ["nproc=2", "epochs=5", "batch_size=20", "device=cpu", f"data.dir={idx_dir}", f"save.progress_dir={folder}"]
    result = trainer(args, tmp_path)
    assert result.returncode == 0, result.stderr
    (run,) = runs(mlflow_uri)
    assert run.info.status == "KILLED"
    assert run.data.tags[metrics.TAG_STOPPED].startswith("stopped after epoch 1 of 5 at the sweep's request")
    lines = progress.read(folder)
    assert [line["epoch"] for line in lines] == [1]
    assert lines[0][metrics.TEST_PRECISION] == pytest.approx(run.data.metrics[metrics.TEST_PRECISION])


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["hydra.sweeper.pruner=threshold"], "hydra.sweeper.pruner=threshold needs hydra.sweeper.prune_threshold"),
        (["hydra.sweeper.pruner=median", "hydra.sweeper.objective=perf/tflops"], "use one of test/precision"),
        (["hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0: a search needs at least 1 trial"),
        (["hydra.sweeper.objective=time_to_target"], "needs the test precision to reach: set report.target"),
        (["launcher.warm=false"], "runs its trials on warm workers: set launcher.warm=true (the default)"),
        (
            ["nproc=1,3", "launcher.oversubscribe=false"],  # TINY has launcher.cpus=2
            "nproc=3 needs 3 CPU cores but this machine has 2",
        ),
        (["hydra.sweeper.n_trail=3"], "Key 'n_trail' not in 'SearchSweeperConfig'"),
        (["hydra.sweeper.objective=bogus"], "hydra.sweeper.objective=bogus: no run records it; use one of"),
        (["reg=interval(0.5,0.01)"], "reg=interval(0.5,0.01): an interval runs from its low end to a higher one"),
    ],
    ids=["threshold", "objective", "trials", "target", "cold", "nproc", "unknown-key", "bogus-objective", "reversed"],
)
def test_a_search_refused_before_anything_starts(extra, said, tmp_path, mlflow_uri):
    space = [a for a in SPACE if not (a.startswith("nproc=") and any(e.startswith("nproc=") for e in extra))]
    result = sweep([*space, *TINY, "epochs=1", *extra], tmp_path, timeout=60)
    assert result.returncode != 0 and said in result.stderr, result.stdout + result.stderr
    assert not list(tmp_path.glob("multirun/*/*")), "no sweep folder left"
    assert not (tmp_path / "optuna.db").exists() and runs(mlflow_uri) == []


def test_a_searched_value_is_coloured_not_panelled():
    # A search's lr has a value per trial: a row of loss panels each would be 12 rows (seconds to draw).
    from sweeper.report.convergence import _colour_and_panel
    from sweeper.report.study import Point

    def point(i: int, hidden: int) -> Point:
        return Point(f"t{i}", f"r{i}", "s", "FINISHED", {"hidden": hidden, "lr": 0.01 * (i + 1)}, {}, {})

    points = [point(i, (16, 32, 64)[i % 3]) for i in range(12)]
    assert _colour_and_panel(points, ["hidden", "lr"]) == ("lr", "hidden")  # swapped: lr a colour bar
    assert _colour_and_panel(points, ["lr", "hidden"]) == ("lr", "hidden")
    assert _colour_and_panel(points[:4], ["hidden", "lr"]) == ("hidden", "lr")  # few values: panels as before
    both = [Point(f"t{i}", f"r{i}", "s", "FINISHED", {"hidden": 16 + i, "lr": 0.01 * i}, {}, {}) for i in range(12)]
    assert _colour_and_panel(both, ["hidden", "lr"]) == ("hidden", None)
