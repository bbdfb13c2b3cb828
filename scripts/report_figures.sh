#!/usr/bin/env bash
# The README's report figures (docs/figures/), regenerated from real sweeps: the course's
# learning-rate study, its scaling study (nproc up to what the machine holds) and the batch-size
# study, each ending with its report; the figures are copied from the reports.
#   bash scripts/report_figures.sh                          # full MNIST from ../shared/data/mnist
#   PY=python3 DATA=.device/mnist NPROC=1,2 bash scripts/report_figures.sh   # on a 2-GPU machine
# The scaling and batch studies skip the CPU reference check (their figures do not use it); every
# point's interval comes from the timing protocol's 3 repeats (perf.repeats, docs/reference.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data/mnist}
NPROC=${NPROC:-1,2}
WORK=${WORK:-$(mktemp -d)}
FIG_DIR=${FIG_DIR:-docs/figures}
mkdir -p "$FIG_DIR" "$WORK"
export MLFLOW_TRACKING_URI="sqlite:///$WORK/mlflow.db" SWEEPSCALE_CACHE="$WORK/cache"

study() {  # study NAME OVERRIDES...: one sweep, its report rebuilt into $WORK/NAME
  local name=$1; shift
  "$PY" -m sweeper -m "$@" data.dir="$DATA" hydra.sweep.dir="$WORK/sweeps/$name" | tail -n 4
  "$PY" -m sweeper.report latest --out "$WORK/$name" --no-attach
}

study lr +experiment=lr_study
cp "$WORK/lr/convergence.png" "$FIG_DIR/lr_study_convergence.png"
cp "$WORK/lr/finals.png" "$FIG_DIR/lr_study_finals.png"
cp "$WORK/lr/weight_error.png" "$FIG_DIR/lr_study_weight_error.png"

study scaling +experiment=scaling nproc="$NPROC" check.reference=false
cp "$WORK/scaling/scaling_weak.png" "$FIG_DIR/scaling_weak.png"
cp "$WORK/scaling/phases.png" "$FIG_DIR/scaling_phases.png"
cp "$WORK/scaling/roofline.png" "$FIG_DIR/scaling_roofline.png"

study batch +experiment=batch_study nproc="$NPROC" check.reference=false
cp "$WORK/batch/regimes.png" "$FIG_DIR/batch_study_regimes.png"
cp "$WORK/batch/scaling_strong.png" "$FIG_DIR/batch_study_strong.png"

echo "figures in $FIG_DIR; runs and full reports in $WORK"
