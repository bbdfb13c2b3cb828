"""The report's analysis on configs and curves alone: axes, scaling families, regimes, divergence."""

from __future__ import annotations

import itertools
import math

import pytest

from sweeper.report import analysis, families
from trainer import metrics


def grid(**axes) -> list[dict]:
    base = {"hidden": 512, "batch_size": 3200, "lr": 0.1, "nproc": 1, "epochs": 1, "data.dir": None}
    keys = list(axes)
    return [{**base, **dict(zip(keys, values))} for values in itertools.product(*axes.values())]


def test_axes_follow_the_sweeps_order_then_the_usual_one():
    configs = grid(nproc=[1, 2], hidden=[128, 512])
    assert analysis.axes(configs) == ["hidden", "nproc"]
    assert analysis.axes(configs, order=["nproc", "hidden"]) == ["nproc", "hidden"]
    assert analysis.axes(grid()) == []


def test_strong_families_differ_only_in_nproc():
    configs = grid(hidden=[128, 512], nproc=[1, 2, 4])
    fams = families.families(configs)
    assert [f.kind for f in fams] == ["strong", "strong"]
    assert [f.fixed for f in fams] == [{"hidden": 128, "batch_size": 3200}, {"hidden": 512, "batch_size": 3200}]
    for f in fams:
        assert [configs[i]["nproc"] for i in f.members] == [1, 2, 4]


def test_weak_family_keeps_rows_per_rank():
    # The scaling preset: batch_size = 3200 x nproc.
    configs = [{**c, "batch_size": 3200 * c["nproc"]} for c in grid(hidden=[512, 1024], nproc=[1, 2, 4])]
    fams = families.families(configs)
    assert [(f.kind, f.fixed) for f in fams] == [
        ("weak", {"hidden": 512, "rows per rank": 3200}),
        ("weak", {"hidden": 1024, "rows per rank": 3200}),
    ]


def test_batch_study_holds_strong_and_weak_families_and_batch_groups():
    configs = grid(batch_size=[32, 64, 128], nproc=[1, 2])
    fams = families.families(configs)
    strong = [f for f in fams if f.kind == "strong"]
    weak = [f for f in fams if f.kind == "weak"]
    assert [f.fixed["batch_size"] for f in strong] == [32, 64, 128]
    # Rows per rank 32: (32, 1) and (64, 2); 64: (64, 1) and (128, 2).
    assert [f.fixed["rows per rank"] for f in weak] == [32, 64]
    assert all(len(f.members) == 2 for f in weak)
    studies = families.batch_studies(configs)
    assert [s.fixed for s in studies] == [{"nproc": 1}, {"nproc": 2}]
    assert [configs[i]["batch_size"] for i in studies[0].members] == [32, 64, 128]


def test_single_axis_and_mixed_sweeps_have_no_scaling_family():
    assert families.families(grid(lr=[0.01, 0.1, 1.0])) == []
    assert families.batch_studies(grid(lr=[0.01, 0.1, 1.0])) == []
    # nproc and hidden change together: no two points differ in nproc alone.
    mixed = [{**grid()[0], "nproc": p, "hidden": h} for p, h in ((1, 128), (2, 256), (4, 512))]
    assert families.families(mixed) == []
    # Two nproc values with a batch that does not keep rows per rank: neither strong nor weak.
    odd = [{**grid()[0], "nproc": 1, "batch_size": 100}, {**grid()[0], "nproc": 2, "batch_size": 300}]
    assert families.families(odd) == []


def test_speedup_and_efficiency_strong_and_weak():
    strong = families.scaling("strong", [1, 2, 4], [10.0, 6.0, 4.0])
    assert strong[1] == pytest.approx((10 / 6, 2, 10 / 12))
    assert strong[2] == pytest.approx((2.5, 4, 0.625))
    weak = families.scaling("weak", [1, 2, 4], [10.0, 10.0, 12.5])
    assert weak[1] == pytest.approx((2.0, 2, 1.0))
    assert weak[2] == pytest.approx((3.2, 4, 0.8))


