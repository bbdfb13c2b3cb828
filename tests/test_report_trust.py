"""A study recorded in a real MLflow store with known timings, reported by the real CLI: speedups
from the timings that had nothing beside them, the contended ones flagged, lr pooled as repeats,
a diverged point never the best, the findings first (#32)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

from tests.conftest import recorded_parent
from trainer import metrics

SWEEP = "trust001"
# (nproc, lr) -> ms per batch, runs beside, final precision, loss curve
POINTS = {
    (1, 0.05): (20.0, 1, 0.91, [2.3, 1.0, 0.5]),
    (1, 0.2): (10.0, 0, 0.93, [2.3, 0.8, 0.4]),
    (1, 0.8): (21.0, 1, 0.99, [2.3, 9.0, math.nan]),  # the highest precision, diverged: never the best
    (2, 0.05): (6.0, 0, 0.91, [2.3, 1.0, 0.5]),
    (2, 0.2): (6.2, 0, 0.93, [2.3, 0.8, 0.4]),
    (2, 0.8): (5.8, 0, 0.2, [2.3, 9.0, math.nan]),
}


def record_study(uri: str) -> None:
    """A parent and six children, as a sweep of `hidden=64 lr=... nproc=1,2` records them."""
    from mlflow.entities import Metric, Param, RunTag

    client, exp, parent, tags = recorded_parent(uri, SWEEP, "sweep lr x nproc", "lr=0.05,0.2,0.8 nproc=1,2 hidden=64")
    for (nproc, lr), (ms, beside, precision, loss) in POINTS.items():
        name = f"lr={lr},nproc={nproc}"
        kid = client.create_run(exp, run_name=name, tags={**tags, "mlflow.parentRunId": parent}).info.run_id
        params = {"hidden": 64, "batch_size": 64, "nproc": nproc, "lr": lr, "epochs": 1}
        values = {metrics.phase_time("batch"): ms, metrics.BESIDE: beside, metrics.TEST_PRECISION: precision}
        values[metrics.SAMPLES_PER_S] = 64 * 1000 / ms
        batch = [Metric(k, v, 0, 0) for k, v in values.items()]
        batch += [Metric(metrics.TRAIN_LOSS, v, 0, s) for s, v in enumerate(loss)]
        batch += [Metric(metrics.TRAIN_LOSS_EPOCH, loss[-1], 0, 1), Metric(metrics.TEST_PRECISION, precision, 0, 1)]
        timing = [RunTag(metrics.TAG_TIMING_POLICY, "shared")] + (
            [RunTag(metrics.TAG_BESIDE, "another point")] * beside
        )
        client.log_batch(kid, metrics=batch, params=[Param(k, str(v)) for k, v in params.items()], tags=timing)
        client.set_terminated(kid, "FINISHED")
    client.set_terminated(parent, "FINISHED")


def test_a_recorded_study_reports_speedups_it_can_trust(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    record_study(uri)
    cmd = [sys.executable, "-m", "sweeper.report", SWEEP, "--tracking-uri", uri, "--out", str(tmp_path / "r")]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "r" / "points.csv") as f:
        rows = {r["point"]: r for r in csv.DictReader(f)}
    two = rows["lr=0.2,nproc=2"]
    assert two["strong_family"] == "batch_size=64 (repeats over lr)"  # one family, lr pooled
    # T1 = the one nproc=1 timing with nothing beside it (10 ms), T2 = the median of three (6 ms).
    assert float(two["strong_speedup"]) == round(10 / 6, 3) and float(two["strong_efficiency"]) == round(10 / 12, 4)
    assert rows["lr=0.05,nproc=1"]["runs_beside"] == "1.0" and rows["lr=0.2,nproc=1"]["runs_beside"] == "0.0"
    summary = (tmp_path / "r" / "summary.md").read_text()
    lines = summary.splitlines()
    findings = [line for line in lines if line.startswith("- ")]
    assert findings[0].startswith("- Best: lr=0.2, nproc=1 reaches test precision 0.9300")  # not the diverged 0.99
    assert "tied within 0.001 with lr=0.2, nproc=2, it is the cheapest" in findings[0]  # the same result for less
    assert (
        findings[1] == "- Diverged: lr=0.8, nproc=1 (loss is NaN at step 2); lr=0.8, nproc=2 (loss is NaN at step 2)."
    )
    assert "nproc did not change the result" in summary
    # The interval: from the slowest of the pooled repeats (6.2 ms) to the fastest (5.8 ms) against 10 ms.
    assert (
        "Strong scaling, batch_size=64 (repeats over lr): speedup 1.67x (1.61-1.72x) at nproc=2 (83% efficiency, "
        "81%-86%, against nproc=1)" in summary
    )
    html = (tmp_path / "r" / "report.html").read_text()
    assert html.index("Findings") < html.index("<h2>Figures</h2>") < html.index('id="points"')
    # Figures with nothing to show are left out, each with its reason in a line.
    assert "<b>Roofline</b>: no point recorded its FLOP/s" in html
    assert "<b>Weight error against the CPU reference</b>: no point has its CPU check yet" in html
    assert not (tmp_path / "r" / "roofline.png").exists() and (tmp_path / "r" / "scaling_strong.png").exists()


def test_a_study_with_only_contended_baselines_says_so(tmp_path):
    """Drop the uncontended nproc=1 point: the baseline is the contended median, flagged everywhere."""
    del POINTS[(1, 0.2)]
    try:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        record_study(uri)
        cmd = [sys.executable, "-m", "sweeper.report", SWEEP, "--tracking-uri", uri, "--out", str(tmp_path / "r")]
        result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr
    finally:
        POINTS[(1, 0.2)] = (10.0, 0, 0.93, [2.3, 0.8, 0.4])
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "nproc=1 was timed only with other runs beside it" in summary
    assert "efficiency 171% at nproc=2 is above 1: its baseline nproc=1 was slowed by other runs beside it" in summary
    assert "2: 3.42x (171%)" in summary and "1: 1.00x (100%, timed with other runs beside it)" in summary
