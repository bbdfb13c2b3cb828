"""The course's MLP math: gradients against finite differences, NumPy and CuPy."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.core import model


def small_problem(xp, n=7, D=6, H=5, C=4, seed=1):
    rng = np.random.default_rng(seed)
    layout = model.Layout(D=D, H=H, C=C)
    params = rng.standard_normal(layout.size)
    x = rng.random((n, D))
    y = rng.integers(0, C, n)
    return layout, xp.asarray(params), xp.asarray(x), xp.asarray(y)


def test_gradient_matches_central_differences(xp):
    layout, params, x, y = small_problem(xp)
    reg = 0.3
    grad = model.gradient(layout.views(params), layout, x, y, reg)
    eps = 1e-6
    numeric = np.empty(layout.size)
    for i in range(layout.size):
        plus, minus = params.copy(), params.copy()
        plus[i] += eps
        minus[i] -= eps
        lp = float(model.loss(layout.views(plus), x, y, reg))
        lm = float(model.loss(layout.views(minus), x, y, reg))
        numeric[i] = (lp - lm) / (2 * eps)
    grad = np.asarray(grad.get() if hasattr(grad, "get") else grad)
    assert np.max(np.abs(grad - numeric)) / np.max(np.abs(numeric)) < 1e-7


def test_gradient_of_slices_adds_up_to_full_batch(xp):
    """Data parallelism's premise: per-slice gradients scaled by 1/B sum to the batch's."""
    layout, params, x, y = small_problem(xp, n=11)
    p = layout.views(params)
    full = model.gradient(p, layout, x, y, reg=0.0)
    total = xp.zeros(layout.size)
    for lo, hi in [(0, 4), (4, 8), (8, 11)]:
        part = xp.zeros(layout.size)
        a1, z2 = model.forward(p, x[lo:hi])
        yhat, _ = model.softmax_xent(z2, y[lo:hi])
        model.backward(p, x[lo:hi], y[lo:hi], a1, yhat, 1 / 11, layout.views(part))
        total += part
    assert float(xp.max(xp.abs(total - full))) < 1e-14


def test_softmax_xent_is_stable_for_large_logits(xp):
    z2 = xp.asarray([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])
    y = xp.asarray([0, 2])
    yhat, ce = model.softmax_xent(z2, y)
    assert bool(xp.all(xp.isfinite(yhat)))
    assert abs(float(ce) - np.log(3)) < 1e-12


def test_sgd_update_penalises_weights_not_biases(xp):
    layout = model.Layout(D=2, H=2, C=2)
    params = xp.ones(layout.size)
    grads = xp.zeros(layout.size)
    model.sgd_update(layout.views(params), layout.views(grads), lr=0.5, reg=0.2)
    p = layout.views(params)
    assert float(p.W1[0, 0]) == 1 - 0.5 * 0.2 and float(p.b1[0]) == 1.0


def test_init_is_seeded_and_unbiased():
    layout = model.Layout(D=784, H=64)
    a, b = model.init_params(layout, 3, "float32"), model.init_params(layout, 3, "float32")
    assert a.dtype == np.float32 and np.array_equal(a, b)
    p = layout.views(a)
    assert not p.b1.any() and abs(p.W1.std() * np.sqrt(784) - 1) < 0.05


def test_init_schemes_differ_only_in_the_weights_scale():
    """model.init: fan_in draws W ~ N(0, 1/fan_in), course W ~ 0.01 N(0, 1) (the course's C++); the same
    seed gives the same normal draws, and the biases are zero in both."""
    layout = model.Layout(D=784, H=512)
    fan_in = layout.views(model.init_params(layout, 5, "float64", "fan_in"))
    course = layout.views(model.init_params(layout, 5, "float64", "course"))
    for p in (fan_in, course):
        assert not p.b1.any() and not p.b2.any()
    for w in (course.W1, course.W2):  # 0.01 whatever the width; the mean within 5 standard errors of 0
        assert abs(w.std() / 0.01 - 1) < 0.03 and abs(w.mean()) < 5 * 0.01 / np.sqrt(w.size)
    assert abs(fan_in.W2.std() * np.sqrt(512) - 1) < 0.03
    np.testing.assert_allclose(course.W1 / 0.01, fan_in.W1 * np.sqrt(784), rtol=1e-12)
    np.testing.assert_allclose(course.W2 / 0.01, fan_in.W2 * np.sqrt(512), rtol=1e-12)


def test_default_init_is_fan_in():
    layout = model.Layout(D=20, H=8)
    assert np.array_equal(model.init_params(layout, 1, "float32"), model.init_params(layout, 1, "float32", "fan_in"))


def test_unknown_init_is_refused():
    with pytest.raises(ValueError, match=r"init='xavier': expected one of fan_in, course"):
        model.init_params(model.Layout(D=4, H=3), 0, "float32", "xavier")
