"""The seeds' performance model: FLOPs and bytes per batch, datasheet peaks, the roofline.

CME 213 HW6 Problem 2 and the final project, Q2.3-2.5. D inputs, H hidden units, C classes,
B samples in the (global) batch. Additions and multiplications count one FLOP each.
"""

from __future__ import annotations


def forward_flops(B: int, D: int, H: int, C: int) -> int:
    """Two GEMMs: X W1^T (2BHD) and a1 W2^T (2BHC)."""
    return 2 * B * H * (D + C)


def backward_flops(B: int, D: int, H: int, C: int) -> int:
    """dW2 = dz2^T a1 (2BHC), dz1 = dz2 W2 (2BHC), dW1 = dz1^T X (2BHD)."""
    return 2 * B * H * D + 4 * B * H * C


def batch_flops(B: int, D: int, H: int, C: int) -> int:
    """One SGD step: 4BHD + 6BHC (element-wise work is lower order and not counted)."""
    return forward_flops(B, D, H, C) + backward_flops(B, D, H, C)


def allreduce_bytes(D: int, H: int, C: int, itemsize: int) -> int:
    """Bytes each rank all-reduces per batch: the flat gradient (HD+H+CH+C) plus the loss slot."""
    return (H * D + H + C * H + C + 1) * itemsize


# Dense datasheet peaks in TFLOP/s, matched against the CUDA device name (first match wins).
# "tf32" is the tensor-core rate without sparsity.
DATASHEET_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"float32": 67.0, "float64": 34.0, "tf32": 494.7}),
    ("H100 PCIe", {"float32": 51.2, "float64": 25.6, "tf32": 378.0}),
    ("H100", {"float32": 67.0, "float64": 34.0, "tf32": 494.7}),
    ("A100", {"float32": 19.5, "float64": 9.7, "tf32": 156.0}),
    ("V100", {"float32": 15.7, "float64": 7.8}),
    ("Quadro RTX 6000", {"float32": 16.3, "float64": 0.51}),
]


def datasheet_peak_tflops(device_name: str, mode: str) -> float | None:
    """Peak of one GPU for ``mode`` (float32, float64 or tf32), or None when unknown."""
    for key, peaks in DATASHEET_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks.get(mode)
    return None


def roofline(ai: float, peak_flops: float, bandwidth: float) -> float:
    """Standard roofline: min(peak, AI * bandwidth), compute and transfers overlapping."""
    return min(peak_flops, ai * bandwidth)


def serial_roofline(ai: float, peak_flops: float, bandwidth: float) -> float:
    """The seeds' PCIe-modified roofline, copies NOT overlapping compute: AI / (AI/P + 1/BW)."""
    return ai / (ai / peak_flops + 1 / bandwidth)
