#!/usr/bin/env bash
# CPU quickstart: the whole LOPD pipeline on the embedded SmolLM2-135M-Instruct and real BFCL
# tasks: collect -> index -> coldstart -> distill -> evaluate (base vs distilled student).
# Every artifact goes under $RUN (default runs/quickstart). Running it again resumes each stage:
# stored tasks are skipped, finished training is not repeated, reports are reused.
set -euo pipefail
RUN=${RUN:-runs/quickstart}
EVAL_LIMIT=${EVAL_LIMIT:-1}   # BFCL-v3 multi-turn tasks per category (4 categories)
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
start=$(date +%s)
step() { printf '\n\033[1m== [%s] %s ==\033[0m\n' "$(date -u -d @$(( $(date +%s) - start )) +%M:%S)" "$*"; }

step "1/6 collect: reference demonstrations (BFCL single-turn possible answers, checker-verified)"
lopd collect --env bfcl --split train --reference --limit 40 --store "$RUN/store" --resume

step "2/6 collect: the student's own rollouts on the same kind of tasks"
lopd collect --env bfcl --split train --limit 8 --samples-per-task 2 --max-new-tokens 64 \
  --store "$RUN/store" --resume

step "3/6 index: embeddings + full-text index for retrieval"
lopd index --store "$RUN/store"

step "4/6 coldstart: composer phi_0 on successful trajectories"
lopd coldstart --experiences "$RUN/store" --out "$RUN/composer0" --steps 20 --J 2 --K 8 \
  --depth 2 --max-exp-tokens 192 --lr 1e-3 --no-activation-checkpointing --checkpoint-every 10 \
  --eval-every 10 --resume

step "5/6 distill: LOPD on-policy self-distillation (Algorithm 1)"
lopd distill --config "$here/distill.toml" --store "$RUN/store" \
  --composer "$RUN/composer0/final" --out "$RUN/lopd" --resume

step "6/6 evaluate: BFCL-v3 multi-turn, base model vs distilled student ($EVAL_LIMIT per category)"
for who in base lopd; do
  model=smollm2-135m; [ "$who" = lopd ] && model="$RUN/lopd/final/student"
  report="$RUN/eval/bfcl-v3-$who.json"
  if [ -f "$report" ]; then echo "reusing $report"; continue; fi
  # a short step cap and the response budget the student was trained with (64 tokens, as in
  # distill.toml) keep the CPU demo in minutes; drop both flags for BFCL's own rules (20 steps
  # per user turn, 256 tokens)
  lopd evaluate --bench bfcl-v3 --model "$model" --limit "$EVAL_LIMIT" --max-turns 8 \
    --max-new-tokens 64 --batch-size 4 --out "$report"
done
lopd evaluate --compare "$RUN/eval/bfcl-v3-base.json" "$RUN/eval/bfcl-v3-lopd.json"
echo "quickstart finished in $(( $(date +%s) - start )) s; artifacts in $RUN"
