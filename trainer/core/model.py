"""The course's two-layer MLP (appendix C of CME 213 HW6), written once against an array module.

Every function takes arrays and returns arrays (or writes into arrays it is given); ``xp`` is
NumPy or CuPy, found from the arguments, so the CPU reference and the GPU ranks run this code.

Layout: samples are rows. X is (n, D), W1 (H, D), b1 (H,), W2 (C, H), b2 (C,).
    z1 = X W1^T + b1,  a1 = sigmoid(z1),  z2 = a1 W2^T + b2,  yhat = softmax(z2)
    J  = (1/B) sum_i CE_i + (reg/2) (||W1||^2 + ||W2||^2)          (biases not penalised)

The parameters and the gradients each live in ONE flat buffer; W1, b1, W2, b2 are views into
it. The gradient buffer has one extra slot for the batch's summed cross-entropy, so a rank's
whole contribution (gradient and loss) is all-reduced in a single call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

Array = Any  # numpy.ndarray or cupy.ndarray
NAMES = ("W1", "b1", "W2", "b2")


def array_module(a: Array) -> Any:
    """NumPy or CuPy, whichever owns ``a`` (CuPy is only imported if it is already loaded)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


class Params(NamedTuple):
    W1: Array
    b1: Array
    W2: Array
    b2: Array


@dataclass(frozen=True)
class Layout:
    """Where each parameter sits in the flat buffer."""

    D: int
    H: int
    C: int = 10

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"W1": (self.H, self.D), "b1": (self.H,), "W2": (self.C, self.H), "b2": (self.C,)}

    @property
    def size(self) -> int:
        """Number of parameters: HD + H + CH + C."""
        return self.H * self.D + self.H + self.C * self.H + self.C

    def views(self, flat: Array) -> Params:
        out, offset = [], 0
        for shape in self.shapes.values():
            n = int(np.prod(shape))
            out.append(flat[offset : offset + n].reshape(shape))
            offset += n
        return Params(*out)


# Initial weights, per scheme (model.init); biases start at zero in both.
#   fan_in: W ~ N(0, 1/fan_in), pre-activations of order one on [0, 1] pixels whatever the width.
#   course: W ~ 0.01 N(0, 1), the course's C++ (NeuralNetwork(): W[i] = 0.01 * arma::randn(...)).
INITS = ("fan_in", "course")
COURSE_STD = 0.01


def init_params(layout: Layout, seed: int, dtype: str, init: str = "fan_in") -> np.ndarray:
    """Seeded host-side init, identical on every rank: W as ``init`` says (INITS), b = 0."""
    if init not in INITS:
        raise ValueError(f"init={init!r}: expected one of {', '.join(INITS)}")
    rng = np.random.default_rng(seed)
    flat = np.zeros(layout.size, dtype=dtype)
    p = layout.views(flat)
    for w, fan_in in ((p.W1, layout.D), (p.W2, layout.H)):
        z = rng.standard_normal(w.shape)
        w[...] = z / np.sqrt(fan_in) if init == "fan_in" else COURSE_STD * z
    return flat


def sigmoid(z: Array, out: Array | None = None) -> Array:
    """1 / (1 + exp(-z)), written into ``out`` if given (``z`` itself may be). One array, not four
    temporaries: on the CPU each (n, H) temporary is fresh memory to fault in (the H=2048 reference's
    sigmoid took twice as long)."""
    xp = array_module(z)
    s = xp.negative(z, out=out)
    with np.errstate(over="ignore"):  # exp(-z) overflows to inf for z below -88 (float32), as on bytes
        xp.exp(s, out=s)  # (data.scale=byte): 1 / (1 + inf) = 0 is the right limit, not worth a warning
    s += 1
    return xp.reciprocal(s, out=s)


def forward(p: Params, x: Array) -> tuple[Array, Array]:
    """Return the hidden activations a1 (n, H) and the logits z2 (n, C)."""
    z1 = x @ p.W1.T
    z1 += p.b1
    a1 = sigmoid(z1, out=z1)
    z2 = a1 @ p.W2.T + p.b2
    return a1, z2


def softmax_xent(z2: Array, y: Array) -> tuple[Array, Array]:
    """Softmax probabilities (n, C) and the summed cross-entropy (0-d), stable via log-sum-exp."""
    xp = array_module(z2)
    shifted = z2 - z2.max(axis=1, keepdims=True)
    log_norm = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    log_p = shifted - log_norm
    ce_sum = -log_p[xp.arange(len(y)), y].sum()
    return xp.exp(log_p), ce_sum


def backward(p: Params, x: Array, y: Array, a1: Array, yhat: Array, scale: float, g: Params) -> None:
    """Write the data term of dJ/dp for this slice of the batch into ``g``.

    ``scale`` is 1/B for the GLOBAL batch size B, so the slices' gradients add up to the
    full batch's. The L2 term is not here: it is added once, in :func:`sgd_update`.
    """
    xp = array_module(x)
    dz2 = yhat * scale  # dJ/dz2 = (yhat - onehot(y)) / B
    dz2[xp.arange(len(y)), y] -= scale
    xp.matmul(dz2.T, a1, out=g.W2)
    dz2.sum(axis=0, out=g.b2)
    dz1 = dz2 @ p.W2
    slope = 1 - a1  # sigmoid'(z1) = a1 (1 - a1), in one temporary
    slope *= a1
    dz1 *= slope
    xp.matmul(dz1.T, x, out=g.W1)
    dz1.sum(axis=0, out=g.b1)


def penalty(p: Params, reg: float) -> Array:
    """(reg/2)(||W1||^2 + ||W2||^2) as a 0-d array (stays on the device)."""
    xp = array_module(p.W1)
    return (reg / 2) * (xp.vdot(p.W1, p.W1) + xp.vdot(p.W2, p.W2))


def sgd_update(p: Params, g: Params, lr: float, reg: float) -> None:
    """p <- p - lr (g + reg W) for the weights, p <- p - lr g for the biases; in place."""
    for w, gw in ((p.W1, g.W1), (p.W2, g.W2)):
        w *= 1 - lr * reg
        w -= lr * gw
    for b, gb in ((p.b1, g.b1), (p.b2, g.b2)):
        b -= lr * gb


def loss(p: Params, x: Array, y: Array, reg: float) -> Array:
    """Full cost J on (x, y): mean cross-entropy plus the L2 penalty."""
    _, z2 = forward(p, x)
    _, ce_sum = softmax_xent(z2, y)
    return ce_sum / len(y) + penalty(p, reg)


def gradient(p: Params, layout: Layout, x: Array, y: Array, reg: float) -> Array:
    """Full gradient dJ/dp on (x, y) as a flat array (data term plus L2), for checks."""
    xp = array_module(x)
    flat = xp.zeros(layout.size, dtype=x.dtype)
    g = layout.views(flat)
    a1, z2 = forward(p, x)
    yhat, _ = softmax_xent(z2, y)
    backward(p, x, y, a1, yhat, 1.0 / len(y), g)
    g.W1[...] += reg * p.W1
    g.W2[...] += reg * p.W2
    return flat


def correct(p: Params, x: Array, y: Array) -> Array:
    """Number of samples whose arg-max class is the label (0-d array)."""
    _, z2 = forward(p, x)
    return (z2.argmax(axis=1) == y).sum()