def test_divergence_nan_and_rising_loss():
    assert analysis.divergence([(0, 2.3), (1, 1.9), (2, 1.2)]) is None
    nan = analysis.divergence([(0, 2.3), (1, 5.0), (2, math.nan)])
    assert (nan.step, nan.why) == (2, "loss is NaN")
    rising = analysis.divergence([(0, 2.3), (1, 2.1), (2, 3.0), (3, 4.0), (4, 9.0)])
    assert (rising.step, rising.why) == (2, "loss rose 5% past its start")
    # A spike that recovers is not divergence.
    assert analysis.divergence([(0, 2.3), (1, 2.6), (2, 1.0), (3, 0.5)]) is None


def test_regimes_from_steps_to_target():
    # Doubling the batch: steps halve, then fall by a quarter, then stay.
    segs = analysis.regimes([32, 64, 128, 256], [800, 400, 300, 300])
    assert [s.name for s in segs] == ["perfect scaling", "diminishing returns", "maximal data parallelism"]
    assert segs[0].slope == pytest.approx(-1.0)
    curves = [[(0, 2.0), (1, 1.0), (2, 0.5)], [(0, 2.0), (1, 0.8)]]
    target = analysis.common_target(curves)
    assert target == 0.8
    assert [analysis.steps_to_target(c, target) for c in curves] == [3, 2]


def point(
    name: str,
    config: dict,
    ms: float,
    beside: int = 0,
    precision: float = 0.9,
    loss=None,
    status="FINISHED",
    wait=0.0,
    interval=None,
    phases=None,
):
    """A study point as the report reads it from MLflow; ``wait``: its ranks' share of time waiting for a
    core; ``interval``: the range of its repeats' medians (the timing protocol); ``phases``: ms a batch."""
    from sweeper.report.study import Point

    values = {metrics.phase_time("batch"): ms, metrics.BESIDE: beside, metrics.TEST_PRECISION: precision}
    values[metrics.CORE_WAIT] = wait
    if interval:
        values[metrics.BATCH_MS_LO], values[metrics.BATCH_MS_HI] = interval
    values.update({metrics.phase_time(k): v for k, v in (phases or {}).items()})
    values.update({metrics.phase_quantile("batch", "q1"): ms * 0.95, metrics.phase_quantile("batch", "q3"): ms * 1.05})
    values[metrics.SAMPLES_PER_S] = config["batch_size"] * 1000 / ms
    return Point(name, name, "s", status, config, values, {}, loss=loss or [(0, 2.3), (1, 1.0)])


def test_the_best_point_never_diverged_and_ties_go_to_fewer_ranks():
    pts = [
        point("a", {"nproc": 2, "batch_size": 8}, 1, precision=0.9),
        point("b", {"nproc": 1, "batch_size": 8}, 1, precision=0.9),
        point("nan", {"nproc": 1, "batch_size": 8}, 1, precision=0.99, loss=[(0, 2.3), (1, math.nan)]),
        point("rising", {"nproc": 1, "batch_size": 8}, 1, precision=0.98, loss=[(0, 2.3), (1, 9.0)]),
        point("failed", {"nproc": 1, "batch_size": 8}, 1, precision=0.97, status="FAILED"),
    ]
    precision = lambda p: p.metrics.get(metrics.TEST_PRECISION)  # noqa: E731
    assert analysis.best_point(pts, precision).name == "b"
    assert analysis.best_point(pts[2:], precision) is None


