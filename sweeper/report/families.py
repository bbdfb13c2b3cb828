"""Which points compare for scaling, and which of their timings to trust: pure, no I/O.

- Scaling families, recognised from configs (never from names): points that differ only in
  ``nproc`` (strong scaling) or only in ``nproc`` and ``batch_size`` with ``batch_size/nproc``
  fixed (weak scaling). Keys that change no batch's work (lr, reg, seed, epochs, ...: TIMING_NEUTRAL)
  do not split a family: its points at one nproc are repeats of one timing.
- Batch-size studies: at least three points that differ only in batch_size.
- Each nproc's time per batch is the median over its repeats timed with no other run beside them
  and no other process on their cores (trainer/ranks/contention.py); where every repeat had company
  it is used, marked contended, and the family's flags say so.
- Each time carries its interval (the range of its repeats' medians: trainer/core/timing.py), and so
  does every speedup and efficiency made of it. A speedup whose interval holds 1, or an efficiency
  above 1 whose interval holds 1, is within the timing noise and the flags say so; an efficiency
  above 1 beyond it is put down only to what the phases measured, never to a cause nobody measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeper.report.analysis import axes
from trainer import metrics

# Config keys that change no batch's work: points differing only in them time the same batches.
TIMING_NEUTRAL = ("lr", "reg", "seed", "epochs", "data.shuffle", "model.init", "data.scale", "perf.", "check.", "save.")
SUPERLINEAR = 1.05  # an efficiency above this is flagged: within its timing noise, or what the phases measured
CORE_WAIT = 0.05  # a point whose ranks waited for a core this share of their timed batches was slowed by it
BESIDE_RUNS, ON_CORES = "other runs beside it", "other processes on its cores"  # what shared a point's timings
LAGGED = "a rank slowed by something else"  # one rank behind the others, a tenth of each batch or more
SKEW = 0.1  # a rank this share of a batch behind the slowest other: slowed (balanced ranks lag by 1-4%)
COMPUTE_PHASES = ("h2d", "forward", "backward", "update")  # a rank's own work: the all-reduce is the others'
PHASES = (*metrics.PHASES, *metrics.SPLIT_PHASES, metrics.QUEUE)  # what a row keeps of its points' phases


def neutral(key: str) -> bool:
    return any(key.startswith(k) if k.endswith(".") else key == k for k in TIMING_NEUTRAL)


@dataclass
class Family:
    """Points that differ only in how a batch is spread over ranks (and in keys that time alike)."""

    kind: str  # "strong" (same global batch), "weak" (same rows per rank) or "batch" (a batch-size study)
    fixed: dict[str, Any]  # what identifies the family: the other axes' values
    members: list[int]  # indices into the configs, by increasing nproc (or batch size)
    pooled: list[str] = field(default_factory=list)  # timing-neutral keys that vary among the members

    @property
    def label(self) -> str:
        text = ", ".join(f"{k}={v}" for k, v in self.fixed.items()) or "all points"
        return text + (f" (repeats over {', '.join(self.pooled)})" if self.pooled else "")


def _groups(configs: Sequence[dict[str, Any]], keys: list[str]) -> list[list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(tuple(repr(c.get(k)) for k in keys), []).append(i)
    return list(groups.values())


def families(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[Family]:
    """Strong and weak scaling families: at least two distinct nproc each."""
    axis = axes(configs, order)
    if "nproc" not in axis:
        return []
    rest = [k for k in axis if k not in ("nproc", "batch_size") and not neutral(k)]
    found: list[Family] = []
    for members in _groups(configs, rest):
        fixed = {k: configs[members[0]].get(k) for k in rest}
        for kind, key in (("strong", _batch), ("weak", _rows_per_rank)):
            by_value: dict[Any, list[int]] = {}
            for i in members:
                by_value.setdefault(key(configs[i]), []).append(i)
            for value, idx in sorted(by_value.items(), key=lambda kv: kv[0]):
                nprocs = {configs[i]["nproc"] for i in idx}
                batches = {configs[i].get("batch_size") for i in idx}
                # A weak family needs the batch to grow with nproc; else it is a strong one.
                if len(nprocs) < 2 or (kind == "weak" and len(batches) < 2):
                    continue
                label = {"batch_size": value} if kind == "strong" else {"rows per rank": value}
                pooled = [k for k in axis if neutral(k) and len({repr(configs[i].get(k)) for i in idx}) > 1]
                by_nproc = sorted(idx, key=lambda i: configs[i]["nproc"])
                found.append(Family(kind, {**fixed, **label}, by_nproc, pooled))
    return found


def _batch(c: dict[str, Any]) -> Any:
    return c.get("batch_size")


def _rows_per_rank(c: dict[str, Any]) -> Any:
    b, p = c.get("batch_size"), c.get("nproc", 1)
    return b / p if isinstance(b, int) and b % p else (b // p if isinstance(b, int) else b)


def batch_studies(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[Family]:
    """Groups of at least three points that differ only in batch_size (one per nproc and other axes)."""
    axis = axes(configs, order)
    if "batch_size" not in axis:
        return []
    rest = [k for k in axis if k != "batch_size"]
    out = []
    for idx in _groups(configs, rest):
        if len({configs[i]["batch_size"] for i in idx}) >= 3:
            fixed = {k: configs[idx[0]].get(k) for k in rest}
            out.append(Family("batch", fixed, sorted(idx, key=lambda i: configs[i]["batch_size"])))
    return out


@dataclass
class Scaling:
    """One nproc of a family; speedup and efficiency against the family's smallest nproc."""

    nproc: int
    batch_ms: float  # the median over the repeats used
    batch_q1: float
    batch_q3: float
    samples_per_s: float
    speedup: float
    ideal: float
    efficiency: float
    phases: dict[str, float] = field(default_factory=dict)
    repeats: list[float] = field(default_factory=list)  # ms per batch of each repeat used
    members: list[int] = field(default_factory=list)  # the points (indices) at this nproc
    contended: int = 0  # how many of them were timed beside other runs, or on shared cores
    trusted: bool = True  # the time comes from repeats with nothing beside them
    company: str = ""  # what shared the timings where none had its host to itself, in words
    lo: float = math.nan  # the time's interval, ms a batch (the range of its repeats' medians)
    hi: float = math.nan
    speedup_lo: float = math.nan  # the speedup's and the efficiency's intervals, from both times' intervals
    speedup_hi: float = math.nan

    @property
    def efficiency_lo(self) -> float:
        return self.speedup_lo / self.ideal

    @property
    def efficiency_hi(self) -> float:
        return self.speedup_hi / self.ideal

    @property
    def compute_ms(self) -> float:
        """Each rank's own work a batch: the phases but the sum and the wait for the others."""
        return sum(self.phases.get(p, 0.0) for p in COMPUTE_PHASES)

    @property
    def sum_ms(self) -> float:
        """The sum itself (several ranks: the all-reduce less the wait for the slowest rank)."""
        return self.phases.get("sum", self.phases.get("allreduce", 0.0))


