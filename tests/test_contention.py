"""What else ran while a run's batches were timed (trainer/ranks/contention.py): real processes holding
the host's timing lock, and real trainer runs recording what they saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import MPIEXEC
from tests.test_trainer_runs import COMMON, only_run, trainer
from trainer import metrics
from trainer.ranks.contention import TimedSpan

HOLD = """
import json, sys, time
from trainer.ranks.contention import TimedSpan
gpus = sys.argv[4].split(",") if len(sys.argv) > 4 else None  # a GPU run's GPUs; none: CPU ranks
units = f"1 rank(s) on gpu {sys.argv[4]}" if gpus else "1 rank(s) on cpu"
with TimedSpan(sys.argv[1], sys.argv[2] == "exclusive", units, say=lambda m: print(m, flush=True), gpus=gpus) as s:
    print("timing", flush=True)
    if sys.argv[3] == "stdin":
        sys.stdin.readline()  # until the test says
    else:
        time.sleep(float(sys.argv[3]))
print(json.dumps({"beside": s.beside, "alongside": s.alongside, "waited_s": s.waited_s, "start": s.start,
                  "end": s.end}), flush=True)
"""


def hold(name: str, timing: str, seconds: float | str, gpus: str | None = None) -> subprocess.Popen:
    """A process timing for ``seconds`` (or until a line on its stdin: "stdin"), on ``gpus`` ("0,1")
    or on the CPU; returns once its span has begun (or it waits for the host)."""
    cmd = [sys.executable, "-c", HOLD, name, timing, str(seconds), *([gpus] if gpus else [])]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()  # "timing", or "waiting for this host: ..."
    return proc


def ended(proc: subprocess.Popen) -> dict:
    """What the span said at its end. Read through the same buffered stream as hold()'s readline:
    communicate() reads the pipe itself and would miss a line that readline had already buffered."""
    if proc.stdin is not None:
        try:
            proc.stdin.write("go\n")
            proc.stdin.close()
        except BrokenPipeError:  # it had ended by itself
            pass
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0
    return json.loads(out.strip().splitlines()[-1])


def test_shared_spans_that_overlap_name_each_other():
    a = hold("a", "shared", 2)
    b = hold("b", "shared", 0.5)
    first, second = ended(a), ended(b)
    assert first["beside"] == ["b (1 rank(s) on cpu)"] and second["beside"] == ["a (1 rank(s) on cpu)"]
    assert first["waited_s"] < 0.5 and second["waited_s"] < 0.5  # shared: nobody waits
    later = hold("c", "shared", 0)
    assert ended(later)["beside"] == []  # a and b ended before c began


def test_gpu_runs_on_other_gpus_are_alongside_not_beside():
    """Runs on disjoint GPUs time apart (measured: docs/benchmarks.md); a shared GPU, or CPU ranks on
    the host's cores, are company."""
    a, b, c = hold("a", "shared", "stdin", "0"), hold("b", "shared", "stdin", "1,2"), hold("c", "shared", "stdin", "2")
    cpu = hold("cpu", "shared", "stdin")
    first, second, third, plain = ended(a), ended(b), ended(c), ended(cpu)
    assert first["alongside"] == ["b (1 rank(s) on gpu 1,2)", "c (1 rank(s) on gpu 2)"]
    assert first["beside"] == ["cpu (1 rank(s) on cpu)"]
    assert second["beside"] == ["c (1 rank(s) on gpu 2)", "cpu (1 rank(s) on cpu)"]
    assert third["beside"] == ["b (1 rank(s) on gpu 1,2)", "cpu (1 rank(s) on cpu)"]
    assert len(plain["beside"]) == 3 and plain["alongside"] == []


def test_an_exclusive_span_waits_for_the_host_and_has_nothing_beside():
    a = hold("a", "shared", 1.5)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, "x", "exclusive", "1"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("waiting for this host: other runs' batches are timing")
    b = hold("b", "shared", 0)  # started while x waits for a: b waits for x (or goes before it)
    first, x, last = ended(a), ended(proc), ended(b)
    assert x["waited_s"] > 0.5 and x["beside"] == [] and "x (1 rank(s) on cpu)" not in first["beside"]
    assert x["start"] >= first["end"] and (last["start"] >= x["end"] or last["end"] <= x["start"])


def test_a_process_that_died_timing_is_not_beside_anyone(timing_folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, "dead", "shared", "60"], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    proc.kill()
    proc.wait()
    with TimedSpan("alive", False, "cpu") as span:
        pass
    assert span.beside == [] and [p.name for p in timing_folder.glob("*.json")] == [span.marker.name]


@pytest.mark.mpi
def test_a_run_records_what_ran_beside_its_timed_batches(idx_dir, mlflow_uri, tmp_path):
    """A run timed while another process times (shared) names it, and is named by it."""
    beside = hold("other point", "shared", "stdin")  # until the run has ended
    result = trainer([*COMMON, f"data.dir={idx_dir}", "mlflow.run_name=mine"], tmp_path)
    assert result.returncode == 0, result.stderr
    _client, run = only_run(mlflow_uri)
    assert run.data.metrics[metrics.BESIDE] == 1 and run.data.tags[metrics.TAG_TIMING_POLICY] == "shared"
    assert run.data.tags[metrics.TAG_BESIDE] == "other point (1 rank(s) on cpu)"
    assert ended(beside)["beside"] == ["mine (1 rank(s) on cpu)"]


@pytest.mark.mpi
def test_an_exclusive_run_waits_for_the_host_and_times_alone(idx_dir, mlflow_uri, tmp_path):
    """Real ranks (nproc=2): rank 0 waits for the host while the others wait at the barrier."""
    beside = hold("other point", "shared", "stdin")
    args = [*COMMON, f"data.dir={idx_dir}", "perf.timing=exclusive", "nproc=2"]
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "trainer", *args]
    run_proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = run_proc.stdout.readline()
    while first and "waiting for this host" not in first:
        first = run_proc.stdout.readline()
    assert first.startswith("waiting for this host: other runs' batches are timing"), first
    time.sleep(1)  # the run waits as long as the other times
    other = ended(beside)
    out, _ = run_proc.communicate(timeout=120)
    assert run_proc.returncode == 0, out
    _client, run = only_run(mlflow_uri)
    assert run.data.metrics[metrics.BESIDE] == 0 and metrics.TAG_BESIDE not in run.data.tags
    assert run.data.tags[metrics.TAG_TIMING_POLICY] == "exclusive" and other["beside"] == []
    assert run.data.metrics[metrics.HOST_WAIT_S] > 1


def on_core_zero() -> None:
    os.sched_setaffinity(0, {0})


@pytest.mark.mpi
def test_ranks_that_share_one_core_record_how_long_they_waited_for_it(idx_dir, mlflow_uri, tmp_path):
    """Real ranks (nproc=2) on one core, as when other processes take a rank's core: no other run
    is beside the timed batches, but each rank waited for the core while the other had it, which
    the run records (the report then trusts no speedup from it: tests/test_report_analysis.py)."""
    args = [*COMMON, f"data.dir={idx_dir}", "nproc=2", "epochs=20"]
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "trainer", *args]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=on_core_zero)
    assert result.returncode == 0, result.stderr
    _client, run = only_run(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.metrics[metrics.BESIDE] == 0
    assert 0.2 < run.data.metrics[metrics.CORE_WAIT] <= 1, run.data.metrics[metrics.CORE_WAIT]
