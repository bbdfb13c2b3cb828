"""The study report on real sweeps: real ranks, a real MLflow store, real matplotlib, a real browser."""

from __future__ import annotations

import csv
import itertools
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.browser import is_blank, page_text, render
from tests.conftest import NO_TIMING_FLOOR, group_commands, recorded_parent
from tests.test_sweeper import children_of, parents, sweep
from trainer import metrics
from trainer.record import store

pytestmark = pytest.mark.mpi
TINY = ["epochs=2", "data.n_train=200", "data.n_test=50", "hidden=16", *NO_TIMING_FLOOR]


def read_csv(path: Path, key: str = "point") -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {row[key]: row for row in csv.DictReader(f)}


def report_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sweeper.report", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=240)


# xdist builds a module's fixture once in each worker that runs one of its tests: the study's tests on one.
ONE_STUDY = pytest.mark.xdist_group("study_sweep")


@pytest.fixture(scope="module")
def study_sweep(tmp_path_factory: pytest.TempPathFactory):
    """One real sweep with a strong family, a weak one and a learning-rate axis (8 points)."""
    tmp = tmp_path_factory.mktemp("study")
    mp = pytest.MonkeyPatch()
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("SWEEPSCALE_CACHE", str(tmp / "cache"))
    mp.setenv("SWEEPSCALE_TIMING_DIR", str(tmp / "timing"))  # this sweep's runs only (conftest.timing_folder)
    result = sweep(["nproc=1,2", "batch_size=40,80", "lr=0.1,0.5", *TINY], tmp, figures=True)
    yield tmp, uri, result
    mp.undo()


@ONE_STUDY
def test_sweep_ends_with_a_report_of_every_point(study_sweep):
    _tmp, uri, result = study_sweep
    assert result.returncode == 0, result.stdout + result.stderr
    (parent,) = parents(uri)
    kids = children_of(uri, parent.info.run_id)
    assert len(kids) == 8
    folder = Path(parent.data.tags[metrics.TAG_SWEEP_DIR]) / "report"
    assert "report (" in result.stdout and str(folder / "report.html") in result.stdout
    assert "mlflow ui --backend-store-uri sqlite:///" in result.stdout
    run_page = f"/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
    assert run_page in result.stdout

    rows = read_csv(folder / "points.csv")
    assert set(rows) == set(kids)
    assert {r["status"] for r in rows.values()} == {"FINISHED"}
    for name, row in rows.items():
        assert row["run_id"] == kids[name].info.run_id
        assert float(row["batch_ms"]) == pytest.approx(kids[name].data.metrics[metrics.phase_time("batch")])

    # lr changes no batch's work: the two lr values are repeats of one timing, T at an nproc the
    # median of its repeats that ran with nothing beside them and on cores of their own (of all,
    # where none did).
    def time_of(batch: str, nproc: str) -> float:
        repeats = [rows[f"nproc={nproc},batch_size={batch},lr={lr}"] for lr in ("0.1", "0.5")]
        alone = [r for r in repeats if float(r["runs_beside"]) == 0 and float(r["core_wait"]) <= 0.05] or repeats
        assert all((r in alone) == (r["timed_alone"] == "yes") for r in repeats) or alone == repeats
        return statistics.median(float(r["batch_ms"]) for r in alone)

    for lr in ("0.1", "0.5"):
        for b in ("40", "80"):  # strong: the global batch fixed, nproc 1 -> 2; speedup T1 / T2
            one, two = rows[f"nproc=1,batch_size={b},lr={lr}"], rows[f"nproc=2,batch_size={b},lr={lr}"]
            speedup = time_of(b, "1") / time_of(b, "2")
            assert two["strong_family"] == f"batch_size={b} (repeats over lr)"
            assert float(two["strong_speedup"]) == pytest.approx(speedup, rel=1e-3)
            assert float(two["strong_efficiency"]) == pytest.approx(speedup / 2, rel=1e-3)
            assert float(one["strong_speedup"]) == 1.0
        # Weak: 40 rows per rank, (B=40, 1 rank) -> (B=80, 2 ranks): scaled speedup 2 T1/T2.
        two = rows[f"nproc=2,batch_size=80,lr={lr}"]
        ratio = time_of("40", "1") / time_of("80", "2")
        assert float(two["weak_speedup"]) == pytest.approx(2 * ratio, rel=1e-3)
        assert float(two["weak_efficiency"]) == pytest.approx(ratio, rel=1e-3)
    assert {r["timing"] for r in rows.values()} == {"shared"}  # each run says what ran beside it
    assert all(r["runs_beside"] != "" and 0 <= float(r["core_wait"]) <= 1 for r in rows.values())

    for png in ("convergence", "finals", "weight_error", "scaling_strong", "scaling_weak", "phases", "roofline"):
        assert (folder / f"{png}.png").stat().st_size > 10_000, png

    # Overhead: the parent's wall time holds every run's span, which holds its training.
    (over,) = read_csv(folder / "overhead.csv", key="sweep").values()
    assert over["sweep"] == parent.data.tags[metrics.TAG_SWEEP_ID] and over["points"] == "8"
    wall, in_run, training = (float(over[k]) for k in ("wall_s", "in_run_s", "training_s"))
    assert wall >= training > 0 and in_run >= training
    # Both CSVs round seconds to 3 decimals: allow that rounding, over the 8 rows and the sum.
    assert training == pytest.approx(sum(float(r["training_s"]) for r in rows.values()), abs=5e-3)
    assert float(over["overhead_per_point_s"]) == pytest.approx((wall - training) / 8, abs=1e-3)
    assert int(over["warm"]) + int(over["cold"]) == 8
    assert all(float(r["in_run_s"]) >= float(r["training_s"]) for r in rows.values())
    assert '<h2 id="overhead">Overhead</h2>' in (folder / "report.html").read_text()


