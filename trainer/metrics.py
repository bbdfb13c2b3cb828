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
N_TRAIN = "data/n_train"  # training samples an epoch: what "samples seen" counts
ALLREDUCE_BYTES = "model/allreduce_bytes"
# The course's byte model per rank and batch (trainer/core/flops.py transfer_bytes) and FLOPs per
# rank and batch over their sum (absent when no byte moves: the intensity is unbounded).
BYTES_PCI = "model/bytes_pci"
BYTES_MPI = "model/bytes_mpi"
ARITHMETIC_INTENSITY = "model/arithmetic_intensity"
# The timing protocol (trainer/core/timing.py). Step = repeat r: each repeat's median batch time;
# the interval is their range; the batches timed, and of them the steps timed after training on a
# scratch copy of the weights (a run too short for the floor).
BATCH_MS_REPEAT = "time/batch_ms_repeat"
BATCH_MS_LO = "time/batch_ms_lo"
BATCH_MS_HI = "time/batch_ms_hi"
TIMED_BATCHES = "timing/batches"
EXTRA_STEPS = "timing/extra_steps"
# time/<phase>_ms beside the loop's phases: the all-reduce split (several ranks) into the sum itself,
# rank 0's wait for the slowest rank and the skew (the largest wait of any rank); on the GPU the CPU's
# time to queue a batch (near the batch's, the step is bound by its launches).
SPLIT_PHASES = ("sum", "wait", "skew")
QUEUE = "queue"
QUANTILES = {"q1": 0.25, "q3": 0.75}  # phase_quantile's names and their quantiles


def device_seconds(kind: str, training: bool = False) -> str:
    """Ranks x seconds a run held its devices (kind gpu: GPU-seconds; cpu: core-seconds, a rank a
    core), from the set-up of its training to its end, in every run of its job (a resumed run's
    earlier ones up to its checkpoint); ``training``: the part its epochs took. The
    parent run holds the sweep's totals under the same names, and per nproc under ``..._nprocN``."""
    return f"resources/{kind}_{'training_' if training else ''}s"


