"""A sweep from start to end: plan, (preview), resume, submit, watch, collect, summarise.

conf -> expand (Hydra) -> plan resources -> submit (submitit) -> collect (MLflow)
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from sweeper import display, jobs
from sweeper.config import FLAGS
from sweeper.plan import Point, plan
from sweeper.records import SweepRecord, absolute_uri
from trainer import data, metrics, provenance, tracking


def check_data(points: list[Point]) -> None:
    """Load each distinct data set once, so a bad folder or file stops the sweep before submission."""
    seen = set()
    for p in points:
        d = p.trainer.data
        key = (d.dir, d.n_train, d.n_test)
        if key not in seen:
            seen.add(key)
            data.load(d.dir, d.n_train, d.n_test, "float32")


def prepare(point: Point, uri: str, experiment: str, parent_id: str, sweep_id: str) -> None:
    """Fill in where the child run is recorded, and write the point's config for its job."""
    t = point.trainer
    with open_dict(t):
        t.mlflow.tracking_uri = uri
        t.mlflow.experiment = experiment
        t.mlflow.parent_run_id = parent_id
        t.mlflow.run_name = point.name
        t.mlflow.tags = {**t.mlflow.tags, metrics.TAG_SWEEP_ID: sweep_id}
    jobs.write_point_config(point)


def make_runner(launcher: DictConfig, sweep_dir: Path, groups: dict, sweep_id: str) -> Any:
    folder = Path(launcher.get("folder") or sweep_dir / ".submitit").resolve()
    if launcher.name == "slurm":
        return jobs.SlurmRunner(launcher, folder, groups, sweep_id)
    if launcher.name == "local":
        return jobs.LocalRunner(launcher, folder)
    return jobs.DebugRunner()


def link_logs(point: Point, job: Any) -> str:
    """Put the job's logs within reach of the point's folder; return the stderr path."""
    if job.paths is None:
        return ""
    for name, target in (("stdout.log", job.paths.stdout), ("stderr.log", job.paths.stderr)):
        link = point.dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(target).resolve())
    return str(point.dir / "stderr.log")


def run_sweep(base: DictConfig, points: list[Point], sweep_dir: Path, overrides: list[str]) -> int:
    launcher, opts = base.launcher, base.sweep
    groups = plan(points, launcher)
    check_data(points)
    if launcher.name == "slurm":
        jobs.check_partition(launcher)
    if opts.dry_run:
        rows = [(p.name, p.nproc, p.shape.describe(), str(p.index)) for p in points]
        sbatch = {}
        if launcher.name == "slurm":
            for shape, members in groups.items():
                folder = sweep_dir / ".submitit" / "%j"
                sbatch[shape.describe()] = jobs.sbatch_preview(launcher, shape, folder, len(members))
        display.preview(rows, sbatch)
        return 0

    uri = absolute_uri(tracking.tracking_uri(base.mlflow.tracking_uri))
    experiment = tracking.experiment_name(base.mlflow.experiment)
    record = SweepRecord(uri, experiment)
    done_before = {} if opts.force else record.finished_hashes()
    skipped = [p for p in points if p.config_hash in done_before]
    todo = [p for p in points if p.config_hash not in done_before]
    for p in skipped:
        display.console.print(
            f"skip {p.name}: FINISHED run {done_before[p.config_hash]} has the same config (--force reruns)"
        )

    sweep_id = uuid.uuid4().hex[:8]
    reused = {p.name: done_before[p.config_hash] for p in skipped}
    planned = [{"name": p.name, "config_hash": p.config_hash, "reused_run": reused.get(p.name)} for p in points]
    extra = {metrics.TAG_COMMAND: command_line(), metrics.TAG_SWEEP_DIR: str(sweep_dir), **provenance.code_tags()}
    parent_id = record.start_parent(sweep_id, parent_name(points), overrides, planned, launcher.name, extra)
    display.console.print(
        f"sweep {sweep_id}: {len(todo)} point(s) to run, MLflow parent run {parent_id}, folder {sweep_dir}"
    )
    for p in todo:
        prepare(p, uri, experiment, parent_id, sweep_id)

    runner = make_runner(launcher, sweep_dir, groups, sweep_id)
    queued, running, finished = list(todo), {}, {}
    logs: dict[int, str] = {}
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with display.Progress(len(points)) as progress:
            while queued or running:
                for p, job in runner.start(queued):
                    running[p.index] = (p, job)
                    logs[p.index] = link_logs(p, job)
                for index, (p, job) in list(running.items()):
                    if job.done():
                        finished[index] = job.exception()
                        runner.release(p)
                        del running[index]
                failed = sum(e is not None for e in finished.values())
                progress.update(
                    {
                        "queued": len(queued),
                        "running": len(running),
                        "done": len(finished) - failed,
                        "failed": failed,
                        "skipped": len(skipped),
                    }
                )
                if queued or running:
                    time.sleep(opts.poll_s)
    except KeyboardInterrupt:
        interrupted = True
        display.console.print("[red]interrupted: cancelling the sweep's jobs[/red]")
        for _p, job in running.values():
            runner.cancel(job)
        deadline = time.monotonic() + 30  # let the trainers end their runs KILLED themselves
        while time.monotonic() < deadline and not all(job.done() for _p, job in running.values()):
            time.sleep(opts.poll_s)
        for _p, job in running.values():
            if not job.done():
                job.cancel(check=False)
        record.kill_running(sweep_id)  # runs whose trainer could not say so
    finally:
        signal.signal(signal.SIGTERM, previous)

    outcomes = collect(record, sweep_id, points, skipped, done_before, finished, logs, running, queued)
    display.summary(outcomes)
    ok = all(o.status in ("FINISHED", "SKIPPED") for o in outcomes)
    record.end_parent("KILLED" if interrupted else "FINISHED" if ok else "FAILED")
    write_report(record, sweep_dir)
    return 130 if interrupted else 0 if ok else 1