@ONE_STUDY
def test_report_is_attached_to_the_parent_run(study_sweep):
    _tmp, uri, _result = study_sweep
    (parent,) = parents(uri)
    client = store.client(uri)
    attached = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report.html", "points.csv", "summary.md", "convergence.png", "roofline.png"} <= attached
    assert parent.info.run_name == (  # what it varies, then what sets it apart from another such sweep
        "sweep nproc x batch_size x lr · epochs=2 · data.n_train=200 · data.n_test=50 · hidden=16"
        " · perf.min_batches=1 · perf.min_seconds=0 · data embedded digits"
    )
    note = parent.data.tags["mlflow.note.content"]
    assert "| point | status |" in note
    for name in children_of(uri, parent.info.run_id):
        assert f"| {name} | FINISHED" in note
    best = parent.data.tags["study.best_point"]
    assert (
        parent.data.metrics["study/best_precision"]
        == children_of(uri, parent.info.run_id)[best].data.metrics[metrics.TEST_PRECISION]
    )
    assert parent.data.metrics["study/finished"] == 8
    assert "Overhead (s)" in note
    assert parent.data.metrics["study/wall_s"] >= parent.data.metrics["study/training_s"] > 0
    assert parent.data.tags[metrics.TAG_COMMAND].startswith("python -m sweeper -m nproc=1,2")
    assert not [k for k in parent.data.params if k.startswith("mlflow.")]


@ONE_STUDY
@pytest.mark.browser
def test_html_report_renders_in_a_real_browser(study_sweep, tmp_path):
    _tmp, uri, _result = study_sweep
    (parent,) = parents(uri)
    html = Path(parent.data.tags[metrics.TAG_SWEEP_DIR]) / "report" / "report.html"
    seen = render(html, tmp_path / "report.png")
    assert seen["images"] >= 7 and seen["loaded"] == seen["images"], seen["broken"]
    assert seen["external"] == []  # self-contained
    assert seen["findings_bottom"] is not None and seen["findings_bottom"] <= 800  # on the first screen
    assert not is_blank(tmp_path / "report.png")