def scaling(kind: str, nprocs: Sequence[int], batch_ms: Sequence[float]) -> list[tuple]:
    """(speedup, ideal, efficiency) per member. Strong: T0/Tp against p/p0. Weak (scaled speedup):
    (p/p0) T0/Tp, efficiency T0/Tp, since each rank's work stays the same."""
    p0, t0 = nprocs[0], batch_ms[0]
    out = []
    for p, t in zip(nprocs, batch_ms):
        ideal = p / p0
        speedup = t0 / t if kind == "strong" else ideal * t0 / t
        out.append((speedup, ideal, speedup / ideal))
    return out


def point_interval(p: Any) -> tuple[float, float]:
    """A point's interval, ms a batch: its repeats' range (trainer/core/timing.py), else the range of
    its repeats' medians, else its batches' quartiles (runs recorded before the protocol)."""
    m = p.metrics
    if metrics.BATCH_MS_LO in m and metrics.BATCH_MS_HI in m:
        return m[metrics.BATCH_MS_LO], m[metrics.BATCH_MS_HI]
    if len(p.batch_ms_repeats) > 1:
        return min(p.batch_ms_repeats), max(p.batch_ms_repeats)
    t = point_batch_ms(p)
    return m.get(metrics.phase_quantile("batch", "q1"), t), m.get(metrics.phase_quantile("batch", "q3"), t)


