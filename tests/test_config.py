"""Config composition and Hydra's own errors for unknown or ill-typed keys; our range errors."""

from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException

from tests.conftest import compose
from trainer.config import validate
from trainer.core import model, reference
from trainer.data import pixel_levels
from trainer.errors import ConfigError
from trainer.gpu.policy import gemm_mode, overlap_wanted, window_wanted
from trainer.options import gemm_products
from trainer.override_checks import check_old_keys
from trainer.record.identity import config_hash
from trainer.run import schedule_of


def test_defaults_and_overrides():
    cfg = compose(["hidden=1024", "lr=0.05", "data.n_train=38400", "dtype=float64"])
    assert cfg.hidden == 1024 and cfg.lr == 0.05 and cfg.data.n_train == 38400
    assert cfg.batch_size == 3200 and cfg.reg == 1e-4 and cfg.nproc == 1
    assert cfg.dtype.value == "float64"


def test_unknown_key_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["hiden=3"])
    assert "Key 'hiden' not in 'TrainerConfig'" in str(e.value.__cause__)


def test_ill_typed_value_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["lr=abc"])
    assert "Value 'abc' of type 'str' could not be converted to Float" in str(e.value.__cause__)


def test_unknown_dtype_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["dtype=float16"])
    assert "Invalid value 'float16', expected one of [float32, float64]" in str(e.value.__cause__)


def test_unknown_gemm_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["gpu.gemm=bf16x9"])
    assert "Invalid value 'bf16x9', expected one of [bf16x3, tf32x3, sgemm, tf32]" in str(e.value.__cause__)


def test_gemm_mode_follows_dtype_and_gpu_gemm():
    assert gemm_mode(compose([])) == "bf16x3"
    assert gemm_mode(compose(["gpu.gemm=tf32x3"])) == "tf32x3"
    assert gemm_mode(compose(["gpu.gemm=sgemm"])) == "sgemm"
    assert gemm_mode(compose(["gpu.gemm=tf32"])) == "tf32"
    assert gemm_mode(compose(["gpu=tf32"])) == "tf32"  # the option file conf/gpu/tf32.yaml
    assert gemm_mode(compose(["dtype=float64"])) == "dgemm"


@pytest.mark.parametrize("key", ["overlap", "nccl_window"])
def test_true_is_rejected_with_the_choices(key):
    with pytest.raises(ConfigCompositionException) as e:
        compose([f"gpu.{key}=true"])
    assert "Invalid value 'True', expected one of [auto, always, never]" in str(e.value.__cause__)


@pytest.mark.parametrize(
    ("overrides", "step", "wanted"),
    [
        (["nproc=2", "gpu.gemm=sgemm", "hidden=2048"], "fused", True),  # auto: on where it paid
        (["nproc=2", "gpu.gemm=sgemm"], "fused", False),  # SGEMM at H=512: it lost
        (["nproc=2", "gpu.gemm=sgemm", "hidden=4096"], "fused", False),  # and at 4096
        (["nproc=2", "hidden=2048"], "fused", False),  # tensor cores (default bf16x3; tf32x3 lost at 1600 rows per GPU)
        (["nproc=2", "gpu.gemm=tf32", "hidden=2048"], "fused", False),  # TF32: it lost
        (["nproc=2", "dtype=float64", "hidden=2048"], "fused", False),  # DGEMM: not measured, off
        (["nproc=2", "gpu.overlap=always"], "fused", True),
        (["nproc=2", "gpu.gemm=sgemm", "gpu.overlap=never"], "fused", False),
        (["nproc=1", "gpu.overlap=always"], "fused", False),  # nothing to sum
        (["nproc=2", "gpu.overlap=always"], "generic", False),  # the fused step's feature
    ],
)
def test_overlap_wanted(overrides, step, wanted):
    cfg = compose(overrides)
    assert overlap_wanted(cfg.gpu.overlap.value, step, cfg.nproc, gemm_mode(cfg), cfg.hidden) is wanted


