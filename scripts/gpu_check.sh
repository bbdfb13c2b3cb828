#!/usr/bin/env bash
# The GPU acceptance run of the trainer on a lent GPU machine, in one call:
#   GPU tests, then the CPU-vs-GPU weight errors on full MNIST in float32 and float64.
# Expects: Python packages missing there as wheels in .whl/, full MNIST in .device/mnist/,
# and $OUT (where results are written). See docs/benchmarks.md for the call.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MLFLOW_TRACKING_URI="sqlite:////tmp/gpu-check.db" SWEEPSCALE_CACHE=/tmp/sweepscale-cache
nvidia-smi -L
python3 -c "import cupy, mpi4py; from mpi4py import MPI; print('cupy', cupy.__version__, '|', MPI.Get_library_version().splitlines()[0])"
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.txt" || true
DATA=${DATA:-.device/mnist}
# The course's check settings (H=512, B=3200, N=38400, 1 epoch, lr=1e-4), then a larger learning rate.
for dtype in float32 float64; do
  for lr_epochs in "1e-4 1" "0.1 5"; do
    set -- $lr_epochs
    python3 -m trainer device=gpu dtype=$dtype lr=$1 epochs=$2 data.dir=$DATA data.n_train=38400 \
      mlflow.experiment=gpu-check "mlflow.run_name='$dtype lr=$1 epochs=$2 nproc=1'" | tail -n 12
  done
done
# The same check with the float32 GEMMs on the CUDA cores (SGEMM) instead of tensor-core products.
python3 -m trainer device=gpu dtype=float32 gpu.gemm=sgemm lr=1e-4 epochs=1 data.dir=$DATA data.n_train=38400 \
  mlflow.experiment=gpu-check "mlflow.run_name='float32 sgemm lr=1e-4 epochs=1 nproc=1'" | tail -n 12
python3 -m trainer device=gpu nproc=2 dtype=float32 lr=1e-4 epochs=1 data.dir=$DATA data.n_train=38400 \
  mlflow.experiment=gpu-check "mlflow.run_name='float32 lr=1e-4 epochs=1 nproc=2'" | tail -n 12
# Two ranks with SGEMM, the NCCL all-reduce overlapped with the step (gpu.overlap=auto would not at H=512).
python3 -m trainer device=gpu nproc=2 dtype=float32 gpu.gemm=sgemm gpu.overlap=always lr=1e-4 epochs=1 data.dir=$DATA data.n_train=38400 \
  mlflow.experiment=gpu-check "mlflow.run_name='float32 sgemm lr=1e-4 epochs=1 nproc=2 overlap'" | tail -n 12
python3 - <<'PY' | tee "$OUT/weight_errors.txt"
from mlflow.tracking import MlflowClient
c = MlflowClient()
exp = c.get_experiment_by_name("gpu-check")
print(f"{'run':42s} {'gemm/products':13s} {'max rel err':>12s} {'precision':>9s} {'batch ms':>9s} {'TFLOP/s':>8s}")
for r in sorted(c.search_runs([exp.experiment_id]), key=lambda r: r.info.start_time):
    m, t = r.data.metrics, r.data.tags
    gemm = f"{t.get('sweepscale.gemm', '-')}/{t.get('sweepscale.gemm_products', '-')}"
    print(f"{r.info.run_name:42s} {gemm:13s} {m['check/weight_rel_error/max']:12.3e} {m['test/precision']:9.4f} "
          f"{m['time/batch_ms']:9.3f} {m['perf/tflops']:8.2f}  {r.data.tags['sweepscale.device_name']}")
PY