def write_report(record: SweepRecord, sweep_dir: Path) -> None:
    """The study report of what finished (also after Ctrl-C); a failure here fails no point."""
    from sweeper.report import report_for

    folder = sweep_dir / "report"
    try:
        parent = record.client.get_run(record.parent_id)
        report = report_for(record.client, [parent], folder)
    except Exception:  # the points' runs are safe in the store: say what failed and how to retry
        where = traceback.format_exc().strip().splitlines()[-3:]
        display.console.print("[red]report not written:[/red] " + " | ".join(w.strip() for w in where))
        display.console.print("  retry with: python -m sweeper.report latest")
        return
    display.console.print(f"report ({report.seconds:.1f} s): {folder / 'report.html'}")
    display.console.print(f"MLflow: {display.mlflow_ui_command(record.uri)}, then")
    display.console.print(f"  {display.mlflow_run_url(record.uri, record.experiment_id, record.parent_id)}")


def parent_name(points: list[Point]) -> str:
    """``sweep hidden x nproc``: what the sweep varies, as its points' names say."""
    keys = list(dict.fromkeys(part.split("=", 1)[0] for p in points for part in p.name.split(",") if "=" in part))
    return "sweep " + " x ".join(keys) if len(points) > 1 and keys else f"sweep {points[0].name}"


def command_line() -> str:
    """The command as the user typed it (our --dry-run/--force shorthands given back)."""
    flags = {v: k for k, v in FLAGS.items()}
    return shlex.join(["python", "-m", "sweeper", *(flags.get(a, a) for a in sys.argv[1:])])


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def collect(
    record: SweepRecord,
    sweep_id: str,
    points: list[Point],
    skipped: list[Point],
    done_before: dict[str, str],
    finished: dict[int, BaseException | None],
    logs: dict[int, str],
    running: dict,
    queued: list[Point],
) -> list[display.Outcome]:
    children = record.children(sweep_id)
    outcomes = []
    for p in points:
        if p in skipped:
            run = record.client.get_run(done_before[p.config_hash])
            outcomes.append(display.Outcome(p.name, "SKIPPED", run))
            continue
        run = children.get(p.name)
        log = logs.get(p.index, "")
        if p in queued:
            outcomes.append(display.Outcome(p.name, "CANCELLED", run, "never started", log))
        elif p.index in running:
            status = run.info.status if run is not None else "KILLED"
            outcomes.append(display.Outcome(p.name, "KILLED" if status == "RUNNING" else status, run, "", log))
        else:
            error = finished.get(p.index)
            status = run.info.status if run is not None else ("FAILED" if error else "FINISHED")
            if status == "RUNNING":  # the job ended before its trainer could end the run: say how
                status = "KILLED" if "CANCELLED" in str(error) else "FAILED"
                record.client.set_terminated(run.info.run_id, status)
            if error is not None and status == "FINISHED":
                status = "FAILED"
            text = ""
            if status != "FINISHED":
                text = (
                    (run.data.tags.get(metrics.TAG_ERROR, "") if run is not None else "")
                    or _last_lines(log)
                    or str(error)
                )
            outcomes.append(display.Outcome(p.name, status, run, text, log))
    return outcomes


def _last_lines(path: str, n: int = 5) -> str:
    """The last lines the trainer wrote to the job's stderr (before submitit's own report)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.split("submitit ERROR")[0].strip().splitlines()[-n:])