# Tags.
TAG_CONFIG_HASH = "sweepscale.config_hash"
TAG_SWEEP_ID = "sweepscale.sweep_id"
TAG_ERROR = "sweepscale.error"
TAG_TIMING = "sweepscale.timing"
TAG_BLAS_THREADS = "sweepscale.blas_threads"  # a CPU run's: the BLAS threads of each of its ranks
TAG_PEAK_TFLOPS = "sweepscale.peak_tflops_per_device"  # the peak perf/utilization divides by
TAG_PEAK_ARITHMETIC = "sweepscale.peak_arithmetic"  # which arithmetic that peak is of
TAG_UTILIZATION_ERROR = "sweepscale.utilization_error"  # why no perf/utilization: it exceeded 1
TAG_GIT_COMMIT = "mlflow.source.git.commit"  # MLflow's own key: the UI shows it
TAG_PARENT = "mlflow.parentRunId"  # MLflow's own key: a point's run nests under its sweep's
TAG_GIT_DIRTY = "sweepscale.git_dirty"
TAG_VERSION = "sweepscale.version"
# MLflow 3's experiment kind: its UI opens an experiment of this kind on the runs table.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# On a sweep's parent run: it is one (with its launcher), how it was started, where its folder is.
TAG_SCHEDULER = "sweepscale.scheduler"
TAG_COMMAND = "sweepscale.command"
TAG_SWEEP_DIR = "sweepscale.sweep_dir"
TAG_RANKS_START = "sweepscale.ranks_start"  # how the points' ranks started: "auto: mpi4py loads ...: srun --mpi=pmi2"
TAG_SLURM_JOB = "sweepscale.slurm_job_id"  # the Slurm job that ran the point (a warm worker's: its allocation)
TAG_SLURM_ARRAY = "sweepscale.slurm_array"  # "ARRAYID_INDEX", the job array task
TAG_SWEEPER = "sweepscale.sweeper"  # "host pid" of the sweeper process: a later sweep closes one left RUNNING
# How a run's process started: warm (a worker that serves many points) or cold (its own process).
TAG_WARM = "sweepscale.warm"  # "true" | "false"
TAG_WORKER = "sweepscale.worker"
TAG_STOPPED = "sweepscale.stopped"  # a run the sweep stopped between epochs (a pruned trial): why
TAG_TRIAL = "sweepscale.trial"  # a search's child run: its Optuna trial number (sweeper/search/study.py)
TAG_SEARCH = "sweepscale.search"  # a search's parent run: its study, storage, objective, direction (JSON)
# Each rank's node and device: "0=node1/gpu0 (NVIDIA H100 80GB HBM3); 1=node1/gpu1 (...)", or ".../cpu".
TAG_RANK_DEVICES = "sweepscale.rank_devices"  # which worker served it (host:pid of its rank 0), warm runs only
# A run resumed from a checkpoint (trainer/record/checkpoint.py): the epoch it went on from; the job's restarts.
TAG_RESUMED_FROM_EPOCH = "sweepscale.resumed_from_epoch"
TAG_RESTARTS = "sweepscale.restarts"
# The CPU reference check (trainer/core/reference.py): the steps compared (check.steps resolved), and where
# it stands: "pending" while the run has ended and the reference computes, then "done", or "failed: why"
# or "abandoned: why" (the run's status stays what its training earned).
TAG_CHECK_STEPS = "sweepscale.check_steps"
TAG_CHECK = "sweepscale.check"
TAG_REFERENCE = "sweepscale.reference"  # computed, or cached
TAG_REFERENCE_KEY = "sweepscale.reference_key"
CHECK_PREFIX = "check/"  # the check's metrics: the weight errors
# Seconds from the process's start (cold) or the point's claim (warm) to its first batch.
TIME_TO_FIRST_BATCH = "time/to_first_batch_s"
# What else ran while the batches were timed (trainer/ranks/contention.py): how many other runs of the host,
# which ("name (GPUs)"), the seconds waited for the host, and perf.timing (shared | exclusive).
BESIDE = "timing/beside"
TAG_BESIDE = "sweepscale.beside"
TAG_ALONGSIDE = "sweepscale.alongside"  # GPU runs timed meanwhile on other GPUs of the host: not counted beside
HOST_WAIT_S = "timing/host_wait_s"
# The largest share of the timed batches' wall time any rank spent runnable but waiting for a core (Linux's
# schedstat run delay): other processes on its cores (the sweeper's own start-up, other workers) slowed it.
CORE_WAIT = "timing/core_wait"
TAG_TIMING_POLICY = "sweepscale.timing_policy"
TAG_GRAPHS = "sweepscale.graphs_captured"  # gpu.graph: the CUDA graphs the training replayed (one a phase and batch)
# A run the sweeper started at the sweep's end to time a point again alone (sweeper/track/retime.py): the
# id of the point's run, whose contended timings it stands for in the report (sweeper/report/study.py).
TAG_TIMED_AGAIN_FOR = "sweepscale.timed_again_for"
TAG_TIMED_AGAIN_BY = "sweepscale.timed_again_by"  # on the point's run, once that run FINISHED: its id
# What a run's timings are: recorded from its timed batches, taken over by such a run.
TIMING_TAGS = (
    TAG_BESIDE,
    TAG_ALONGSIDE,
    TAG_TIMING_POLICY,
    TAG_GRAPHS,
    TAG_PEAK_TFLOPS,
    TAG_PEAK_ARITHMETIC,
    TAG_UTILIZATION_ERROR,
)


# What every finished run records (its last value): what a search may take as its objective.
TIME_TO_TARGET = "time_to_target"  # a search's objective: the seconds a trial took to reach report.target
OBJECTIVES = (TEST_PRECISION, TRAIN_LOSS, TRAIN_LOSS_EPOCH, EPOCH_TIME, SAMPLES_PER_S, TFLOPS, "time/batch_ms")


def timing_metric(key: str) -> bool:
    """Whether ``key`` is one of a run's timing figures (its ms a batch, phases, interval, throughput,
    what ran beside), as opposed to what it trained (loss, precision) or held (resources)."""
    if key in (EPOCH_TIME, TIME_TO_FIRST_BATCH):  # wall times of its own epochs and start
        return False
    return key.startswith(("time/", "timing/", "perf/"))


def phase_time(phase: str) -> str:
    """Median milliseconds per batch spent in ``phase``."""
    return f"time/{phase}_ms"


def phase_quantile(phase: str, which: str) -> str:
    """Milliseconds per batch in ``phase`` at quartile ``which``: q1 (25th percentile) or q3 (75th)."""
    if which not in QUANTILES:
        raise ValueError(f"which={which!r}: expected one of {', '.join(QUANTILES)}")
    return f"time/{phase}_ms_{which}"


def weight_error(name: str) -> str:
    """Relative Frobenius error of parameter ``name`` (or 'max') against the CPU reference."""
    return f"{CHECK_PREFIX}weight_rel_error/{name}"
