"""The course's performance model: FLOPs and bytes per batch, datasheet peaks, the roofline.

CME 213 HW6 Problem 2 and the final project, Q2.3-2.5: the one home of the FLOP and byte model
and of the peaks. D inputs, H hidden units, C classes, B samples in the (global) batch. Additions
and multiplications count one FLOP each.
"""

from __future__ import annotations

import math


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


def gradient_bytes(D: int, H: int, C: int, itemsize: int) -> int:
    """The course's b of the all-reduce (002 Q2.3): the gradient's HD + H + CH + C values."""
    return (H * D + H + C * H + C) * itemsize


# What crosses the slow links per rank and batch (course 001 Q2.2, 002 Q2.3): "pci" between host
# and GPU, "mpi" between the ranks. ``comm`` says how the gradient is summed (the all-reduce class
# that ran, trainer/ranks/allreduce.py): "nccl" (NcclAllreduce: device buffers, nothing over PCIe), "mpi"
# (HostAllreduce on the GPU: staged through pinned host buffers, one copy down and one up) or
# "host" (HostAllreduce on the CPU: the gradient is in host memory already). One rank sums nothing.
COMMS = ("nccl", "mpi", "host")


def transfer_bytes(
    rows: int, D: int, H: int, C: int, itemsize: int, nproc: int, comm: str, images_per_batch: bool
) -> dict[str, int]:
    """Bytes one rank moves per batch, as the course counts them; ``rows``: that rank's share of the batch.

    - pci: the batch's images copied host -> device when they are copied per batch
      (``images_per_batch``: ``data.on_device=false`` on the GPU; labels not counted, as in 001 Q2.2),
      plus 2b for the host-staged all-reduce (``comm="mpi"``, nproc > 1: gradient down, sum up; 001 Q2.2);
    - mpi: 2b for nproc > 1, the course's count for summing b bytes over the ranks (002 Q2.3), whichever
      library sums them (MPI, or NCCL over NVLink).

    b = gradient_bytes (the all-reduce's loss slot, one value, is not counted)."""
    if comm not in COMMS:
        raise ValueError(f"comm={comm!r}: expected one of {', '.join(COMMS)}")
    b = gradient_bytes(D, H, C, itemsize)
    pci = rows * D * itemsize if images_per_batch else 0
    mpi = 0
    if nproc > 1:
        mpi = 2 * b
        if comm == "mpi":
            pci += 2 * b
    return {"pci": pci, "mpi": mpi}


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved (inf when nothing moves)."""
    return flops / nbytes if nbytes else math.inf


# Dense datasheet peaks in TFLOP/s per arithmetic unit (NVIDIA datasheets; figures given "with
# sparsity" are halved): fp64 = the fastest FP64 there is (FP64 tensor cores on A100, H100, H200,
# where cuBLAS's DGEMM runs; the CUDA cores' FP64 is half that), fp32 = CUDA cores, tf32 and bf16 =
# tensor cores. A unit the device lacks is absent. Matched against the CUDA device name with '-'
# read as ' ', lower case, first match wins (so the variants come before their family).
PEAKS: list[tuple[str, dict[str, float]]] = [
    # H200 NVL / H100 NVL datasheets, per GPU: FP64 30, FP64 TC 60, FP32 60, TF32 835*, BF16 1,671*
    ("H200 NVL", {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5}),
    # H200 (SXM) datasheet: FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16 1,979*
    ("H200", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5}),
    ("H100 NVL", {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5}),
    # H100 PCIe datasheet: FP64 26, FP64 TC 51, FP32 51, TF32 756*, BF16 1,513*
    ("H100 PCIe", {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5}),
    # H100 SXM datasheet: FP64 34, FP64 TC 67, FP32 67, TF32 989*, BF16 1,979*
    ("H100", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5}),
    # A100 (40 and 80 GB, SXM and PCIe) datasheet: FP64 9.7, FP64 TC 19.5, FP32 19.5, TF32 156, BF16 312
    ("A100", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    # Volta: no FP64, TF32 or BF16 tensor cores (its tensor cores multiply FP16 only).
    ("V100S", {"fp64": 8.2, "fp32": 16.4}),  # V100S PCIe datasheet
    ("V100 PCIe", {"fp64": 7.0, "fp32": 14.0}),  # V100 PCIe datasheet
    ("V100", {"fp64": 7.8, "fp32": 15.7}),  # V100 SXM2 datasheet
    # Turing: FP32 16.3 (datasheet); FP64 at 1/32 of FP32 (not on the datasheet); FP16 tensor cores only.
    ("Quadro RTX 6000", {"fp64": 0.51, "fp32": 16.3}),
]

# The arithmetic each GEMM mode runs on (trainer/run.py gemm_mode, the generic step's plain dtypes)
# and the products it takes per model GEMM at fewest (trainer/options.py gemm_products: tf32x3 takes
# 2 on the pixels, which are exact in TF32, and 3 on other inputs).
GEMM_ARITHMETIC: dict[str, tuple[str, int]] = {
    "sgemm": ("fp32", 1),
    "float32": ("fp32", 1),
    "tf32": ("tf32", 1),
    "tf32x3": ("tf32", 2),
    "bf16x3": ("bf16", 3),
    "dgemm": ("fp64", 1),
    "float64": ("fp64", 1),
}
UNIT_NAMES = {
    "fp64": "FP64 (tensor cores where the GPU has them)",
    "fp32": "FP32 CUDA cores",
    "tf32": "TF32 tensor cores",
    "bf16": "BF16 tensor cores",
}


def device_peaks(device_name: str) -> dict[str, float] | None:
    """The datasheet peaks (TFLOP/s per unit) of the device with this CUDA name, or None when unknown."""
    name = device_name.lower().replace("-", " ").replace("_", " ")
    for key, peaks in PEAKS:
        if key.lower() in name:
            return peaks
    return None


def gemm_unit(gemm: str, products: int | None = None) -> tuple[str, int]:
    """(arithmetic unit, products per model GEMM) of a GEMM mode; ``products`` as the run's step took
    them (the tag sweepscale.gemm_products), else the mode's fewest."""
    if gemm not in GEMM_ARITHMETIC:
        raise ValueError(f"gemm={gemm!r}: expected one of {', '.join(GEMM_ARITHMETIC)}")
    unit, fewest = GEMM_ARITHMETIC[gemm]
    return unit, products or fewest