def point_batch_ms(p: Any) -> float:
    """A point's ms per batch: the median of its repeats' medians (the timing protocol's
    ``time/batch_ms``; recomputed from them for runs recorded before it), else its median."""
    if len(p.batch_ms_repeats) > 1:
        return statistics.median(p.batch_ms_repeats)
    return p.metrics.get(metrics.phase_time("batch"), math.nan)


def company(p: Any) -> list[str]:
    """What shared a point's timed batches, in words; none for a point timed alone (or recorded
    before this was measured: not known, not flagged)."""
    why = []
    if p.metrics.get(metrics.BESIDE, 0) > 0:
        why.append(BESIDE_RUNS)
    wait = p.metrics.get(metrics.CORE_WAIT, 0)
    if wait > CORE_WAIT:
        why.append(f"{ON_CORES} (its ranks waited for one {wait:.0%} of the time)")
    skew, batch = p.metrics.get(metrics.phase_time("skew"), 0), point_batch_ms(p)
    if batch > 0 and skew > SKEW * batch:  # e.g. its thread's launches held up: the others waited each batch
        why.append(f"{LAGGED} (the others waited {skew:.3g} ms of its {batch:.3g} ms batches for it)")
    return why


def contended(p: Any) -> bool:
    """Timed beside other runs of its host, or on cores that other processes took."""
    return bool(company(p))


def to_time_alone(points: Sequence[Any]) -> list[int]:
    """The points to time again alone (indices): in every scaling family, each nproc none of whose
    points was timed alone gives its first point; the others' speedups rest on no contended time."""
    chosen: set[int] = set()
    for family in families([p.config for p in points]):
        by_nproc: dict[int, list[int]] = {}
        for i in family.members:
            by_nproc.setdefault(points[i].nproc, []).append(i)
        chosen.update(idx[0] for idx in by_nproc.values() if all(contended(points[i]) for i in idx))
    return sorted(chosen)


def family_rows(points: Sequence[Any], family: Family) -> list[Scaling]:
    """The family's scaling figures, one row per nproc, from its points' own timings (by index)."""
    by_nproc: dict[int, list[int]] = {}
    for i in family.members:
        by_nproc.setdefault(points[i].nproc, []).append(i)
    rows = []
    for nproc, idx in sorted(by_nproc.items()):
        alone = [i for i in idx if not contended(points[i])]
        used = [points[i] for i in alone or idx]
        times = [point_batch_ms(p) for p in used]
        t = statistics.median(times)
        q1 = statistics.median(p.metrics.get(metrics.phase_quantile("batch", "q1"), t) for p in used)
        q3 = statistics.median(p.metrics.get(metrics.phase_quantile("batch", "q3"), t) for p in used)
        phases = {
            ph: statistics.median(p.metrics.get(metrics.phase_time(ph), 0.0) for p in used)
            for ph in PHASES
            if ph != "batch" and any(metrics.phase_time(ph) in p.metrics for p in used)
        }
        # samples/s at the time chosen above: each run's global batch over it.
        rate = [
            p.metrics.get(metrics.SAMPLES_PER_S, math.nan) * p.metrics.get(metrics.phase_time("batch"), t) / t
            for p in used
        ]
        repeats = times if len(used) > 1 else used[0].batch_ms_repeats
        n_contended = len(idx) - len(alone)
        row = Scaling(nproc, t, q1, q3, statistics.median(rate), 0, 0, 0, phases, repeats, idx, n_contended)
        intervals = [point_interval(p) for p in used]  # repeats of one timing: the widest range of them
        row.lo, row.hi = min(lo for lo, _ in intervals), max(hi for _, hi in intervals)
        if not alone:
            row.trusted = False
            said: dict[str, str] = {}  # each kind of company once, as its first point said it
            for why in (why for i in idx for why in company(points[i])):
                said.setdefault(why.split(" (")[0], why)
            row.company = " and ".join(said.values())
        rows.append(row)
    for r, (speedup, ideal, eff) in zip(
        rows, scaling(family.kind, [r.nproc for r in rows], [r.batch_ms for r in rows])
    ):
        r.speedup, r.ideal, r.efficiency = speedup, ideal, eff
    base = rows[0]
    for r in rows:  # the slowest and the fastest speedups both intervals allow
        pair = [base.nproc, r.nproc]
        r.speedup_lo = scaling(family.kind, pair, [base.lo, r.hi])[1][0]
        r.speedup_hi = scaling(family.kind, pair, [base.hi, r.lo])[1][0]
    return rows