@pytest.mark.parametrize(
    ("nccl_window", "beside_gemm", "wanted"),
    [
        ("auto", False, True),  # sums after the backward pass or beside tensor-core work: it paid
        ("auto", True, False),  # sums beside SGEMMs: it lost
        ("always", True, True),
        ("never", False, False),
    ],
)
def test_window_wanted(nccl_window, beside_gemm, wanted):
    assert compose([f"gpu.nccl_window={nccl_window}"]).gpu.nccl_window.value == nccl_window
    assert window_wanted(nccl_window, beside_gemm) is wanted


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("hidden=0", "hidden=0: the hidden layer needs at least 1 unit"),
        ("nproc=0", "nproc=0: at least one MPI rank is needed"),
        ("lr=0", "lr=0.0: the learning rate must be a positive finite number"),
        ("lr=-1", "lr=-1.0: the learning rate must be a positive finite number"),
        ("lr=nan", "lr=nan: the learning rate must be a positive finite number"),
        ("epochs=0", "epochs=0: train for at least one epoch"),
        ("reg=inf", "reg=inf: the L2 coefficient must be a finite number, 0 or more"),
        ("reg=-1", "reg=-1.0: the L2 coefficient must be a finite number, 0 or more"),
        ("data.n_train=0", "data.n_train=0: take at least one sample"),
        ("seed=-1", "seed=-1: NumPy takes seeds from 0 to 2**32 - 1"),
        ("hidden=1000000000", "hidden=1000000000: the weights and their copies would take 11846.4 GiB, more than"),
    ],
)
def test_range_errors_name_the_key(override: str, message: str):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(compose([override]))


def test_config_hash_ignores_how_a_diverged_run_ends():
    assert config_hash(compose(["check.divergence=go_on"])) == config_hash(compose([]))


def test_batch_smaller_than_nproc():
    with pytest.raises(ConfigError, match=r"batch_size=3 is smaller than nproc=4: .* raise batch_size or lower nproc"):
        validate(compose(["batch_size=3", "nproc=4"]))


def test_config_hash_ignores_where_it_is_recorded():
    base = config_hash(compose([]))
    assert config_hash(compose(["mlflow.run_name=x", "mlflow.experiment=y"])) == base
    assert config_hash(compose(["nproc=2"])) != base


def test_tf32_needs_float32():
    with pytest.raises(ConfigError, match=r"gpu.gemm=tf32 needs dtype=float32"):
        validate(compose(["gpu.gemm=tf32", "dtype=float64"]))


@pytest.mark.parametrize(
    ("overrides", "x_levels", "products"),
    [
        ([], 255, 3),  # the default bf16x3 on the trainer's pixels: three BF16 products, X exact in BF16
        (["gpu.gemm=tf32x3"], 255, 2),  # two TF32 products: X exact in TF32
        (["gpu.gemm=tf32x3"], None, 3),  # inputs with no promise: X split too
        (["gpu.gemm=tf32x3"], 4096, 3),  # levels past TF32's 11 bits are not exact
        (["gpu.gemm=sgemm"], 255, 1),
        (["gpu.gemm=bf16x3"], 255, 3),  # three BF16 products, X exact in BF16
        (["gpu.gemm=tf32"], 255, 1),
        (["dtype=float64"], 255, 1),
    ],
)
def test_gemm_products(overrides, x_levels, products):
    cfg = compose(overrides)
    assert gemm_products(gemm_mode(cfg), cfg.dtype.value, x_levels) == products


def test_conventions_default_to_the_courses():
    cfg = compose([])
    assert cfg.model.init.value == "course" and cfg.data.scale.value == "byte"
    assert (cfg.hidden, cfg.batch_size, cfg.lr, cfg.reg) == (512, 3200, 0.1, 1e-4)
    cfg = compose(["model.init=fan_in", "data.scale=unit"])
    assert cfg.model.init.value == "fan_in" and cfg.data.scale.value == "unit"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.init=xavier", "Invalid value 'xavier', expected one of [fan_in, course]\n    full_key: model.init"),
        ("data.scale=minmax", "Invalid value 'minmax', expected one of [unit, byte]\n    full_key: data.scale"),
        ("model.inti=course", "Key 'inti' not in 'ModelConfig'\n    full_key: model.inti"),
    ],
)
def test_unknown_convention_is_rejected_by_hydra_naming_the_key(override: str, message: str):
    with pytest.raises(ConfigCompositionException) as e:
        compose([override])
    assert message in str(e.value.__cause__)


def test_conventions_change_the_config_hash_and_the_reference_key():
    """A resumed sweep must not take a fan_in run for a course one, nor the CPU reference of one for
    the other's: model.init and data.scale are in the config hash and in the reference cache key."""
    conventions = [[], ["model.init=fan_in"], ["data.scale=unit"], ["model.init=fan_in", "data.scale=unit"]]
    hashes = {config_hash(compose(c)) for c in conventions}
    assert len(hashes) == len(conventions)
    assert config_hash(compose(["model.init=course", "data.scale=byte"])) == config_hash(compose([]))

    layout, schedule = model.Layout(D=784, H=512), schedule_of(compose([]))

    def key(init: str, scale: str, steps: int = 10) -> str:
        return reference.cache_key(layout, schedule, "float32", 0, "fingerprint", init=init, scale=scale, steps=steps)

    keys = {key(i, s) for i in ("fan_in", "course") for s in ("unit", "byte")}
    assert len(keys) == 4 and key("course", "byte") == key("course", "byte")
    assert key("course", "byte", 11) != key("course", "byte")  # the steps compared are part of the key