def peak_tflops(device_name: str, gemm: str, products: int | None = None) -> float | None:
    """Peak model TFLOP/s of one GPU for a GEMM mode: the datasheet peak of the arithmetic it runs on,
    divided by the products it takes per model GEMM, so that model FLOP/s over it cannot exceed 1.
    None when the device is unknown or lacks that arithmetic."""
    unit, n = gemm_unit(gemm, products)
    peaks = device_peaks(device_name)
    if peaks is None or unit not in peaks:
        return None
    return peaks[unit] / n


def peak_arithmetic(gemm: str, products: int | None = None) -> str:
    """Words for the arithmetic peak_tflops divides, e.g. 'BF16 tensor cores / 3 products'."""
    unit, n = gemm_unit(gemm, products)
    return UNIT_NAMES[unit] + (f" / {n} products" if n > 1 else "")


def roofline(ai: float, peak_flops: float, bandwidth: float) -> float:
    """Standard roofline: min(peak, AI * bandwidth), compute and transfers overlapping."""
    return min(peak_flops, ai * bandwidth)


def serial_roofline(
    ai: float, p_flops: float, p_pci: float, p_mpi: float | None = None, *, pci_share: float = 0.5
) -> float:
    """The course's roofline with copies NOT overlapping compute.

    Without ``p_mpi`` (001 Q2.2): AI / (AI/P_flops + 1/P_pci). With it (002 Q2.5): the bytes go
    over both links at the effective bandwidth (bytes_pci + bytes_mpi) / (t_pci + t_mpi), so
    AI / (AI/P_flops + s/P_pci + (1 - s)/P_mpi) with s = ``pci_share`` = bytes_pci / (bytes_pci +
    bytes_mpi); the course's two-GPU case moves as many bytes over each (s = 1/2):
    AI / (AI/P_flops + 1/2 (1/P_pci + 1/P_mpi)). Infinite AI (nothing moved) gives P_flops."""
    if math.isinf(ai):
        return p_flops
    per_byte = 1 / p_pci if p_mpi is None else pci_share / p_pci + (1 - pci_share) / p_mpi
    return ai / (ai / p_flops + per_byte)
