#!/usr/bin/env bash
# The CPU-scale study of docs/results/bfcl-cpu/: prepare the experience store and the cold-start
# composer, run `lopd study` (vanilla, LOPD, GRPO, OPSD, SDFT, SDPO, Skill-SD at the same rollout
# budget, evaluated on 100 held-out BFCL single-turn tasks), then copy the table, plots, results
# and the study file into docs/results/bfcl-cpu/. Rerunning resumes every part.
set -euo pipefail
PREP=${PREP:-runs/study-bfcl-cpu-prep}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
start=$(date +%s)

# verified demonstrations of every TRAIN task (held-out tasks are never collected): the reference
# pool of sdft/opsd, the experiences LOPD retrieves, the cold start's training data
lopd collect --env bfcl --split train --reference --store "$PREP/store" --resume
lopd index --store "$PREP/store"
# the quickstart's composer settings; 5% of the tasks held out for its NLL check (of 20% it
# scores ~150 trajectories three ways, longer than the training)
lopd coldstart --experiences "$PREP/store" --out "$PREP/composer0" --steps 20 --J 2 --K 8 \
  --depth 2 --max-exp-tokens 192 --lr 1e-3 --no-activation-checkpointing --checkpoint-every 10 \
  --eval-every 20 --heldout-fraction 0.05 --resume
lopd study --config "$here/bfcl_cpu.toml"

dest=docs/results/bfcl-cpu
mkdir -p "$dest"
cp runs/study-bfcl-cpu/{table.md,results.json,results.csv,heldout.png,heldout_nll.png,train_reward.png,lopd_dual.png} "$dest/"
mkdir -p "$dest/report"
cp runs/study-bfcl-cpu/report/{*.png,summary.md} "$dest/report/"
cp "$here/bfcl_cpu.toml" "$dest/study.toml"
echo "study finished in $(( $(date +%s) - start )) s; results in $dest"
