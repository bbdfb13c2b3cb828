"""Points timed again alone at the sweep's end (sweeper/track/retime.py): which, how, and what the report takes."""

from __future__ import annotations

import csv
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from sweeper.report import families
from sweeper.report.study import load, point_of
from tests.conftest import sweeper_command
from tests.test_report_analysis import point
from tests.test_sweeper import FAST, children_of, hang_report, parents
from trainer import metrics
from trainer.ranks.contention import TimedSpan
from trainer.record import store


def test_only_a_nproc_none_of_whose_points_was_timed_alone_is_timed_again():
    """hidden=64: nproc=1 twice with company (lr pooled as repeats), nproc=2 once alone and once not;
    hidden=128: nproc=2's one point slowed by processes on its cores. A point in no family never is."""
    configs = [
        {"hidden": 64, "batch_size": 64, "nproc": 1, "lr": 0.1},
        {"hidden": 64, "batch_size": 64, "nproc": 1, "lr": 0.2},
        {"hidden": 64, "batch_size": 64, "nproc": 2, "lr": 0.1},
        {"hidden": 64, "batch_size": 64, "nproc": 2, "lr": 0.2},
        {"hidden": 128, "batch_size": 64, "nproc": 1, "lr": 0.1},
        {"hidden": 128, "batch_size": 64, "nproc": 2, "lr": 0.1},
    ]
    company = [(1, 0), (1, 0), (0, 0), (1, 0), (0, 0), (0, 0.3)]  # (runs beside, share waiting for a core)
    pts = [point(f"p{i}", c, 10, beside=b, wait=w) for i, (c, (b, w)) in enumerate(zip(configs, company))]
    assert families.to_time_alone(pts) == [0, 5]
    lone = [point("x", {"hidden": 64, "batch_size": 64, "nproc": 1}, 10, beside=1)]
    assert families.to_time_alone(lone) == []


def test_a_rank_that_lagged_a_tenth_of_each_batch_is_timed_again():
    """Two H200s, the headline's hidden=1024 at nproc=2: once 0.1249 ms a batch, its other rank
    waiting 0.0307 ms of each for it (0.0973 ms in the next two sweeps, a wait of 0.0002-0.002)."""
    config = {"hidden": 1024, "batch_size": 3200}
    pts = [
        point("one", {**config, "nproc": 1}, 0.1056, phases={"skew": 0}),
        point("two", {**config, "nproc": 2}, 0.1249, phases={"skew": 0.0308, "wait": 0.0307}),
    ]
    assert families.company(pts[1]) == [
        f"{families.LAGGED} (the others waited 0.0308 ms of its 0.125 ms batches for it)"
    ]
    assert families.to_time_alone(pts) == [1]
    balanced = point("two", {**config, "nproc": 2}, 0.0973, phases={"skew": 0.00067})  # 0.7%: not lagging
    assert families.company(balanced) == [] and families.to_time_alone([pts[0], balanced]) == []