@ONE_STUDY
@pytest.mark.browser
def test_the_printed_mlflow_lines_open_the_sweeps_runs_in_a_real_browser(study_sweep, tmp_path):
    """The closing lines' command starts MLflow's UI without the venv on PATH, on the port its links
    name; its experiment link lands on the runs table (MLflow 3 would open GenAI views), the parent
    sweep listed by its name."""
    _tmp, uri, result = study_sweep
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("MLflow: "))
    command = lines[at].removeprefix("MLflow: ").split(", then")[0]
    assert command.endswith(" --workers 1"), command  # a researcher's own UI: one browser, one worker
    port = int(command.split("--port ")[1].split()[0])  # a port free when the sweep ended, its links on it
    url = lines[at + 1].strip()
    assert url.startswith(f"http://127.0.0.1:{port}/"), (command, url)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no venv: the line must work as printed
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # MLflow's GenAI job runner: 8 processes, untested here
    ui = subprocess.Popen(shlex.split(command), env=env, cwd=tmp_path, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert ui.poll() is None, ui.stderr.read()
                time.sleep(0.5)
        served = group_commands(ui.pid)  # MLflow's command and the one server it starts (four by default)
        assert len(served) <= 2, served
        (parent,) = parents(uri)
        landed, text = page_text(url, parent.info.run_name[:30])
        assert "/runs" in landed and "workflowType=machine_learning" in landed
        assert "Run Name" in text and "Traces" not in text.split("Run Name")[1][:200]
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # the command and its server
        ui.wait(timeout=30)


def test_rebuild_after_a_resumed_sweep_gives_the_same_report(tmp_path, mlflow_uri):
    """The first sweep with report.figures=false (what most of the suite's sweeps run with): no
    drawing, each figure's place says why, the points' table, summary and findings as ever; resumed
    with a third point, then its report rebuilt (drawing the figures) from the store, twice."""
    first = sweep(["lr=0.1,0.5", "batch_size=50", *TINY], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    (folder,) = tmp_path.glob("multirun/*/*/report")
    assert not list(folder.glob("*.png"))
    html = (folder / "report.html").read_text()
    assert "report.figures=false: python -m sweeper.report FOLDER draws it" in html
    assert "Training loss of every point" in html  # the figure's caption, with its reason
    assert len((folder / "points.csv").read_text().splitlines()) == 3
    assert "- Best: lr=" in first.stdout
    resumed = sweep(["lr=0.1,0.5,1.0", "batch_size=50", *TINY], tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("skip lr=") == 2
    newest = max(parents(mlflow_uri), key=lambda r: r.info.start_time)
    at_end = read_csv(Path(newest.data.tags[metrics.TAG_SWEEP_DIR]) / "report" / "points.csv")
    assert set(at_end) == {"lr=0.1", "lr=0.5", "lr=1.0"}
    assert [at_end[n]["reused"] for n in ("lr=0.1", "lr=0.5", "lr=1.0")] == ["yes", "yes", ""]

    sweep_id = newest.data.tags[metrics.TAG_SWEEP_ID]
    result = report_cli([sweep_id, "--out", str(tmp_path / "rebuilt")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert read_csv(tmp_path / "rebuilt" / "points.csv") == at_end
    assert result.stdout.startswith(f"writing the report to {tmp_path / 'rebuilt'}\n"), result.stdout
    drawn = {f.name for f in (tmp_path / "rebuilt").glob("*.png")}  # what the sweep left out (report.figures=false)
    assert {"convergence.png", "finals.png", "precision.png"} <= drawn, drawn
    again = report_cli(["latest", "--out", str(tmp_path / "rebuilt"), "--no-attach"], tmp_path)  # the same sweep
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"rewriting the report in {tmp_path / 'rebuilt'}: its files are replaced")
    assert read_csv(tmp_path / "rebuilt" / "points.csv") == at_end


@ONE_STUDY
def test_report_of_an_unknown_sweep_names_it(study_sweep):
    tmp, _uri, _result = study_sweep  # its store, from the environment the fixture set
    result = report_cli(["nosuchid"], tmp)
    assert result.returncode != 0
    assert "no sweep 'nosuchid' in this experiment; recent sweep ids:" in result.stderr


def test_the_weight_errors_figure_is_kept_while_its_errors_are_unchanged(tmp_path, monkeypatch):
    """The figure reads each point's config and check errors alone (study.Point.only_check): asked
    again once the runs' other records changed (their losses, a tag set at the end), it is kept, not
    drawn again; asked with another error, it is drawn again."""
    from sweeper.report import convergence, drawing
    from sweeper.report.study import Point

    key = metrics.weight_error("max")

    def points(tag: str, error: float) -> list[Point]:
        return [
            Point(f"hidden={h}", f"run{h}", "s1", "FINISHED", {"hidden": h}, {key: error * h, "loss": 1 / h},
                  {"sweepscale.job": tag}, loss=[(1, 2.0), (2, 1.0 if tag == "early" else 0.9)])
            for h in (16, 32)
        ]  # fmt: skip

    monkeypatch.setattr(drawing, "_made", None)  # this test's memo only
    drawing.remember()
    out = tmp_path / "weight_error.png"
    first = drawing.draw(convergence.weight_error, [p.only_check() for p in points("early", 1e-6)], ["hidden"], out)
    drawn = out.stat().st_mtime_ns
    again = drawing.draw(convergence.weight_error, [p.only_check() for p in points("late", 1e-6)], ["hidden"], out)
    assert again is first and out.stat().st_mtime_ns == drawn
    other = drawing.draw(convergence.weight_error, [p.only_check() for p in points("late", 2e-6)], ["hidden"], out)
    assert other is not first and other.result() == out and out.stat().st_mtime_ns != drawn


def test_a_report_reads_a_long_runs_history_sampled(tmp_path):
    """#47: a run that logged its loss at each of 10^6 steps (written straight into the real SQLite
    store: through MLflow it would take minutes) is read as at most SAMPLED values, its first and
    last among them, and its last epoch's; the sweep's report stays a figure's worth of reading."""
    import sqlite3

    from sweeper.report.study import SAMPLED, load_point

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, _exp, parent, tags = recorded_parent(uri, "longrun", "sweep long", "epochs=100")
    run = client.create_run(_exp, run_name="long", tags={**tags, metrics.TAG_PARENT: parent}).info.run_id
    client.log_metric(run, metrics.TEST_PRECISION, 0.9, step=100)
    n = 1_000_000
    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # rows made by SQLite: 3.7 CPU-s, not 10 from Python
        db.execute(
            "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
            "WITH RECURSIVE s(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < ?) "
            "SELECT ?, 2.3 / (1 + x), 1700000000000 + x, ?, x, 0 FROM s",
            (n - 1, metrics.TRAIN_LOSS, run),
        )
    t0 = time.perf_counter()
    point = load_point(client, client.get_run(run), "long")
    took = time.perf_counter() - t0
    assert len(point.loss) <= SAMPLED and point.loss[0][0] == 0 and point.loss[-1][0] == n - 1, len(point.loss)
    steps = [s for s, _v in point.loss]
    assert max(b - a for a, b in itertools.pairwise(steps)) <= 2 * n / SAMPLED  # spread over the whole run
    assert point.precision == [(100, 0.9)] and point.diverged is None
    print(f"10^6 loss steps read sampled in {took:.2f} s")  # docs/benchmarks.md: the same, timed