def test_a_tie_within_rounding_goes_to_the_cheaper_point_and_the_finding_says_so():
    """0.9687 / 0.9690 / 0.9689 differ by 3 test images of 10,000: the fewest ranks is best; a
    narrower layer wins a tie too, and a real lead (0.3 points) is not a tie."""
    from sweeper.report import findings

    precision = lambda p: p.metrics.get(metrics.TEST_PRECISION)  # noqa: E731
    ranks = [
        point("hidden=512,nproc=2", {"nproc": 2, "hidden": 512, "batch_size": 8}, 1, precision=0.9690),
        point("hidden=512,nproc=1", {"nproc": 1, "hidden": 512, "batch_size": 8}, 1, precision=0.9687),
        point("hidden=512,nproc=4", {"nproc": 4, "hidden": 512, "batch_size": 8}, 1, precision=0.9689),
    ]
    best = analysis.best_point(ranks, precision)
    assert best.name == "hidden=512,nproc=1"
    (said,) = [f for f in findings.findings(ranks, ["nproc"], best, []) if f.startswith("Best:")]
    assert said.startswith(
        "Best: nproc=1 reaches test precision 0.9687"
    )  # named with its ranks: the ties differ in them
    assert "tied within 0.001 with nproc=2, nproc=4, it is the cheapest" in said, said
    widths = [
        point("hidden=1024", {"nproc": 1, "hidden": 1024, "batch_size": 8}, 1, precision=0.9690),
        point("hidden=512", {"nproc": 1, "hidden": 512, "batch_size": 8}, 1, precision=0.9685),
        point("hidden=2048", {"nproc": 1, "hidden": 2048, "batch_size": 8}, 1, precision=0.9660),
    ]
    assert analysis.best_point(widths, precision).name == "hidden=512"
    lead = [*ranks, point("hidden=512,nproc=8", {"nproc": 8, "hidden": 512, "batch_size": 8}, 1, precision=0.972)]
    assert analysis.best_point(lead, precision).name == "hidden=512,nproc=8"


def test_a_loss_that_barely_moves_has_not_diverged():
    """lr=1e-4: the loss wanders around its start; the rule has a tolerance (RISE_TOLERANCE)."""
    flat = [(s, 2.3026 + 0.002 * ((-1) ** s)) for s in range(40)]
    assert analysis.divergence(flat) is None
    assert analysis.divergence([(0, 2.3), (1, 2.3), (2, 2.6), (3, 2.7)]).why == "loss rose 5% past its start"


def test_lr_pools_as_repeats_and_speedup_comes_from_timings_with_nothing_beside():
    """The issue's study: nproc=1 points ran two at a time (contended, 20 ms), one alone (10 ms)."""
    configs = [{"hidden": 64, "batch_size": 64, "nproc": n, "lr": lr} for n in (1, 2) for lr in (0.05, 0.2, 0.8)]
    ms = {
        (1, 0.05): (20, 1),
        (1, 0.2): (10, 0),
        (1, 0.8): (21, 1),
        (2, 0.05): (6, 0),
        (2, 0.2): (6.2, 0),
        (2, 0.8): (5.8, 0),
    }
    pts = [point(f"p{i}", c, *ms[(c["nproc"], c["lr"])]) for i, c in enumerate(configs)]
    (fam,) = families.families(configs)
    assert fam.label == "batch_size=64 (repeats over lr)" and len(fam.members) == 6
    one, two = families.family_rows(pts, fam)
    assert (one.batch_ms, one.contended, one.trusted, one.repeats) == (10, 2, True, [])
    assert two.batch_ms == 6 and two.repeats == [6, 6.2, 5.8] and two.contended == 0
    assert two.speedup == pytest.approx(10 / 6) and two.efficiency == pytest.approx(10 / 12)
    assert families.flags(fam, [one, two]) == []


def test_a_family_timed_with_company_at_every_nproc_is_warned_of_once():
    configs = [{"hidden": 256, "batch_size": 64, "nproc": n, "lr": 0.1} for n in (1, 2, 4)]
    pts = [point(f"n{c['nproc']}", c, 20 / c["nproc"] ** 0.5, beside=1) for c in configs]
    (fam,) = families.families(configs)
    warned = [f for f in families.flags(fam, families.family_rows(pts, fam)) if "not to be trusted" in f]
    assert warned == [
        "nproc=1, 2, 4 were each timed only with other runs beside it: their speedups are not to be trusted "
        "(run the study with perf.timing=exclusive)"
    ]