def watched_sweep(
    args: list[str], cwd: Path, company: TimedSpan | None, timeout: float = 240, stop_on: str = ""
) -> tuple[int, str]:
    """The sweep, with ``company`` (entered) timing on the host until the sweep says it times points
    again (the lock it holds shared would keep an exclusive retiming waiting); (exit status, output).
    ``stop_on``: a line that starts so is answered with SIGTERM instead, ``company`` still timing."""
    cmd = sweeper_command(args, retime=True)  # the retiming as its args say
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if stop_on and line.startswith(stop_on):
                proc.send_signal(signal.SIGTERM)
            elif line.startswith("timing again alone") and company is not None and company.fd is not None:
                company.__exit__(None, None, None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        reader.join(timeout=10)
        pytest.fail(f"the sweep ran past {timeout} s\n{hang_report(cwd, ''.join(lines), '')}", pytrace=False)
    reader.join(timeout=30)
    return proc.returncode, "".join(lines)


@pytest.mark.mpi
def test_points_timed_with_company_are_timed_again_alone_and_the_report_takes_those_timings(tmp_path, mlflow_uri):
    """A process of this test times on the host through the sweep's points (a run beside each of
    them, as the marker says): every nproc of the family had company, so each point runs again, one
    epoch, exclusive, once the points have ended; the report's points carry those timings, the
    points' own runs keep theirs, nothing stays RUNNING, and a resumed sweep reruns nothing."""
    company = TimedSpan("another sweep's run", exclusive=False, units="1 rank(s) on cpu")
    company.__enter__()
    try:
        rc, out = watched_sweep(["hidden=16", "nproc=1,2", *FAST], tmp_path, company)
    finally:
        if company.fd is not None:
            company.__exit__(None, None, None)
    assert rc == 0, out
    assert "timing again alone, one at a time" in out and "nproc=1: other runs beside it" in out, out

    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert sorted(kids) == ["nproc=1", "nproc=1 (timed alone)", "nproc=2", "nproc=2 (timed alone)"]
    assert {r.info.status for r in kids.values()} == {"FINISHED"}
    for name in ("nproc=1", "nproc=2"):
        own, again = kids[name], kids[f"{name} (timed alone)"]
        assert own.data.metrics[metrics.BESIDE] >= 1  # its own timings keep their company
        assert own.data.tags[metrics.TAG_TIMED_AGAIN_BY] == again.info.run_id
        assert again.data.tags[metrics.TAG_TIMED_AGAIN_FOR] == own.info.run_id
        assert again.data.tags[metrics.TAG_TIMING_POLICY] == "exclusive"
        assert again.data.metrics[metrics.BESIDE] == 0
        assert again.data.params["epochs"] == "1" and again.data.params["check.reference"] == "False"
    total = sum(r.data.metrics[metrics.device_seconds("cpu")] for r in kids.values())
    assert parent.data.metrics[metrics.device_seconds("cpu")] == pytest.approx(total)  # the retimings count

    study = load(store.client(mlflow_uri), [parent])
    by_name = {p.name: p for p in study.points}
    assert sorted(by_name) == ["nproc=1", "nproc=2"]
    for name, p in by_name.items():
        again = kids[f"{name} (timed alone)"]
        assert p.metrics[metrics.phase_time("batch")] == again.data.metrics[metrics.phase_time("batch")]
        assert p.metrics[metrics.BESIDE] == 0 and metrics.TAG_BESIDE not in p.tags
        assert p.metrics[metrics.TEST_PRECISION] == kids[name].data.metrics[metrics.TEST_PRECISION]
        assert len(p.loss_epoch) == 2  # what it trained stays its own: two epochs
    (table,) = tmp_path.glob("multirun/*/*/report/points.csv")
    with open(table) as f:
        rows = {row["point"]: row for row in csv.DictReader(f)}
    for name in ("nproc=1", "nproc=2"):  # from the retimings (whose cores a loaded machine may still share)
        again = kids[f"{name} (timed alone)"]
        slowed = families.contended(point_of(again, name))  # its cores taken, or a rank that lagged
        assert rows[name]["timed_again_by"] == again.info.run_id, rows
        assert rows[name]["timed_alone"] == ("no" if slowed else "yes"), rows
    summary = next(tmp_path.glob("multirun/*/*/report/summary.md")).read_text()
    assert "- Best: " in summary  # timings from exclusive retimings make no timing study of a trained one

    rc, out = watched_sweep(["hidden=16", "nproc=1,2", *FAST], tmp_path, None)
    assert rc == 0, out
    assert out.count("skip ") == 2 and "timing again alone" not in out, out
    assert len(parents(mlflow_uri)) == 2 and len(children_of(mlflow_uri, parent.info.run_id)) == 4


# sweep.retime=false with company: tests/test_sweeper.py::test_a_sweep_totals_what_its_points_held.


@pytest.mark.mpi
def test_a_sweep_stopped_while_a_point_is_timed_again_leaves_nothing_running(tmp_path, mlflow_uri):
    """SIGTERM while a retiming waits for the host (the test's run still timing): the sweep ends 130,
    its points FINISHED as they trained, the retiming KILLED (or never recorded), the parent KILLED."""
    company = TimedSpan("another sweep's run", exclusive=False, units="1 rank(s) on cpu")
    company.__enter__()
    try:
        args = ["hidden=16", "nproc=1,2", *FAST]
        rc, out = watched_sweep(args, tmp_path, company, stop_on="[timing nproc=1 alone")
    finally:
        company.__exit__(None, None, None)
    assert rc == 130, out
    (parent,) = parents(mlflow_uri)
    assert parent.info.status == "KILLED"
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert {kids[n].info.status for n in ("nproc=1", "nproc=2")} == {"FINISHED"}, out
    assert set(kids) <= {"nproc=1", "nproc=2", "nproc=1 (timed alone)"}, sorted(kids)
    assert {r.info.status for n, r in kids.items() if n.endswith("(timed alone)")} <= {"KILLED"}, out
    assert metrics.TAG_TIMED_AGAIN_BY not in kids["nproc=1"].data.tags
