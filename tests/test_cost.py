"""The dry run's cost estimate (sweeper/plan/cost.py): rates from earlier runs, pure; the real
store and preview are tested in tests/test_sweeper.py (a sweep's totals, then its dry run)."""

from __future__ import annotations

import pytest

from sweeper.plan import cost
from trainer import metrics

KEY = cost.cost_key({"hidden": 512, "batch_size": 3200, "nproc": 2, "device": "gpu", "dtype": "float32"})


def test_a_shapes_rate_is_the_median_of_its_runs_so_one_slowed_run_moves_nothing():
    runs = [cost.Measured(KEY, "gpu", 1000, held, training) for held, training in [(3, 1), (4, 2), (40, 30)]]
    (rate,) = cost.rates(runs).values()
    assert (rate.per_sample_s, rate.own_s, rate.runs) == (pytest.approx(0.002), 2.0, 3)
    assert rate.seconds(10_000) == pytest.approx(22.0)


def test_a_run_is_read_from_its_params_and_metrics_and_one_without_device_seconds_is_skipped():
    params = {"hidden": "512", "batch_size": "3200", "nproc": "2", "device": "gpu", "dtype": "float32", "epochs": "5"}
    values = {metrics.N_TRAIN: 60000, metrics.device_seconds("gpu"): 9.0, metrics.device_seconds("gpu", True): 6.0}
    assert cost.from_run(params, values) == cost.Measured(KEY, "gpu", 300_000, 9.0, 6.0)
    assert cost.from_run(params, {metrics.N_TRAIN: 60000}) is None  # failed before its end
    assert cost.rates([cost.Measured(KEY, "gpu", 0, 1.0, 1.0)]) == {}  # a parent: no samples of its own
