"""Per-epoch checkpoints (trainer/record/checkpoint.py) and the time-limit warning (trainer/lifecycle/requeue.py):
a run stopped at any point resumes into the same MLflow run and ends as if never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.test_trainer_runs import COMMON, final_weights, only_run, trainer
from trainer import data, metrics
from trainer.core import model
from trainer.core.generic_step import generic
from trainer.core.loop import Schedule, fit
from trainer.record import checkpoint

pytestmark = pytest.mark.mpi


def steps(client, run, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def assert_complete(client, run, epochs: int, batches: int) -> None:
    """One value per step of every curve: nothing lost, nothing logged twice."""
    assert steps(client, run, metrics.TRAIN_LOSS) == list(range(epochs * batches))
    for key in (metrics.TRAIN_LOSS_EPOCH, metrics.TEST_PRECISION, metrics.EPOCH_TIME):
        assert steps(client, run, key) == list(range(1, epochs + 1)), key


def test_a_killed_run_resumes_into_the_same_run(idx_dir, mlflow_uri, tmp_path):
    """Rank 1 SIGKILLed in epoch 2 of 3 (nproc=2): started again with the same config, the run goes
    on from epoch 1's checkpoint in the same MLflow run, and ends as the sequential run does. Its
    check (check.steps=5, in epoch 1) compares the weights it copied after step 5 before the kill,
    kept in the checkpoint, as an uninterrupted run does."""
    ck = tmp_path / "ck"
    args = [*COMMON, "epochs=3", "nproc=2", "check.steps=5", f"data.dir={idx_dir}", f"save.checkpoint_dir={ck}"]
    killed = trainer([*args, "fault.kind=kill", "fault.rank=1", "fault.iteration=12"], tmp_path)
    assert killed.returncode != 0
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"  # the launching process ended it (trainer/lifecycle/launch.py)
    assert (ck / checkpoint.FILE).exists()

    other = trainer([*args, "lr=0.1"], tmp_path)  # another config: refused before any rank starts
    assert other.returncode == 2
    assert f"save.checkpoint_dir={ck}: its checkpoint is of another config" in other.stderr

    resumed = trainer(args, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "from its checkpoint after epoch 1/3" in " ".join(resumed.stdout.split())  # rich wraps lines
    client, again = only_run(mlflow_uri)  # the same run, not a second one
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.tags[metrics.TAG_RESUMED_FROM_EPOCH] == "1"
    assert_complete(client, again, epochs=3, batches=9)  # 57 samples in batches of 7
    assert again.data.tags[metrics.TAG_CHECK] == "done" and again.data.tags[metrics.TAG_CHECK_STEPS] == "5"
    assert again.data.metrics[metrics.weight_error("max")] < 1e-12  # the 5-step reference, in float64
    ds = data.load(str(idx_dir), 57, None, "float64")  # and the uninterrupted sequential run's end
    layout = model.Layout(D=784, H=16)
    init = model.init_params(layout, 0, "float64")
    expected = fit(generic(np, layout, init), np, init, ds.x_train, ds.y_train, Schedule(7, 0.3, 1e-4, 3, False, 0))
    got = final_weights(client, again)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-12
    assert not (ck / checkpoint.FILE).exists()  # a FINISHED run leaves none
    # Its core-seconds count the killed process's epoch too (#50: they counted the last start's only).
    epoch_s = [m.value for m in client.get_metric_history(run.info.run_id, metrics.EPOCH_TIME)]
    training = again.data.metrics[metrics.device_seconds("cpu", training=True)]
    assert len(epoch_s) == 3 and training == pytest.approx(2 * sum(epoch_s)), (training, epoch_s)
    assert again.data.metrics[metrics.device_seconds("cpu")] > training


def test_resuming_from_any_epoch_gives_bit_identical_weights():
    """What a checkpoint holds is all the loop needs: epochs 1..k, then k+1..n from the weights
    alone, equal the n epochs in one go, bit for bit (float64, shuffled)."""
    ds = data.load_embedded_digits()
    x, y = ds.x_train[:57].astype(np.float64), ds.y_train[:57]
    layout = model.Layout(D=784, H=16)
    init = model.init_params(layout, 0, "float64")
    schedule = Schedule(7, 0.3, 1e-4, 4, shuffle=True, seed=3)

    def train(params: np.ndarray, schedule: Schedule, start_epoch: int = 1) -> np.ndarray:
        return fit(generic(np, layout, params), np, params, x, y, schedule, start_epoch=start_epoch)

    straight = train(init.copy(), schedule)
    for k in (1, 3):
        first = train(init.copy(), replace(schedule, epochs=k))
        assert np.array_equal(train(first, schedule, start_epoch=k + 1), straight)


def test_the_time_limit_warning_stops_at_an_epoch_end_with_a_clear_error(idx_dir, mlflow_uri, tmp_path):
    """SIGUSR2 (Slurm's warning, --signal=USR2@90) with no requeue left: the run ends FAILED
    after the epoch it was in, saying how far it got and what to do, its checkpoint kept."""
    ck = tmp_path / "ck"
    args = [*COMMON, "epochs=400", "check.reference=false", f"data.dir={idx_dir}", f"save.checkpoint_dir={ck}"]
    env = {**os.environ, "SWEEPSCALE_MAX_REQUEUES": "0"}
    cmd = [sys.executable, "-m", "trainer", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (ck / checkpoint.FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"
    ckpt = np.load(ck / checkpoint.FILE)
    epoch = int(ckpt["epoch"])
    assert 1 <= epoch < 400
    error = run.data.tags[metrics.TAG_ERROR]
    assert f"time limit after epoch {epoch} of 400; raise launcher.timeout_min or resume" in error
    assert steps(client, run, metrics.TRAIN_LOSS_EPOCH) == list(range(1, epoch + 1))

    assert (ck / checkpoint.FILE).exists()  # what `python -m trainer` with the same arguments resumes from


def test_the_trainer_asks_for_a_requeue_while_requeues_are_left(idx_dir, mlflow_uri, tmp_path, monkeypatch):
    """Within launcher.max_requeues, the warned run ends KILLED (it resumes after the requeue) and
    the trainer exits with the status its job wrapper requeues on."""
    from trainer.lifecycle.requeue import REQUEUE_STATUS

    ck = tmp_path / "ck"
    args = [*COMMON, "epochs=400", "check.reference=false", f"data.dir={idx_dir}", f"save.checkpoint_dir={ck}"]
    env = {**os.environ, "SWEEPSCALE_MAX_REQUEUES": "2", "SLURM_RESTART_COUNT": "1"}
    cmd = [sys.executable, "-m", "trainer", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (ck / checkpoint.FILE).exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == REQUEUE_STATUS, err
    _, run = only_run(mlflow_uri)
    assert run.info.status == "KILLED"
    assert "requeued to resume (1 requeue(s) left)" in run.data.tags[metrics.TAG_ERROR]


def test_checkpoints_are_written_whole(tmp_path: Path):
    """A reader never sees half a checkpoint: the file appears by rename, the temporary is gone."""
    ckpt = checkpoint.Checkpoint(np.arange(5.0), 2, 18, "run", "key", np.ones(9), np.full(9, 7), 0.5, np.nan)
    checkpoint.save(tmp_path, ckpt)
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.FILE]
    back = checkpoint.load(tmp_path, "key")
    assert back.epoch == 2 and back.iteration == 18 and back.run_id == "run" and np.isnan(back.precision)
    assert np.array_equal(back.params, ckpt.params)
