"""The names under which a run is recorded in MLflow: the project's public interface.

Every writer (the trainer) and every reader (the sweeper's summary, the plots) uses these.
"""

from __future__ import annotations

# Step = global iteration.
TRAIN_LOSS = "train/loss"
# Step = epoch.
TRAIN_LOSS_EPOCH = "train/loss_epoch"
TEST_PRECISION = "test/precision"
EPOCH_TIME = "time/epoch_s"

# Logged once, at the end.
PHASES = ("h2d", "forward", "backward", "allreduce", "update", "batch")
WEIGHT_ERROR_KEYS = ("W1", "b1", "W2", "b2", "max")
SAMPLES_PER_S = "perf/samples_per_s"
TFLOPS = "perf/tflops"
UTILIZATION = "perf/utilization"
ALLREDUCE_GBPS = "perf/allreduce_gbps"
FLOPS_PER_BATCH = "model/flops_per_batch"
ALLREDUCE_BYTES = "model/allreduce_bytes"

# Tags.
TAG_CONFIG_HASH = "sweepscale.config_hash"
TAG_SWEEP_ID = "sweepscale.sweep_id"
TAG_ERROR = "sweepscale.error"
TAG_TIMING = "sweepscale.timing"


def phase_time(phase: str) -> str:
    """Median milliseconds per batch spent in ``phase``."""
    return f"time/{phase}_ms"


def weight_error(name: str) -> str:
    """Relative Frobenius error of parameter ``name`` (or 'max') against the CPU reference."""
    return f"check/weight_rel_error/{name}"