# Recorded from this version (2026-11-25): resume skips the points a sweep of this version finished.
DEFAULT_HASH = "c9ce672806fd"
MNIST_1024_HASH = "38ad93ddab29"  # hidden=1024 data.dir=/data/mnist


def test_the_config_hash_is_the_recorded_one():
    assert config_hash(compose([])) == DEFAULT_HASH
    assert config_hash(compose(["hidden=1024", "data.dir=/data/mnist"])) == MNIST_1024_HASH


@pytest.mark.parametrize(
    "override",
    [
        "gpu.profile=true",  # NVTX ranges
        "save.weights=true",  # artifacts
        "check.divergence=go_on",  # how a diverged run ends
        "check.cache_dir=/elsewhere",
        "save.checkpoint_dir=/elsewhere",
        "mlflow.experiment=other",
        "mpi.mpiexec=/usr/bin/mpiexec",
        "paths.mnist=/elsewhere",
        "perf.repeats=5",  # the timing protocol's: how the timed batches are cut, never the weights
        "perf.warmup=5",
        "perf.min_batches=50",
        "perf.min_seconds=1",
        "gpu.graph=never",  # the same kernels, launched one by one
    ],
)
def test_a_key_that_does_not_change_results_keeps_the_hash(override):
    assert config_hash(compose([override])) == DEFAULT_HASH


