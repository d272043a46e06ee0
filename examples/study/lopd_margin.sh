#!/usr/bin/env bash
# Delta (Eq. 12) and beta over the first LOPD steps on the study bed with a cold-started composer
# (docs/results/composer-ladder.md, "Round 4"): the same 8 steps (same seed, same rollouts) once
# with other tasks' experiences only and once allowed the task's own answer, on copies of the store.
# Usage: bash examples/study/lopd_margin.sh other --exclude-same-task
#        bash examples/study/lopd_margin.sh own --allow-same-task
# Environment: STORE (indexed train references), MODEL (warm-started student), COMPOSER (coldstart's final/), OUT.
set -euo pipefail
STORE=${STORE:-runs/bed2/store}
MODEL=${MODEL:-runs/bed2/sft0/final/student}
COMPOSER=${COMPOSER:-runs/ladder2/shipped/final}
OUT=${OUT:-runs/item3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
cond=$1 flag=$2
mkdir -p "$OUT"
[ -d "$OUT/store-$cond" ] || cp -r "$STORE" "$OUT/store-$cond"  # distill appends its rollouts to the store
lopd distill --method lopd --env lopd-bed --store "$OUT/store-$cond" --model "$MODEL" --composer "$COMPOSER" \
  --steps 8 --tasks-per-step 2 --group-size 4 --max-new-tokens 48 --lr 1e-4 --max-len 1024 --micro-batch 2 \
  --M 20 --margin 0.05 --lambda 0.2 --seed 0 "$flag" --out "$OUT/$cond" --resume
