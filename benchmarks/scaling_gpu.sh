#!/usr/bin/env bash
# Issue 46's measurements on a lent machine of 2 or 4 GPUs, in one device call: the GPU tests, the
# step's scaling with and without CUDA graphs (benchmarks/gpu_scaling.py), and the same sweeps twice
# on full MNIST, each in a fresh folder and store, to see whether their ms per batch and speedups
# repeat. Logs, reports and points.csv in $OUT/results.tgz; the table docs/benchmarks.md quotes:
# benchmarks/scaling_repeat.py over the points.csv files.
#   bash benchmarks/scaling_gpu.sh [STAGE ...]   stages: pytest step sweeps headline preset (default: all)
# Expects .whl/ (bash ../shared/device/fetch_wheels.sh) and .device/mnist/ (full MNIST).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/out}
RES=/tmp/results
mkdir -p "$OUT" "$RES"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="$ROOT:/tmp/site" PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HYDRA_FULL_ERROR=1 NCCL_NVLS_ENABLE=0
DATA=$ROOT/.device/mnist
GPUS=$(nvidia-smi -L | wc -l)
NPROCS=$(seq -s, 1 "$GPUS" | sed 's/,3//')  # 1,2 or 1,2,4

sweep() {  # sweep NAME ARGS...: one sweep in a fresh folder and store; its wall time and points.csv
  local name=$1; shift
  local d; d=$(mktemp -d /tmp/sweep-XXXX)
  local t0 t1 rc
  t0=$(date +%s%N)
  (cd "$d" && timeout 400 python3 -m sweeper -m "$@" "data.dir=$DATA") >"$RES/$name.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  local newest; newest=$(ls -td "$d"/multirun/*/* | head -1)
  cp "$newest/report/points.csv" "$RES/$name.points.csv" 2>/dev/null
  cp "$newest/report/summary.md" "$RES/$name.summary.md" 2>/dev/null
  mkdir -p "$RES/$name.fig" && cp "$newest/report/"*.png "$RES/$name.fig/" 2>/dev/null
  printf '%-28s rc=%s %7.2f s\n' "$name" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" | tee -a "$RES/times.txt"
}

python3 -c "
import os, cupy
from pathlib import Path
for d in range(cupy.cuda.runtime.getDeviceCount()):
    bus = cupy.cuda.runtime.deviceGetPCIBusId(d).lower()
    near = Path(f'/sys/bus/pci/devices/{bus}/local_cpulist')
    print(f'GPU {d} {bus}: near cores', near.read_text().strip() if near.exists() else 'not said', 'of', len(os.sched_getaffinity(0)))
" 2>&1 | tee "$RES/near.txt"
for s in ${@:-pytest step sweeps headline preset}; do
  case $s in
    pytest)
      timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} tests/test_gpu.py \
        >"$RES/pytest_gpu.txt" 2>&1
      grep -E "passed|failed|^E " "$RES/pytest_gpu.txt" | tail -40 ;;
    step)  # the step alone: eager against graphed, weak (3200 a GPU) and strong (12800), H=2048 and 512
      for H in ${STEP_H:-2048 512}; do
        timeout 300 python3 benchmarks/gpu_scaling.py --hidden $H --gpus ${NPROCS//,/ } --comms nccl nccl-graph \
          --cases "weak FP32 3xBF16" "strong FP32 3xBF16" 2>&1 | tee -a "$RES/step.txt"
      done ;;
    sweeps)  # the batch study twice: strong at 3200 and 12800, weak from 3200 a GPU
      for i in 1 2; do
        sweep batch_$i hidden=2048 batch_size=3200,6400,12800 nproc=$NPROCS epochs=20
      done ;;
    headline)  # the user's command twice (shared timing: runs on other GPUs alongside), then timed alone
      for i in 1 2; do sweep headline_$i hidden=512,1024,2048 nproc=$NPROCS; done
      [ "${EXCLUSIVE:-1}" = 1 ] && sweep headline_exclusive hidden=512,1024,2048 nproc=$NPROCS perf.timing=exclusive ;;
    preset)  # the course's one epoch: the timing pass times every nproc's batches
      sweep preset +experiment=scaling nproc=$NPROCS ;;
  esac
  tar czf "$OUT/results.tgz" -C "$RES" .
done
for pair in "batch_1 batch_2" "headline_1 headline_2" "headline_1 headline_exclusive"; do
  set -- $pair
  [ -f "$RES/$1.points.csv" ] && [ -f "$RES/$2.points.csv" ] || continue
  echo "== $1 against $2" | tee -a "$RES/repeat.txt"
  python3 benchmarks/scaling_repeat.py "$RES/$1.points.csv" "$RES/$2.points.csv" 2>&1 | tee -a "$RES/repeat.txt"
done
grep -h "scaling" "$RES"/*.summary.md > "$RES/findings.txt" 2>/dev/null
echo "== $(nvidia-smi -L | head -1) x $GPUS | $(nproc) cores | $(date -u +%F)" | tee -a "$RES/times.txt"
cat "$RES/times.txt"
tar czf "$OUT/results.tgz" -C "$RES" .
