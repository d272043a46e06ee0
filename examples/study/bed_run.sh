#!/usr/bin/env bash
# The study of examples/study/bed_cpu.toml on lopd's study bed, from a fresh clone: the warm start
# (verified references of the bed's warmup split, `lopd sft`), the train split's verified
# references (the store every trained run copies: LOPD's experiences, the reference pool of
# SDFT/OPSD), its index, the two cold-start composers on the warm-started backbone, then `lopd study`
# one run at a time. Each finished run's rows land in docs/results/bed-cpu-v2/ (the study file's
# `results`), which is committed here after each run (COMMIT=0: not), so a study stopped on one
# machine continues on another from the repository. Every step skips what already exists: rerun
# this script to resume.
set -euo pipefail
BED=${BED:-runs/bed-v2}
COMMIT=${COMMIT:-1}
here=$(cd "$(dirname "$0")" && pwd)
config="$here/bed_cpu.toml"
results=docs/results/bed-cpu-v2
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
# 3. the cold-start composers on the warm-started backbone (J and K as the study's LOPD runs):
#    composer-textkl, the composer ladder's best recipe (LOPD's; its 64-target ladder is committed
#    with the results), and composer0, bed version 1's recipe (the constant-prompt ablation)
if [ ! -d "$BED/composer-textkl/final" ]; then
  lopd coldstart --experiences "$BED/store" --model "$student" --out "$BED/composer-textkl" --steps 350 \
    --J 2 --K 8 --depth 2 --max-exp-tokens 192 --lr 1e-4 --no-activation-checkpointing --batch-size 2 \
    --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 \
    --checkpoint-every 25 --eval-every 1000 --heldout-fraction 0.2 --seed 0 --no-ladder --resume
fi
if [ ! -f "$results/composer-ladder.json" ]; then
  mkdir -p "$results"
  lopd ladder "$BED/composer-textkl" --targets 64 --out "$results/composer-ladder.json"
  cp "$BED/composer-textkl/config.json" "$results/composer-ladder.config.json"
  if [ "$COMMIT" = 1 ]; then
    git add -- "$results/composer-ladder.json" "$results/composer-ladder.config.json"
    git commit -m "bed study: the study composer's ladder on 64 held-out targets" -- "$results"
  fi
fi
if [ ! -d "$BED/composer0/final" ]; then
  lopd coldstart --experiences "$BED/store" --model "$student" --out "$BED/composer0" --steps 20 \
    --J 2 --K 8 --depth 2 --max-exp-tokens 192 --lr 1e-3 --no-activation-checkpointing \
    --checkpoint-every 10 --eval-every 20 --heldout-fraction 0.2 --resume
fi
# 4. the study, one (run, seed) at a time, every run's first seed before any second one; each
#    finished run's rows are committed at once
runs=$(python3 - "$config" <<'PY'
import sys, tomllib
study = tomllib.load(open(sys.argv[1], "rb"))
trained = [(r["name"], r.get("seeds") or study.get("seeds", [0])) for r in study["runs"] if r.get("method") != "vanilla"]
print(" ".join(f"{name}:{seeds[i]}" for i in range(max(len(s) for _, s in trained)) for name, seeds in trained if i < len(seeds)))
PY
)
for run in $runs; do
  lopd study --config "$config" --only "$run"
  if [ "$COMMIT" = 1 ] && [ -n "$(git status --porcelain -- "$results")" ]; then
    cp "$config" "$results/study.toml"
    git add -- "$results"
    git commit -m "bed study: results after run $run" -- "$results"
  fi
done
echo "study finished in $(( $(date +%s) - start )) s; results in $results"
