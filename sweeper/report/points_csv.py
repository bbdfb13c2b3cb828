"""The report's tables as CSV: ``points.csv``, one row per point (its axes, status, final values,
timings and scaling figures), and any list of rows (``overhead.csv``, ``time_to_target.csv``)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sweeper.report.families import contended
from sweeper.report.overhead import in_run_s
from sweeper.report.study import Point
from trainer import metrics


def csv_rows(points: list[Point], axis: list[str], fams: list, finished: list[Point]) -> list[dict[str, Any]]:
    """One row per point: its axes, status, final values, timings and scaling figures."""
    scaled: dict[str, dict[str, str]] = {}
    for fam, rows in fams:
        for r in rows:
            for i in r.members:
                scaled.setdefault(finished[i].run_id, {}).update(
                    {
                        f"{fam.kind}_family": fam.label,
                        f"{fam.kind}_speedup": f"{r.speedup:.4g}",
                        f"{fam.kind}_efficiency": f"{r.efficiency:.4g}",
                        f"{fam.kind}_speedup_interval": f"{r.speedup_lo:.4g}-{r.speedup_hi:.4g}",
                    }
                )
    out = []
    for p in points:
        m = p.metrics
        bad = p.diverged
        row: dict[str, Any] = {"point": p.name, **{k: p.get(k) for k in axis}, "status": p.status}
        row.update(
            {
                "diverged": f"step {bad.step}: {bad.why}" if bad else "",
                "final_loss": p.loss_epoch[-1][1] if p.loss_epoch else "",
                "final_precision": p.precision[-1][1] if p.precision else "",
                "weight_error_max": m.get(metrics.weight_error("max"), ""),
                "check_steps": p.tags.get(metrics.TAG_CHECK_STEPS, ""),
                "check": p.tags.get(metrics.TAG_CHECK, ""),
                "batch_ms": m.get(metrics.phase_time("batch"), ""),
                "batch_ms_q1": m.get(metrics.phase_quantile("batch", "q1"), ""),
                "batch_ms_q3": m.get(metrics.phase_quantile("batch", "q3"), ""),
                "batch_ms_lo": m.get(metrics.BATCH_MS_LO, ""),
                "batch_ms_hi": m.get(metrics.BATCH_MS_HI, ""),
                **{
                    f"{ph}_ms": m.get(metrics.phase_time(ph), "")
                    for ph in (*metrics.PHASES, *metrics.SPLIT_PHASES, metrics.QUEUE)
                    if ph != "batch"
                },
                "batch_ms_repeats": ";".join(f"{v:.4g}" for v in p.batch_ms_repeats),
                "timed_batches": m.get(metrics.TIMED_BATCHES, ""),
                "extra_steps": m.get(metrics.EXTRA_STEPS, ""),
                "samples_per_s": m.get(metrics.SAMPLES_PER_S, ""),
                "tflops": m.get(metrics.TFLOPS, ""),
                "utilization": m.get(metrics.UTILIZATION, ""),
                "arithmetic_intensity": m.get(metrics.ARITHMETIC_INTENSITY, ""),
                "training_s": sum(v for _e, v in p.epoch_s) if p.epoch_s else "",
                "in_run_s": in_run_s(p) if p.end_ms is not None else "",
                "to_first_batch_s": m.get(metrics.TIME_TO_FIRST_BATCH, ""),
                "timing": p.tags.get(metrics.TAG_TIMING_POLICY, ""),
                "runs_beside": m.get(metrics.BESIDE, ""),
                "beside": p.tags.get(metrics.TAG_BESIDE, ""),
                "alongside": p.tags.get(metrics.TAG_ALONGSIDE, ""),
                "core_wait": m.get(metrics.CORE_WAIT, ""),
                "timed_alone": "no" if contended(p) else "yes",
                "timed_again_by": p.tags.get(metrics.TAG_TIMED_AGAIN_BY, ""),  # the run its timings are from
                "warm": p.tags.get(metrics.TAG_WARM, ""),
                "worker": p.tags.get(metrics.TAG_WORKER, ""),
            }
        )
        for kind in ("strong", "weak"):
            for col in ("family", "speedup", "efficiency", "speedup_interval"):
                row[f"{kind}_{col}"] = scaled.get(p.run_id, {}).get(f"{kind}_{col}", "")
        row.update({"run_id": p.run_id, "sweep_id": p.sweep_id, "reused": "yes" if p.reused else ""})
        out.append(row)
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r)) or ["point"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
