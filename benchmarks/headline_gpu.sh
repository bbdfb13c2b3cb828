#!/usr/bin/env bash
# The user's headline on a lent GPU machine, in one device call: the sweep as typed but for
# nproc=1 (one GPU), on full MNIST, each command in a fresh folder with a fresh store and a fresh
# reference cache, through the local launcher and through Slurm (scripts/slurm_gpu_node.sh), and
# the code before this change beside it (.device/before, for the paired figures). Prints a table;
# logs and each sweep's timeline.json in $OUT/results.tgz. docs/benchmarks.md has the call and the figures.
#   bash benchmarks/headline_gpu.sh [STAGE ...]   stages: warmup probe after newcache before again shapes nocheck slurm shard pytest step search slurm_search (default: after slurm)
# Expects .whl/ (bash ../shared/device/fetch_wheels.sh), .device/mnist/ (full MNIST),
# .device/debs/ (bash scripts/slurm_gpu_node.sh --fetch .device/debs), .device/before/ (git archive).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/out}
RES=/tmp/results  # packed into $OUT/results.tgz at the end (the device tool brings back few files)
mkdir -p "$OUT" "$RES"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m compileall -q -j 0 /tmp/site "$ROOT/sweeper" "$ROOT/trainer" "$ROOT/hydra_plugins" "$ROOT/.device/before" \
  >/dev/null  # as pip and a first run leave them: a user's imports read bytecode, not source
unset PYTHONDONTWRITEBYTECODE
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HYDRA_FULL_ERROR=1
DATA=$ROOT/.device/mnist
GRID=(hidden=512,1024,2048 nproc=1 "data.dir=$DATA")

