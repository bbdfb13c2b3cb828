#!/usr/bin/env bash
# The README's report figures (docs/figures/), regenerated from real sweeps on this machine:
# the course's learning-rate study, its scaling study (nproc up to what the machine holds) and the
# batch-size study, each ending with its report; the figures are copied from the reports.
#   bash scripts/report_figures.sh            # full MNIST from ../shared/data/mnist (DATA=... elsewhere)
# Runs on the CPU in about 15 minutes on 2 cores; on a GPU machine the same command draws GPU figures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/mnist}
NPROC=${NPROC:-1,2}
WORK=$(mktemp -d)
OUT=docs/figures
mkdir -p "$OUT"
export MLFLOW_TRACKING_URI="sqlite:///$WORK/mlflow.db" SWEEPSCALE_CACHE="$WORK/cache"

report_of_latest() {  # the newest sweep's report folder
  "$PY" -m sweeper.report latest --out "$WORK/$1" --no-attach >/dev/null
  echo "$WORK/$1"
}

"$PY" -m sweeper -m +experiment=lr_study data.dir="$DATA" hydra.sweep.dir="$WORK/lr"
dir=$(report_of_latest lr)
cp "$dir/convergence.png" "$OUT/lr_study_convergence.png"
cp "$dir/finals.png" "$OUT/lr_study_finals.png"
cp "$dir/weight_error.png" "$OUT/lr_study_weight_error.png"

"$PY" -m sweeper -m +experiment=scaling data.dir="$DATA" nproc="$NPROC" hydra.sweep.dir="$WORK/scaling"
dir=$(report_of_latest scaling)
cp "$dir/scaling_weak.png" "$OUT/scaling_weak.png"
cp "$dir/phases.png" "$OUT/scaling_phases.png"
cp "$dir/roofline.png" "$OUT/scaling_roofline.png"

"$PY" -m sweeper -m +experiment=batch_study data.dir="$DATA" nproc="$NPROC" hydra.sweep.dir="$WORK/batch"
dir=$(report_of_latest batch)
cp "$dir/regimes.png" "$OUT/batch_study_regimes.png"
cp "$dir/scaling_strong.png" "$OUT/batch_study_strong.png"

echo "figures in $OUT (runs and full reports in $WORK)"