def test_a_baseline_timed_only_beside_others_is_flagged_with_its_efficiency_above_one():
    configs = [{"hidden": 256, "batch_size": 64, "nproc": n, "lr": 0.1} for n in (1, 2)]
    pts = [point("one", configs[0], 20, beside=1), point("two", configs[1], 6)]
    (fam,) = families.families(configs)
    rows = families.family_rows(pts, fam)
    assert rows[1].efficiency == pytest.approx(20 / 12) and not rows[0].trusted
    assert families.flags(fam, rows) == [
        "nproc=1 was timed only with other runs beside it: its speedup is not to be trusted "
        "(run the study with perf.timing=exclusive)",
        "efficiency 167% at nproc=2 is above 1: its baseline nproc=1 was slowed by other runs beside it",
    ]
    alone = [point("one", configs[0], 20), point("two", configs[1], 9.6)]  # 104%: noise, said so
    assert families.flags(fam, families.family_rows(alone, fam)) == []
    fast = [point("one", configs[0], 20), point("two", configs[1], 6)]
    (flag,) = families.flags(fam, families.family_rows(fast, fam))
    assert flag.startswith("efficiency 167% at nproc=2 is above 1: beyond its timing noise (151%-184%)")
    assert flag.endswith("the phases measured nothing faster per rank: not explained by these timings")


def test_speedups_carry_intervals_and_overlapping_ones_are_within_noise():
    """Strong scaling from recorded timings with intervals: a speedup's interval runs from the slowest
    baseline over the fastest point to the reverse; where it holds 1, nproc=2 is no faster within noise;
    an efficiency above 1 whose interval holds 1 is noise, and says so."""
    configs = [{"hidden": 512, "batch_size": 3200, "nproc": n} for n in (1, 2)]
    (fam,) = families.families(configs)
    slow = [
        point("one", configs[0], 0.20, interval=(0.17, 0.22)),
        point("two", configs[1], 0.21, interval=(0.16, 0.23)),
    ]
    one, two = families.family_rows(slow, fam)
    assert (one.lo, one.hi, two.lo, two.hi) == (0.17, 0.22, 0.16, 0.23)
    assert (two.speedup_lo, two.speedup_hi) == (pytest.approx(0.17 / 0.23), pytest.approx(0.22 / 0.16))
    assert families.flags(fam, [one, two]) == [
        "nproc=2 is no faster than nproc=1 within the timing noise (speedup 0.74-1.38x)"
    ]
    faster = [
        point("one", configs[0], 0.20, interval=(0.17, 0.22)),
        point("two", configs[1], 0.18, interval=(0.16, 0.23)),
    ]
    assert families.flags(fam, families.family_rows(faster, fam)) == [  # 1.11x, but its interval holds 1
        "nproc=2 is no faster than nproc=1 within the timing noise (speedup 0.74-1.38x)"
    ]
    near = [
        point("one", configs[0], 0.20, interval=(0.19, 0.23)),
        point("two", configs[1], 0.09, interval=(0.085, 0.1)),
    ]
    (flag,) = families.flags(fam, families.family_rows(near, fam))
    assert flag == "efficiency 111% at nproc=2 is above 1: within the timing noise (its interval 95%-135% holds 100%)"


def test_weak_efficiency_above_one_is_put_down_to_measured_phases_never_to_a_cache():
    """The scaling preset's 123% weak-scaling efficiency: each rank's share is the single GPU's whole
    batch, so a cache cannot be the cause; the report names only what the phases measured."""
    configs = [{"hidden": 512, "batch_size": 3200 * n, "nproc": n} for n in (1, 2)]
    (fam,) = families.families(configs)
    assert fam.kind == "weak"
    work = {"forward": 0.08, "backward": 0.08, "update": 0.02}
    faster = {"forward": 0.05, "backward": 0.06, "update": 0.02, "sum": 0.01, "wait": 0.0}
    pts = [
        point("one", configs[0], 0.2, interval=(0.195, 0.205), phases=work),
        point("two", configs[1], 0.16, interval=(0.155, 0.165), phases=faster),
    ]
    rows = families.family_rows(pts, fam)
    (flag,) = families.flags(fam, rows)
    assert flag == (
        "efficiency 125% at nproc=2 is above 1: beyond its timing noise (118%-132%); each rank's own work took "
        "0.13 ms a batch against 0.18 ms for the same rows at nproc=1: the phases measured it, not why"
    )
    assert "cache" not in flag


def run(sweep_id: str = "s1", start: int = 0, end: int | None = 10_000, epochs=(2.0, 3.0), **kw):
    from sweeper.report.study import Point

    tags, first = kw.pop("tags", {}), kw.pop("first", None)
    values = {} if first is None else {"time/to_first_batch_s": first}
    return Point(
        "p",
        "r",
        sweep_id,
        "FINISHED",
        {},
        values,
        tags,
        epoch_s=list(enumerate(epochs)),
        start_ms=start,
        end_ms=end,
        **kw,
    )


