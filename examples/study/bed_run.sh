#!/usr/bin/env bash
# The study of examples/study/bed_cpu.toml on lopd's study bed, from a fresh clone: the warm start
# (verified references of the bed's warmup split, `lopd sft`), the train split's verified
# references (the store every trained run copies: LOPD's experiences, the reference pool of
# SDFT/OPSD), its index, the cold-start composer on the warm-started backbone, then `lopd study`
# one run at a time. Each finished run's rows land in docs/results/bed-cpu/ (the study file's
# `results`), which is committed here after each run (COMMIT=0: not), so a study stopped on one
# machine continues on another from the repository. Every step skips what already exists: rerun
# this script to resume.
set -euo pipefail
BED=${BED:-runs/bed}
COMMIT=${COMMIT:-1}
here=$(cd "$(dirname "$0")" && pwd)
config="$here/bed_cpu.toml"
results=docs/results/bed-cpu
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
start=$(date +%s)
student="$BED/sft0/final/student"

# 1. the warm start: every run of the study starts from this student
if [ ! -d "$student" ]; then
  lopd collect --env lopd-bed --split warmup --reference --store "$BED/warm" --resume
  lopd sft --store "$BED/warm" --out "$BED/sft0" --steps 40 --resume
fi
# 2. verified references of every TRAIN task (held-out and transfer tasks are never collected)
if [ ! -f "$BED/store.collected" ]; then
  lopd collect --env lopd-bed --split train --reference --model "$student" --store "$BED/store" --resume
  touch "$BED/store.collected"
fi
if [ ! -f "$BED/store.indexed" ]; then
  lopd index --store "$BED/store"
  touch "$BED/store.indexed"
fi
# 3. the cold-start composer on the warm-started backbone (J and K as the study's LOPD runs)
if [ ! -d "$BED/composer0/final" ]; then
  lopd coldstart --experiences "$BED/store" --model "$student" --out "$BED/composer0" --steps 20 \
    --J 2 --K 8 --depth 2 --max-exp-tokens 192 --lr 1e-3 --no-activation-checkpointing \
    --checkpoint-every 10 --eval-every 20 --heldout-fraction 0.2 --resume
fi
# 4. the study, one run at a time; each finished run's rows are committed at once
runs=$(python3 -c 'import sys, tomllib; print(" ".join(r["name"] for r in tomllib.load(open(sys.argv[1], "rb"))["runs"]))' "$config")
for run in $runs; do
  lopd study --config "$config" --only "$run"
  if [ "$COMMIT" = 1 ] && [ -n "$(git status --porcelain -- "$results")" ]; then
    cp "$config" "$results/study.toml"
    mkdir -p "$results/report"  # `lopd report` of the trained runs: loss, gradient-norm, time, memory
    cp runs/study-bed-cpu/report/{*.png,summary.md} "$results/report/" 2>/dev/null || true
    git add -- "$results"
    git commit -m "bed study: results after run $run" -- "$results"
  fi
done
echo "study finished in $(( $(date +%s) - start )) s; results in $results"