def within_noise(lo: float, hi: float, value: float = 1.0) -> bool:
    """Whether an interval holds ``value``: a speedup or efficiency the timing noise cannot tell from it."""
    return lo <= value <= hi


def flags(family: Family, rows: Sequence[Scaling]) -> list[str]:
    """What a reader must know before trusting the family's speedups, one sentence each."""
    out = []
    untrusted: dict[tuple, list[Scaling]] = {}  # one warning a kind of company, naming its nprocs
    for r in rows:
        if not r.trusted:
            untrusted.setdefault(tuple(k for k in (BESIDE_RUNS, ON_CORES, LAGGED) if k in r.company), []).append(r)
    for kinds, group in untrusted.items():
        fixes = ["run the study with perf.timing=exclusive"] if BESIDE_RUNS in kinds else []
        if ON_CORES in kinds:
            fixes.append("give its ranks cores no other process needs meanwhile")
        if LAGGED in kinds:
            fixes.append("time it again: sweep.retime does, at the sweep's end")
        if len(group) == 1:  # its own words, with how much
            said = f"nproc={group[0].nproc} was timed only with {group[0].company}: its speedup is"
        else:
            nprocs = ", ".join(str(r.nproc) for r in group)
            said = f"nproc={nprocs} were each timed only with {' and '.join(kinds)}: their speedups are"
        out.append(f"{said} not to be trusted ({'; '.join(fixes)})")
    base = rows[0]
    for r in rows[1:]:
        if family.kind == "strong" and within_noise(r.speedup_lo, r.speedup_hi):
            out.append(
                f"nproc={r.nproc} is no faster than nproc={base.nproc} within the timing noise "
                f"(speedup {r.speedup_lo:.2f}-{r.speedup_hi:.2f}x)"
            )
        if r.efficiency <= SUPERLINEAR:
            continue
        if not base.trusted:
            why = f"its baseline nproc={base.nproc} was slowed by {base.company}"
        elif within_noise(r.efficiency_lo, r.efficiency_hi):
            why = f"within the timing noise (its interval {r.efficiency_lo:.0%}-{r.efficiency_hi:.0%} holds 100%)"
        else:
            noise = f"{r.efficiency_lo:.0%}-{r.efficiency_hi:.0%}"
            why = f"beyond its timing noise ({noise}); {_measured(family, base, r)}"
        out.append(f"efficiency {r.efficiency:.0%} at nproc={r.nproc} is above 1: {why}")
    return out


def _measured(family: Family, base: Scaling, r: Scaling) -> str:
    """What the phases say of an efficiency above 1, and nothing they do not measure."""
    share = base.nproc / r.nproc if family.kind == "strong" else 1.0  # a rank's rows, against the baseline's
    expected = base.compute_ms * share
    if expected > 0 and r.compute_ms < 0.95 * expected:
        what = "the same rows" if family.kind == "weak" else f"{share:.2g} of its rows"
        return (
            f"each rank's own work took {r.compute_ms:.3g} ms a batch against {expected:.3g} ms for {what} at "
            f"nproc={base.nproc}: the phases measured it, not why"
        )
    return "the phases measured nothing faster per rank: not explained by these timings"