def parent(sweep_id: str = "s1", start: int = 0, end: int | None = 60_000):
    from sweeper.report.study import Sweep

    return Sweep(sweep_id, "pr", "sweep", "FINISHED", "", "", "", "", "", start, end, "")


def test_overhead_sums_runs_and_training_against_the_sweeps_wall_time():
    from sweeper.report import overhead

    runs = [
        run(tags={"sweepscale.warm": "true", "sweepscale.worker": "h:1"}, first=0.5),
        run(start=10_000, end=25_000, epochs=(4.0,), tags={"sweepscale.warm": "true", "sweepscale.worker": "h:2"}),
        run(start=25_000, end=30_000, tags={"sweepscale.warm": "true", "sweepscale.worker": "h:1"}, first=0.1),
        run(tags={"sweepscale.warm": "false"}, first=2.0),
        run(end=None, epochs=(1.0,)),  # untagged (older, cold) and never ended: no span
        run(reused=True),  # ran in an earlier sweep: not this one's cost
        run("s2"),
    ]
    (o,) = overhead.per_sweep([parent()], runs)
    assert (o.sweep_id, o.wall_s, o.points) == ("s1", 60.0, 5)
    assert o.in_run_s == pytest.approx(10 + 15 + 5 + 10 + 0)
    assert o.training_s == pytest.approx(5 + 4 + 5 + 5 + 1)
    assert o.per_point_s == pytest.approx((60 - 20) / 5)
    assert o.first_batch_s == 0.5  # the median of 0.5, 0.1 and 2.0; runs without it left out
    assert (o.warm, o.cold, o.workers) == (3, 2, 2)
    assert o.row()["overhead_per_point_s"] == 8.0


def test_overhead_of_a_sweep_with_parallel_or_no_points_and_old_runs():
    from sweeper.report import overhead

    # Two 50 s points side by side in 30 s: more training than wall time, a negative overhead.
    (o,) = overhead.per_sweep([parent(end=30_000)], [run(epochs=(50.0,)), run(epochs=(50.0,))])
    assert o.per_point_s == pytest.approx(-35.0)
    assert (o.first_batch_s, o.warm, o.cold, o.workers) == (None, 0, 2, 0)
    assert o.row()["first_batch_median_s"] == ""
    # A parent still running counts to now; a sweep that ran nothing has no overhead per point.
    (o,) = overhead.per_sweep([parent(end=None)], [run(reused=True)], now_ms=5_000)
    assert (o.wall_s, o.points, o.per_point_s, o.training_s) == (5.0, 0, None, 0)
    # Several sweeps: each over its own runs.
    both = overhead.per_sweep([parent("s1"), parent("s2", 0, 20_000)], [run("s1"), run("s2"), run("s2")])
    assert [(o.sweep_id, o.points, o.wall_s) for o in both] == [("s1", 1, 60.0), ("s2", 2, 20.0)]


