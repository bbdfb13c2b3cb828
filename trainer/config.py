"""Typed schema of the trainer's configuration, registered in Hydra's ConfigStore.

The values live in ``conf/base/run.yaml``, ``conf/gpu/``, ``conf/paths/`` and the presets; the
types live here, so Hydra itself rejects unknown keys (``Key 'hiden' not in 'TrainerConfig'``) and
ill-typed values. Range checks that a type cannot express are in :func:`validate`, run before any
rank starts or job is submitted; trainer/override_checks.py refuses the keys that moved.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum

from omegaconf import MISSING, OmegaConf

from trainer import limits
from trainer.errors import ConfigError
from trainer.override_checks import extra_keys, unknown_key


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


class Step(str, Enum):
    auto = "auto"  # fused on the GPU, generic on the CPU
    generic = "generic"  # model.py, one array op per kernel: the readable reference
    fused = "fused"  # trainer/gpu/fused_step.py's fused kernels (GPU only)


class Comm(str, Enum):
    auto = "auto"  # NCCL when every rank has its own GPU, else MPI
    nccl = "nccl"  # NCCL on device buffers
    mpi = "mpi"  # the course's scheme: host-staged MPI_Allreduce through pinned buffers


class Gemm(str, Enum):
    bf16x3 = "bf16x3"  # float32 accuracy from three BF16 tensor-core products, pixels only
    tf32x3 = "tf32x3"  # float32 accuracy from TF32 tensor-core products: two on pixels, three otherwise
    sgemm = "sgemm"  # cuBLAS SGEMM on the CUDA cores
    tf32 = "tf32"  # one TF32 tensor-core product (CUPY_TF32=1 for CuPy's own matmuls too): not float32 accuracy


class Overlap(str, Enum):
    auto = "auto"  # where it was measured to pay (trainer/gpu/policy.py OVERLAP_PAYS)
    always = "always"  # whenever the fused step sums with NCCL (nproc > 1): W1's gradient in halves
    never = "never"  # all-reduce after the backward pass


class Graph(str, Enum):
    auto = "auto"  # the fused step's phases as CUDA graphs wherever its operands stay put (trainer/gpu/policy.py)
    never = "never"  # every launch from Python, each step (the eager step)


class NcclWindow(str, Enum):
    auto = "auto"  # where it was measured to pay: all but sums beside SGEMMs (trainer/gpu/policy.py)
    always = "always"  # NCCL 2.27+: the gradient in a symmetric memory window, summed by NCCL's symmetric kernels
    never = "never"  # a plain device buffer, NCCL's regular kernels


class DType(str, Enum):
    float32 = "float32"
    float64 = "float64"


class FaultKind(str, Enum):
    error = "error"  # a Python error: the rank records it and ends the run FAILED
    kill = "kill"  # SIGKILL: the process is gone at once, as the OOM killer would leave it
    lost_sigterm = "lost_sigterm"  # a SIGTERM a library swallowed (bare except): KILLED at the epoch's end


class Divergence(str, Enum):
    stop = "stop"  # a non-finite loss ends the run FAILED ("diverged at step k"), after its epoch
    go_on = "go_on"  # train on: the run ends FINISHED, its NaN losses recorded


class Init(str, Enum):
    fan_in = "fan_in"  # W ~ N(0, 1/fan_in), b = 0: pre-activations of order one on [0, 1] pixels
    course = "course"  # W = 0.01 N(0, 1), b = 0: the course's C++ (NeuralNetwork(): 0.01 * arma::randn, b.zeros)


class Timing(str, Enum):
    shared = "shared"  # timed beside whatever else runs on the host, which the run records (timing/beside)
    exclusive = "exclusive"  # no other run's timed batches on the host meanwhile (trainer/ranks/contention.py)


class PixelScale(str, Enum):
    unit = "unit"  # k / 255, in [0, 1]
    byte = "byte"  # k itself, 0..255: the course's read_mnist casts each byte to nn_real, unscaled


@dataclass
class DataConfig:
    # Folder with the four IDX files (gzip or raw). None: the embedded handwritten digits.
    dir: str | None = MISSING
    # Take the first N samples (None: all). The course uses n_train=38400.
    n_train: int | None = MISSING
    n_test: int | None = MISSING
    # Batches are taken in order unless asked; the permutation of each epoch is seeded.
    shuffle: bool = MISSING
    # Keep the training set on the device for the whole run (one upload) instead of copying
    # each batch from pinned host memory, as the course's code did.
    on_device: bool = MISSING
    # Pixel values the model sees: unit (k / 255) or byte (k, as the course's code reads them).
    scale: PixelScale = MISSING


@dataclass
class ModelConfig:
    # Initial weights (biases are zero either way): fan_in or course (the course's 0.01 N(0, 1)).
    init: Init = MISSING


@dataclass
class CheckConfig:
    # Train the same network sequentially with NumPy on rank 0 and log the relative error.
    reference: bool = MISSING
    # After how many steps the weights are compared: a number (the first k steps; fewer if the run
    # has fewer) or "all" (the whole run, as the course's error-vs-lr study needs).
    steps: str = MISSING
    # Where reference weights are cached, keyed by what determines them (not nproc/device).
    cache_dir: str = "${oc.env:SWEEPSCALE_CACHE,.cache/sweepscale}/reference"
    # A non-finite training loss: stop (the run FAILED) or go_on.
    divergence: Divergence = Divergence.stop


@dataclass
class MlflowConfig:
    # None: MLFLOW_TRACKING_URI from the environment, else sqlite:///mlflow.db.
    tracking_uri: str | None = None
    # None: MLFLOW_EXPERIMENT_NAME from the environment, else "sweepscale".
    experiment: str | None = None
    run_name: str | None = None
    # Set by the sweeper so the point's run nests under the sweep's run.
    parent_run_id: str | None = None
    # Extra tags, e.g. {sweepscale.sweep_id: ...}.
    tags: dict[str, str] = field(default_factory=dict)
    # With a tracking server (http): the run's writes wait here for it, training never does
    # (trainer/record/journal.py). The sweeper sets each point's folder.
    spool_dir: str | None = None


@dataclass
class SaveConfig:
    # Log the initial and final weights (W1, b1, W2, b2) as .npz artifacts.
    weights: bool = MISSING
    # Per-epoch checkpoints here (trainer/record/checkpoint.py); a run started again resumes from them.
    # Null: none. The sweeper sets each point's folder. Not hashed: where, not what.
    checkpoint_dir: str | None = None
    # Each epoch's loss and precision appended to progress.jsonl here, and a file `stop` here ends
    # the run after its epoch (trainer/lifecycle/progress.py): a search's trials, which it prunes so.
    # Null: neither. Not hashed.
    progress_dir: str | None = None


@dataclass
class PerfConfig:
    # Peak model TFLOP/s per device for perf/utilization. None: the datasheet peak of the detected
    # GPU for the arithmetic the run's GEMMs use (trainer/core/flops.py peak_tflops).
    peak_tflops: float | None = MISSING
    # The timing protocol (trainer/core/timing.py): the first epoch's batches (at least ``warmup``) are
    # left out; the rest are cut into ``repeats`` runs of at least ``min_batches`` batches and
    # ``min_seconds`` each, their medians giving the point's median and interval. A run too short
    # for that times extra steps on a scratch copy of its weights after training.
    repeats: int = MISSING
    warmup: int = MISSING
    min_batches: int = MISSING
    min_seconds: float = MISSING
    # shared, or exclusive: no other run's timed batches on this host meanwhile (a scaling study's).
    timing: Timing = MISSING


@dataclass
class MpiConfig:
    # mpiexec used when `nproc>1` is started without a launcher. None: the one next to the
    # Python interpreter (the mpich wheel's), else the first on PATH.
    mpiexec: str | None = None


@dataclass
class FaultConfig:
    # Fault injection, to exercise the failure path of runs and sweeps: on this rank at this
    # global iteration, raise an error (kind=error) or die by SIGKILL (kind=kill). Null: no fault.
    rank: int | None = None
    iteration: int | None = None
    kind: FaultKind = FaultKind.error


@dataclass
class GpuConfig:
    # How the step runs on GPUs (values: conf/gpu/default.yaml; the CPU ignores them).
    step: Step = MISSING  # auto | generic | fused: the step's implementation
    comm: Comm = MISSING  # auto | nccl | mpi: how gradients are all-reduced
    gemm: Gemm = MISSING  # the float32 GEMMs: bf16x3 | tf32x3 | sgemm (float32 accuracy) | tf32
    overlap: Overlap = MISSING  # fused step with NCCL: all-reduce behind the step's compute
    nccl_window: NcclWindow = MISSING  # NCCL 2.27+: the gradient in a symmetric memory window
    profile: bool = MISSING  # NVTX ranges per phase, for Nsight Systems
    graph: Graph = MISSING  # auto | never: the fused step's phases replayed as CUDA graphs


@dataclass
class PathsConfig:
    # Where data lives on this machine (conf/paths/default.yaml; environment-overridable). Not hashed.
    mnist: str = MISSING  # the folder of the MNIST IDX files the presets read


@dataclass
class TrainerConfig:
    # Values marked MISSING come from conf/trainer.yaml (one home for each value).
    # The five keys users sweep.
    hidden: int = MISSING
    batch_size: int = MISSING
    lr: float = MISSING
    epochs: int = MISSING
    nproc: int = MISSING
    # Model and run.
    reg: float = MISSING
    dtype: DType = MISSING
    device: Device = MISSING
    seed: int = MISSING
    gpu: GpuConfig = field(default_factory=GpuConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    save: SaveConfig = field(default_factory=SaveConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    mpi: MpiConfig = field(default_factory=MpiConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)


def register() -> None:
    from hydra.core.config_store import ConfigStore  # here: a warm worker reads configs, registers none

    ConfigStore.instance().store(name="trainer_schema", node=TrainerConfig)
    # For presets that tie keys together, e.g. batch_size: ${mul:3200,${nproc}} (B/nproc constant).
    OmegaConf.register_new_resolver("mul", lambda a, b: int(a) * int(b), replace=True)


@functools.cache
def schema() -> TrainerConfig:
    """The typed TrainerConfig with its defaults, built once per process (7 ms each time: a warm
    worker validates every point). Read it; merge into it (OmegaConf.merge copies) to fill it."""
    return OmegaConf.structured(TrainerConfig)


def validate(cfg: TrainerConfig) -> None:
    """Range checks Hydra's types cannot express, and keys ``+key=value`` added that the schema does
    not have (they would change nothing). Raises ConfigError naming key and fix."""
    for key in extra_keys(cfg, schema()):
        raise ConfigError(unknown_key(key, schema()))
    checks = [
        (
            cfg.hidden >= 1,
            f"hidden={cfg.hidden}: the hidden layer needs at least 1 unit; set hidden=512 or another positive integer",
        ),
        (cfg.nproc >= 1, f"nproc={cfg.nproc}: at least one MPI rank is needed; set nproc=1 or more"),
        (
            cfg.batch_size >= cfg.nproc,
            f"batch_size={cfg.batch_size} is smaller than nproc={cfg.nproc}: every rank needs at least "
            "one sample of each full batch; raise batch_size or lower nproc",
        ),
        (
            cfg.lr > 0 and cfg.lr == cfg.lr and cfg.lr != float("inf"),
            f"lr={cfg.lr}: the learning rate must be a positive finite number, e.g. lr=0.1",
        ),
        (cfg.epochs >= 1, f"epochs={cfg.epochs}: train for at least one epoch; set epochs=1 or more"),
        (0 <= cfg.seed < 2**32, f"seed={cfg.seed}: NumPy takes seeds from 0 to 2**32 - 1; set seed=0 or another"),
        (
            limits.weight_bytes(cfg.hidden, cfg.dtype.value) <= limits.machine_memory(),
            limits.too_big(cfg.hidden, cfg.dtype.value),
        ),
        (
            0 <= cfg.reg < float("inf"),
            f"reg={cfg.reg}: the L2 coefficient must be a finite number, 0 or more; set reg=1e-4 or 0",
        ),
        (
            cfg.data.n_train is None or cfg.data.n_train >= 1,
            f"data.n_train={cfg.data.n_train}: take at least one sample, or null for all",
        ),
        (
            cfg.data.n_test is None or cfg.data.n_test >= 0,
            f"data.n_test={cfg.data.n_test}: cannot be negative; 0 skips the test set, null takes all",
        ),
        (
            not (cfg.gpu.gemm == Gemm.tf32 and cfg.dtype == DType.float64),
            "gpu.gemm=tf32 needs dtype=float32 (TF32 is a float32 GEMM mode); choose another gpu.gemm or float32",
        ),
        (
            check_steps(cfg.check.steps) is not None,
            f"check.steps={cfg.check.steps}: compare the weights after a number of steps (e.g. check.steps=10) or "
            "after the whole run (check.steps=all); check.reference=false turns the check off",
        ),
        (
            cfg.perf.repeats >= 1,
            f"perf.repeats={cfg.perf.repeats}: the batches are timed in at least one repeat (3 give an "
            "interval); set perf.repeats=1 or more",
        ),
        (
            cfg.perf.warmup >= 0 and cfg.perf.min_batches >= 1 and cfg.perf.min_seconds >= 0,
            f"perf.warmup={cfg.perf.warmup}, perf.min_batches={cfg.perf.min_batches}, perf.min_seconds="
            f"{cfg.perf.min_seconds}: warm-up batches and seconds cannot be negative and a repeat times at "
            "least one batch; set e.g. perf.warmup=2 perf.min_batches=10 perf.min_seconds=0.05",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def check_steps(value: str) -> int | str | None:
    """check.steps as a positive number of steps, or "all"; None where it is neither."""
    text = str(value).strip().lower()
    if text == "all":
        return "all"
    return int(text) if text.isdigit() and int(text) >= 1 else None