run() {  # run NAME CODE_DIR ARGS...: one sweep in a fresh folder, store and reference cache; its wall time
  local name=$1 code=$2; shift 2
  local d; d=${SWEEP_DIR:-$(mktemp -d /tmp/sweep-XXXX)}
  local t0 t1 rc
  t0=$(date +%s%N)
  (cd "$d" && PYTHONPATH="$code:/tmp/site" SWEEPSCALE_CACHE="$d/cache" timeout "${SWEEP_TIMEOUT_S:-300}" python3 -m sweeper -m "$@") >"$RES/$name.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  local newest; newest=$(ls -td "$d"/multirun/*/* | head -1)
  cp "$newest/timeline.json" "$RES/$name.timeline.json" 2>/dev/null
  cat "$newest"/.submitit/*/*_log.err >"$RES/$name.workers.err" 2>/dev/null
  cp "$newest/report/search.png" "$RES/$name.search.png" 2>/dev/null
  if [ "$code" = "$ROOT" ]; then
    PYTHONPATH="$ROOT:/tmp/site" python3 benchmarks/sweep_timeline.py "$newest" "sqlite:///$d/mlflow.db" \
      >"$RES/$name.timeline.txt" 2>&1
  fi
  local precision
  precision=$(grep -aoE '│ hidden=[0-9]+[^│]*│ [A-Z]+ +│ [0-9.]+ +│ [0-9.]+' "$RES/$name.log" | awk -F'│' '{gsub(/ /,"",$5); printf "%s ", $5}')
  printf '%-30s rc=%s %7.2f s  precision %s\n' "$name" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" "$precision" \
    | tee -a "$RES/times.txt"
}

for stage in "${@:-after slurm}"; do
  for s in $stage; do
    case $s in
      warmup)  # CuPy's kernel cache filled, as any earlier run on the machine leaves it (not counted)
        run warmup "$ROOT" hidden=512 nproc=1 epochs=1 "data.dir=$DATA" check.reference=false ;;
      after)
        run after_local_epochs50 "$ROOT" "${GRID[@]}"
        run after_local_epochs3 "$ROOT" "${GRID[@]}" epochs=3
        run after_local_epochs3_check_all "$ROOT" "${GRID[@]}" epochs=3 check.steps=all ;;
      shapes)  # two GPUs or more: the headline's nproc=1,2, before and after in turn (3 epochs thrice, 50 once)
        for i in 1 2 3; do
          run before_shapes_epochs3_$i "$ROOT/.device/before" "${GRID[@]/nproc=1/nproc=1,2}" epochs=3
          run after_shapes_epochs3_$i "$ROOT" "${GRID[@]/nproc=1/nproc=1,2}" epochs=3
        done
        run before_shapes_epochs50 "$ROOT/.device/before" "${GRID[@]/nproc=1/nproc=1,2}"
        run after_shapes_epochs50 "$ROOT" "${GRID[@]/nproc=1/nproc=1,2}" ;;
      nocheck)  # the same sweeps without the CPU check: what the check costs the sweep
        run nocheck_local_epochs50 "$ROOT" "${GRID[@]}" check.reference=false
        run nocheck_local_epochs3 "$ROOT" "${GRID[@]}" epochs=3 check.reference=false ;;
      again)  # the same sweep twice in one folder: the second finds the store made and the references cached
        export SWEEP_DIR; SWEEP_DIR=$(mktemp -d /tmp/sweep-XXXX)
        run again_first_epochs3 "$ROOT" "${GRID[@]}" epochs=3
        run again_second_epochs3 "$ROOT" "${GRID[@]}" epochs=3 --force
        unset SWEEP_DIR ;;
      newcache)  # no template of MLflow's empty store in the user's cache yet: the first new store pays the migrations
        XDG_CACHE_HOME=$(mktemp -d) run newcache_local_epochs3 "$ROOT" "${GRID[@]}" epochs=3 ;;
      before)
        run before_local_epochs50 "$ROOT/.device/before" "${GRID[@]}"
        run before_local_epochs3 "$ROOT/.device/before" "${GRID[@]}" epochs=3
        run before_local_epochs3_check_all "$ROOT/.device/before" "${GRID[@]}" epochs=3 check.steps=all ;;
      slurm)
        bash scripts/slurm_gpu_node.sh .device/debs >"$RES/slurm_up.log" 2>&1 || { tail -20 "$RES/slurm_up.log"; continue; }
        PYTHONPATH="$ROOT:/tmp/site" python3 -c "
from sweeper.runners import bootstrap as b
print('mpi4py:', b.mpi_library()); print('srun --mpi=list, loadable:', b.srun_plugins('gpu'))
print('mpiexecs:', b.mpiexecs(None)); print('auto:', b.detect('auto', None, 'gpu').why)" | tee "$RES/bootstrap.txt"
        run slurm_epochs50 "$ROOT" "${GRID[@]}" launcher=slurm launcher.partition=gpu launcher.timeout_min=10
        run slurm_epochs3 "$ROOT" "${GRID[@]}" epochs=3 launcher=slurm launcher.partition=gpu launcher.timeout_min=10
        run slurm_epochs3_mpiexec "$ROOT" "${GRID[@]}" epochs=3 launcher=slurm launcher.partition=gpu \
          launcher.timeout_min=10 launcher.pmi=mpiexec ;;
      shard)  # nproc=2 on one GPU: two ranks share it through Slurm's shards, summing through host MPI
        SLURM_GPU_SHARDS=2 bash scripts/slurm_gpu_node.sh .device/debs >"$RES/slurm_shard_up.log" 2>&1 \
          || { tail -20 "$RES/slurm_shard_up.log"; continue; }
        run slurm_nproc2_shards "$ROOT" hidden=512 nproc=2 epochs=3 "data.dir=$DATA" launcher=slurm \
          launcher.partition=gpu launcher.timeout_min=10 launcher.gpus_per_node=0 launcher.ranks_per_node=2 \
          "+launcher.sbatch_args={gres: 'shard:2'}" ;;
      probe)  # what a process pays before it does anything: the interpreter, MLflow's imports
        { env | grep -E '^PYTHON' ; for m in "import numpy" "import mlflow.tracking" "import cupy"; do
            t0=$(date +%s%N); PYTHONPATH="$ROOT:/tmp/site" python3 -c "$m"; t1=$(date +%s%N)
            echo "$m: $(( (t1 - t0) / 1000000 )) ms"; done; } 2>&1 | tee "$RES/probe.txt" ;;
      step)  # the fused step (bf16x3, B=3200) through each tree's own code, in turn, twice: a restructure must not move it
        for round in 1 2; do for code in "$ROOT/.device/before" "$ROOT"; do
          (cd "$code" && PYTHONPATH="$code:/tmp/site" python3 -c '
import sys; sys.path.insert(0, "benchmarks")
import cupy as cp
from gpu_common import PIXEL_LEVELS, inputs, our_step, time_ms
xh, yh = inputs(3200); x, y = cp.asarray(xh), cp.asarray(yh)
ms = {H: time_ms(our_step("fused", H, x, y, gemm="bf16x3", x_levels=PIXEL_LEVELS)) for H in (512, 1024, 2048)}
print(sys.argv[1], " ".join(f"H={H} {t:.4f} ms" for H, t in ms.items()))' "round $round $([ "$code" = "$ROOT" ] && echo after || echo before)")
        done; done 2>&1 | tee -a "$RES/step.txt" ;;
      search)  # hydra/sweeper=search on the GPU: a trial asked each time the worker frees (sweeper/search/study.py)
        run search_precision "$ROOT" hydra/sweeper=search "hidden=choice(512,1024,2048)" \
          "lr=tag(log,interval(0.02,0.5))" epochs=3 "data.dir=$DATA" hydra.sweeper.n_trials=12
        run search_time_to_target "$ROOT" hydra/sweeper=search "hidden=choice(512,1024,2048)" \
          "lr=tag(log,interval(0.02,0.5))" epochs=20 "data.dir=$DATA" hydra.sweeper.n_trials=12 \
          hydra.sweeper.objective=time_to_target report.target=0.95
        grep -h "^study" "$RES"/search_*.log | tee -a "$RES/times.txt" ;;
      slurm_search)  # the search's first sweep locally, then through Slurm on this node (one allocation at a time: one GPU)
        sinfo -h >/dev/null 2>&1 || bash scripts/slurm_gpu_node.sh .device/debs >"$RES/slurm_up.log" 2>&1 \
          || { tail -20 "$RES/slurm_up.log"; continue; }
        SEARCH=(hydra/sweeper=search "hidden=choice(512,1024,2048)" "lr=tag(log,interval(0.02,0.5))" epochs=3
          "data.dir=$DATA" hydra.sweeper.n_trials=12)
        run search_local "$ROOT" "${SEARCH[@]}"
        run search_slurm "$ROOT" "${SEARCH[@]}" launcher=slurm launcher.partition=gpu launcher.timeout_min=10 \
          launcher.array_parallelism=1
        grep -h "^study\|slurm job" "$RES"/search_local.log "$RES"/search_slurm.log | tee -a "$RES/times.txt" ;;
      pytest)
        PYTHONPATH="$ROOT:/tmp/site" python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -40 \
          | tee "$RES/pytest_gpu.txt" ;;
    esac
    tar czf "$OUT/results.tgz" -C "$RES" .  # after each stage: what ran comes back even if a later one runs out of time
  done
done
echo "== $(nvidia-smi -L | head -1) | $(nproc) cores | $(date -u +%F)" | tee -a "$RES/times.txt"
cat "$RES/times.txt"
tar czf "$OUT/results.tgz" -C "$RES" .
cp "$RES/times.txt" "$OUT/times.txt"