def test_a_point_whose_ranks_waited_for_a_core_is_timed_with_company_and_flagged():
    """No other run beside it, but other processes on its cores (the sweep's own start-up on two
    cores): its ranks waited for one 40% of the time. The repeats that had cores to themselves set
    the time; where none did, the flag says what slowed it and by how much."""
    configs = [{"hidden": 64, "batch_size": 64, "nproc": n, "lr": lr} for n in (1, 2) for lr in (0.1, 0.2)]
    timings = {(1, 0.1): (20, 0.4), (1, 0.2): (10, 0.049), (2, 0.1): (5, 0.0), (2, 0.2): (5.2, 0.0)}
    pts = [
        point(f"p{i}", c, timings[(c["nproc"], c["lr"])][0], wait=timings[(c["nproc"], c["lr"])][1])
        for i, c in enumerate(configs)
    ]
    (fam,) = families.families(configs)
    one, two = families.family_rows(pts, fam)
    assert (one.batch_ms, one.contended, one.trusted) == (10, 1, True)  # 4.9%: under CORE_WAIT, alone
    assert families.flags(fam, [one, two]) == []
    pair = [configs[0], configs[2]]
    (fam,) = families.families(pair)
    waited = [point("one", pair[0], 20, wait=0.4), point("two", pair[1], 5)]
    rows = families.family_rows(waited, fam)
    assert not rows[0].trusted and rows[1].trusted and rows[1].efficiency == pytest.approx(2.0)
    assert families.flags(fam, rows) == [
        "nproc=1 was timed only with other processes on its cores (its ranks waited for one 40% of the time): its "
        "speedup is not to be trusted (give its ranks cores no other process needs meanwhile)",
        "efficiency 200% at nproc=2 is above 1: its baseline nproc=1 was slowed by other processes on its cores "
        "(its ranks waited for one 40% of the time)",
    ]
    repeats = [point("a", pair[0], 20, wait=0.4), point("b", {**pair[0], "lr": 0.2}, 21, wait=0.3), waited[1]]
    (fam,) = families.families([p.config for p in repeats])
    (said, _) = families.flags(fam, families.family_rows(repeats, fam))  # #49: each kind of company once
    assert said.count("other processes on its cores") == 1 and "waited for one 40%" in said, said
    (fam,) = families.families(pair)
    both = [point("one", pair[0], 20, beside=1, wait=0.4), point("two", pair[1], 5)]
    (first, _) = families.flags(fam, families.family_rows(both, fam))
    assert first.startswith("nproc=1 was timed only with other runs beside it and other processes on its cores")
    assert first.endswith(
        "(run the study with perf.timing=exclusive; give its ranks cores no other process needs meanwhile)"
    )


def test_the_findings_say_what_limits_a_speedup_and_where_scaling_would_pay():
    """The issue's example: at hidden=512, B=3200, each of 4 ranks computes 800 rows in 0.03 ms and the
    sum takes 0.04 ms: nproc=1 is fastest, and a batch about 4/3 as large would let a rank's work match
    the sum; at B=12800 the GPUs' work dominates and nproc=4 pays."""
    from sweeper.report import limits

    small = [{"hidden": 512, "batch_size": 3200, "nproc": n} for n in (1, 4)]
    (fam,) = families.families(small)
    one = {"forward": 0.03, "backward": 0.03, "update": 0.005}
    four = {"forward": 0.012, "backward": 0.013, "update": 0.005, "sum": 0.04, "wait": 0.002, "queue": 0.02}
    pts = [
        point("one", small[0], 0.066, interval=(0.065, 0.067), phases=one),
        point("four", small[1], 0.073, interval=(0.072, 0.074), phases=four),
    ]
    said = limits.limit(fam, families.family_rows(pts, fam))
    assert said == (
        "at nproc=4 a rank computes 800 rows in 0.03 ms (nproc=1: 3200 in 0.065 ms), sums in 0.04 ms and waits "
        "0.002 ms for the slowest rank: the sum limits the speedup; nproc=1 is fastest (scaling would pay from a "
        "batch of about 4,500, where a rank's work would match the sum and the wait)"
    )
    large = [{"hidden": 512, "batch_size": 12800, "nproc": n} for n in (1, 4)]
    (fam,) = families.families(large)
    pts = [
        point("one", large[0], 0.26, interval=(0.259, 0.261), phases={"forward": 0.12, "backward": 0.12}),
        point(
            "four", large[1], 0.084, interval=(0.083, 0.085), phases={"forward": 0.03, "backward": 0.03, "sum": 0.024}
        ),
    ]
    said = limits.limit(fam, families.family_rows(pts, fam))
    assert said.endswith("the sum limits the speedup; nproc=4 is 3.10x faster")
    from sweeper.report import findings  # the terminal's line: the speedup, what limits it, no figures

    (line,) = findings.brief(pts, ["nproc"], None, [(fam, families.family_rows(pts, fam))])[-1:]
    assert (
        line
        == "Strong scaling, batch_size=12800: speedup 3.10x at nproc=4 (77% efficiency): the sum limits the speedup."
    )
    # A step bound by its launches: the CPU's time to queue a batch is the batch's.
    launch = {**four, "queue": 0.072}
    pts = [
        point("one", small[0], 0.066, interval=(0.065, 0.067), phases=one),
        point("four", small[1], 0.073, interval=(0.072, 0.074), phases=launch),
    ]
    (fam,) = families.families(small)
    said = limits.limit(fam, families.family_rows(pts, fam))
    assert "the launches (the CPU took 0.072 ms to queue a batch the GPU ran in 0.073 ms) limits the speedup" in said


