"""Where a sweep's seconds go, across all its processes: on PYTHONPATH (every Python process the
sweep starts imports it), with TRACE_DIR set, it wraps the functions named below to log their start
and end, in seconds from TRACE_T0 (the command's start, ``date +%s.%N``), one file per process.
Without TRACE_DIR it does nothing. A benchmark's tool, never the product's: docs/benchmarks.md.

    mkdir /tmp/tr; TRACE_DIR=/tmp/tr TRACE_T0=$(date +%s.%N) PYTHONPATH=benchmarks/trace:. python -m sweeper -m ...
    cat /tmp/tr/trace.*.txt | sort -k3 -n      # pid, thread, start, end, seconds, function
"""

import functools
import importlib.abc
import os
import sys
import threading
import time

T0 = float(os.environ.get("TRACE_T0", "0") or 0)
DIR = os.environ.get("TRACE_DIR")
NAMES = {
    "sweeper.sweep": ["write_report", "check_data"],
    "sweeper.track.opening": ["open_sweep", "start_parent", "resume"],
    "sweeper.track.records": [
        "SweepRecord.__init__",
        "SweepRecord.start_parent",
        "SweepRecord.send_handed_off",
        "SweepRecord.close_orphans",
        "SweepRecord.finished_hashes",
        "SweepRecord.children",
        "SweepRecord.log_parent",
        "SweepRecord.end_parent",
    ],
    "trainer.record.store": ["client", "ensure_experiment"],
    "sweeper.runners.local": ["LocalRunner.start", "LocalRunner._start_workers", "LocalRunner.prestart"],
    "sweeper.runners.warm": ["WarmPool.tickets", "WarmPool.seal", "WarmPool.put", "WarmPool.add"],
    "sweeper.track.early_report": ["EarlyReport._build", "EarlyReport.wait"],
    "sweeper.track.collect": ["close_runs", "collect", "end_parent", "add_jobs"],
    "sweeper.report.study": ["load", "load_point", "planned_points"],
    "sweeper.report.publish": ["build", "publish", "summary_markdown"],
    "sweeper.report.points_csv": ["write_csv"],
    "sweeper.report.page": ["write"],
    "sweeper.report.convergence": ["loss_curves", "precision_by_epoch", "finals", "weight_error"],
    "sweeper.report.roofline": ["roofline_figure"],
    "sweeper.display": ["summary", "closing"],
    "sweeper.timeline": ["write"],
    "sweeper.report.drawing": ["imported", "_imports", "stop"],
    "sweeper.report": ["report_for"],
    "trainer.lifecycle.queue_files": ["claim", "write_result", "write_trained", "wait_sealed"],
    "trainer.worker_points": ["load_point", "prefetch_checks", "Datasets.preload", "Datasets.get"],
    "trainer.worker": ["load_ahead", "_settle", "_next_point"],
    "trainer.data": ["load", "Dataset.fingerprint"],
    "trainer.run": ["train_and_defer", "train_on_rank", "placed"],
    "trainer.core.loop": ["fit"],
    "trainer.record.run_record": ["start_recording", "record_performance", "finish_run", "record_resources"],
    "trainer.lifecycle.check": ["start", "prefetch", "first_weights", "PendingCheck.finish", "compare"],
    "trainer.lifecycle.epoch_end": ["EpochEnd.__call__"],
    "trainer.lifecycle.reference_jobs": ["submit", "compute", "warm"],
    "trainer.warm_up": ["_gpu", "warm_up"],
    "trainer.record.tracking": ["Recorder.__init__", "Recorder.finish", "Recorder.flush", "Recorder.close"],
    "trainer.record.journal": ["Journal.send", "Journal._create", "send_left"],
    "trainer.ranks.contention": ["for_run"],
}
_out = None
_lock = threading.Lock()


def log(what: str, a: float, b: float) -> None:
    global _out
    if not DIR:
        return
    with _lock:
        if _out is None:  # one file per process, open until it ends (line-buffered: a kill loses no line)
            _out = open(os.path.join(DIR, f"trace.{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115
        thread = threading.current_thread().name[:14]
        _out.write(f"{os.getpid()} {thread:14s} {a - T0:8.3f} {b - T0:8.3f} {b - a:7.3f} {what}\n")


def wrap(mod, qual):
    owner, name = mod, qual
    if "." in qual:
        cls, name = qual.split(".")
        owner = getattr(mod, cls, None)
    f = getattr(owner, name, None) if owner is not None else None
    if f is None or getattr(f, "_traced", False):
        return
    label = f"{mod.__name__}.{qual}"

    @functools.wraps(f)
    def traced(*a, **k):
        t = time.time()
        try:
            return f(*a, **k)
        finally:
            log(label, t, time.time())

    traced._traced = True
    setattr(owner, name, traced)


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in NAMES:
            return None
        for f in sys.meta_path:
            if f is self or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module, orig=orig):
            orig(module)
            for q in NAMES[name]:
                wrap(module, q)

        loader.exec_module = exec_module
        return spec


if DIR:
    sys.meta_path.insert(0, Finder())
    log(f"process start argv={' '.join(sys.argv[:3])}", time.time(), time.time())