def test_a_key_added_to_the_config_keeps_every_hash():
    """A key a later version adds (here: added to this version's config, as plain data) is not in the identity."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(OmegaConf.to_container(compose([]), resolve=True, enum_to_str=True))
    cfg.check.report_every = 5
    cfg.newgroup = {"knob": 1}
    assert config_hash(cfg) == DEFAULT_HASH


@pytest.mark.parametrize(
    "override",
    ["hidden=1024", "lr=0.2", "epochs=3", "nproc=2", "dtype=float64", "model.init=fan_in", "data.scale=unit",
     "data.n_train=100", "gpu.gemm=sgemm", "check.steps=all", "check.reference=false", "seed=1"],
)  # fmt: skip
def test_a_key_that_changes_results_changes_the_hash(override):
    assert config_hash(compose([override])) != DEFAULT_HASH


@pytest.mark.parametrize("value", ["0", "-3", "abc", "false", "1.5"])
def test_check_steps_takes_a_count_or_all(value):
    said = re.compile(re.escape(f"check.steps={value}: compare the weights after"), re.IGNORECASE)  # False, as parsed
    with pytest.raises(ConfigError, match=said):
        validate(compose([f"check.steps={value}"]))
    validate(compose(["check.steps=all"]))
    validate(compose(["check.steps=3"]))


@pytest.mark.parametrize(
    ("overrides", "products"),
    [
        (["data.scale=byte"], 3),  # bf16x3 on the bytes themselves (x_levels 1): k exact in BF16
        (["data.scale=byte", "gpu.gemm=tf32x3"], 2),  # two TF32 products, as on k / 255
        (["data.scale=unit", "gpu.gemm=tf32x3"], 2),
        (["data.scale=byte", "gpu.gemm=sgemm"], 1),
    ],
)
def test_both_scales_keep_the_fused_steps_exact_pixels(overrides, products):
    """The fused step reads X as its integer levels k = rint(x x_levels) and scales its GEMMs by
    1/x_levels (trainer/gpu/fused_step.py): with data.scale=byte x_levels is 1, k the byte itself."""
    cfg = compose(overrides)
    assert gemm_products(gemm_mode(cfg), cfg.dtype.value, pixel_levels(cfg.data.scale.value)) == products


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tf32=true", "tf32 is now gpu.gemm=tf32"),
        ("tf32=false", "tf32 is now gpu.gemm: tf32=false is gpu.gemm=bf16x3 (the default), tf32x3 or sgemm"),
        ("fp32_gemm=sgemm", "fp32_gemm is now gpu.gemm=sgemm"),
        ("step=fused", "step is now gpu.step=fused"),
        ("comm=nccl", "comm is now gpu.comm=nccl"),
        ("overlap=always", "overlap is now gpu.overlap=always"),
        ("nccl_window=never", "nccl_window is now gpu.nccl_window=never"),
        ("profile=true", "profile is now gpu.profile=true"),
        ("+fp32_gemm=tf32x3", "fp32_gemm is now gpu.gemm=tf32x3"),
        ("fp32_gemm=sgemm,tf32x3", "fp32_gemm is now gpu.gemm=sgemm,tf32x3"),  # a sweep's values
    ],
)
def test_old_spellings_name_the_new_key(override: str, message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_old_keys(["hidden=64", override])


def test_new_spellings_pass_the_old_keys_check():
    check_old_keys(["-m", "hidden=64", "gpu.gemm=tf32", "gpu=tf32", "gpu.step=fused", "data.dir=x", "perf.repeats=2"])


def test_old_spelling_fails_before_anything_starts(tmp_path):
    """python -m trainer refuses a moved key with exit status 2 and the new key, before Hydra composes."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run(
        [sys.executable, "-m", "trainer", "tf32=true"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "Error: tf32 is now gpu.gemm=tf32" in result.stderr


def test_gpu_group_option_file_and_key_compose():
    assert compose(["gpu=tf32"]).gpu.gemm.value == "tf32"
    assert compose(["gpu.gemm=tf32"]).gpu.gemm.value == "tf32"
    cfg = compose(["gpu=tf32", "gpu.overlap=never"])  # the option file's other keys keep their defaults
    assert cfg.gpu.gemm.value == "tf32" and cfg.gpu.overlap.value == "never" and cfg.gpu.step.value == "auto"


def test_paths_default_and_environment(monkeypatch):
    monkeypatch.delenv("SWEEPSCALE_MNIST", raising=False)
    assert compose([]).paths.mnist == "../shared/data/mnist"
    monkeypatch.setenv("SWEEPSCALE_MNIST", "/data/mnist")
    assert compose([]).paths.mnist == "/data/mnist"


def test_paths_are_not_hashed(monkeypatch):
    monkeypatch.delenv("SWEEPSCALE_MNIST", raising=False)
    base = config_hash(compose([]))
    assert config_hash(compose(["paths.mnist=/elsewhere"])) == base


@pytest.mark.parametrize("preset", ["batch_study", "hidden_study", "lr_study", "scaling"])
def test_presets_read_the_data_from_paths(preset, monkeypatch):
    monkeypatch.delenv("SWEEPSCALE_MNIST", raising=False)
    assert compose([f"+experiment={preset}"]).data.dir == "../shared/data/mnist"
    monkeypatch.setenv("SWEEPSCALE_MNIST", "/data/mnist")
    assert compose([f"+experiment={preset}"]).data.dir == "/data/mnist"
    assert compose([f"+experiment={preset}", "paths.mnist=/mine"]).data.dir == "/mine"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["+hiden=16"], "hiden is not a trainer key: it would change nothing; did you mean hidden?"),
        (["+gpu.fast=1"], "gpu.fast is not a trainer key: it would change nothing; did you mean gpu.step?"),
    ],
)
def test_a_key_that_would_change_nothing_is_refused(args, message, tmp_path):
    """`+key=value` with a key the schema lacks, or a key given twice (#33): refused before any rank."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and f"Error: {message}" in result.stderr, result.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_free_keys_under_a_dict_are_accepted():
    cfg = compose(["+mlflow.tags.team=a"])
    validate(cfg)
    assert cfg.mlflow.tags.team == "a"


@pytest.mark.mpi
def test_a_key_given_twice_to_the_trainer_is_said(tmp_path, mlflow_uri):
    """A single run keeps Hydra's rule (the last wins) and says so in a line (#33); a sweep refuses.
    Once, on two ranks too: the ranks type the config their launcher composed (trainer/lifecycle/launch.py),
    they do not read the overrides again (each said the note, and composed them: 0.6 CPU-s a rank)."""
    import subprocess
    import sys

    from trainer.record import store

    args = ["hidden=16", "hidden=8", "epochs=1", "data.n_train=100", "data.n_test=10", "device=cpu", "nproc=2"]
    result = subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    note = "note: hidden is given twice (hidden=16, hidden=8): the last, hidden=8, is used"
    assert result.stderr.count(note) == 1, result.stderr
    client = store.client(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweepscale").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["hidden"] == "8"
    assert run.data.params["nproc"] == "2"


def test_a_points_typed_config_from_the_last_points_equals_one_typed_afresh():
    """trainer_config merges only what changed into the last point's typed config (#47: a 600-point
    dry run); a group that changed starts again from the schema, so a key dropped is dropped."""
    from omegaconf import OmegaConf

    from sweeper.plan import shapes
    from tests.test_sweeper import compose_sweep

    points = [["hidden=16"], ["hidden=32", "gpu.gemm=tf32"], ["+mlflow.tags={a: b}"], ["hidden=8"], ["data.dir=/x"]]
    points += [["lr=0.5", "nproc=2", "data.n_train=100"], ["hidden=9"]]
    for overrides in points:
        cfg = compose_sweep(overrides)
        from_last = OmegaConf.to_yaml(shapes.trainer_config(cfg))
        shapes._last = None
        assert from_last == OmegaConf.to_yaml(shapes.trainer_config(cfg)), overrides
    with pytest.raises(ConfigError, match="hiden"):
        shapes.trainer_config(compose_sweep(["+hiden=16"]))