def test_no_limit_is_named_through_wide_noise_or_for_timings_others_slowed():
    """An efficiency interval from 2% to 480% names no limit; a family whose timings had company gets
    its flags, and no sentence of what limits it."""
    from sweeper.report import limits

    configs = [{"hidden": 16, "batch_size": 40, "nproc": n} for n in (1, 2)]
    (fam,) = families.families(configs)
    phases = {"forward": 0.1, "backward": 0.1, "sum": 1.3, "wait": 0.1}
    wide = [point("one", configs[0], 0.2, interval=(0.02, 1.0)), point("two", configs[1], 2, interval=(0.1, 3.0))]
    for p in wide:
        p.metrics.update({metrics.phase_time(k): v for k, v in phases.items()})
    said = limits.limit(fam, families.family_rows(wide, fam))
    assert "its timing noise is too wide to name a limit" in said and "would pay" not in said
    slowed = [point("one", configs[0], 0.2, wait=0.6, phases=phases), point("two", configs[1], 0.3, phases=phases)]
    assert limits.limit(fam, families.family_rows(slowed, fam)) == ""


def test_the_lr_studys_loss_axis_is_positive_and_logarithmic_its_diverged_curve_marked():
    from sweeper.report import convergence
    from sweeper.report.plotting import pyplot

    losses = {0.001: [2.3, 2.2, 2.1], 0.1: [2.3, 0.9, 0.2], 5.0: [2.3, 40.0, math.nan]}
    pts = [
        point(f"lr={lr}", {"nproc": 1, "batch_size": 8, "lr": lr}, 1, loss=list(enumerate(ys)))
        for lr, ys in losses.items()
    ]
    fig = convergence.loss_figure(pts, ["lr"])
    try:
        for a in fig.axes:
            if a.get_ylabel() == "training loss":
                assert a.get_yscale() == "log" and a.get_ylim()[0] > 0, (a.get_yscale(), a.get_ylim())
    finally:
        pyplot().close(fig)
    narrow = [point("h", {"nproc": 1, "batch_size": 8, "hidden": h}, 1, loss=[(0, 2.3), (1, 2.0)]) for h in (8, 16)]
    fig = convergence.loss_figure(narrow, ["hidden"])  # 2.0 to 2.3: a linear axis, from 0
    try:
        assert all(a.get_ylim()[0] == 0 for a in fig.axes if a.get_ylabel() == "training loss")
    finally:
        pyplot().close(fig)


def test_a_figures_title_says_what_its_data_shows():
    from sweeper.report import convergence

    key = metrics.weight_error("max")
    pts = [point(f"h{h}", {"nproc": 1, "batch_size": 8, "hidden": h}, 1) for h in (16, 64, 256)]
    for p, error in zip(pts, (2e-7, 3e-7, 2.5e-7)):
        p.metrics[key] = error
    assert convergence._error_trend(pts, "hidden", key) == (
        "The weight error barely moves with hidden: 2e-07 at hidden=16, 2.5e-07 at hidden=256"
    )
    for p, error in zip(pts, (1e-7, 1e-5, 1e-3)):
        p.metrics[key] = error
    assert convergence._error_trend(pts, "hidden", key).startswith("The weight error grows with hidden")


def test_names_and_figures_round_to_four_significant_digits():
    from sweeper.report.plotting import fmt
    from sweeper.search.space import label, overrides

    params = {"lr": 0.1155430951647376, "nproc": 2}
    assert label(params) == ["lr=0.1155", "nproc=2"]  # the trial's run name
    assert overrides(params) == ["lr=0.1155430951647376", "nproc=2"]  # its config keeps every digit
    assert fmt(0.1155430951647376) == "0.1155" and fmt(5e-05) == "5e-05"
