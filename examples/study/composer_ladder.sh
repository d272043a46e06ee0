#!/usr/bin/env bash
# The composer ladder on lopd's study bed (docs/results/composer-ladder.md): one cold start per
# lever, each scored on the ladder of controls at its end (`lopd coldstart`'s ladder), on CPU, one
# thread. Needs the bed's store of verified train references, indexed:
#   lopd collect --env lopd-bed --split train --reference --store runs/bed/store && lopd index --store runs/bed/store
# Bed version 2 (the results' Rounds 3 on): the warm start, then the store collected without --model
# (the collect run's id is part of the trajectory ids, which pick the batches and the ladder's targets):
#   lopd collect --env lopd-bed --split warmup --reference --store runs/bed2/warm
#   lopd sft --store runs/bed2/warm --out runs/bed2/sft0 --steps 40
#   lopd collect --env lopd-bed --split train --reference --store runs/bed2/store && lopd index --store runs/bed2/store
#   STORE=runs/bed2/store MODEL=runs/bed2/sft0/final/student OUT=runs/ladder2 \
#     RESULTS=docs/results/composer-ladder/bed2 bash examples/study/composer_ladder.sh LEVER
# Usage: bash examples/study/composer_ladder.sh NAME [NAME ...]  (names below; each skips a finished run)
# Each lever's ladder.json and config.json are copied to $RESULTS/NAME.json and NAME.config.json: a
# rerun into the committed folder overwrites them (`git diff` then shows what changed).
set -euo pipefail
STORE=${STORE:-runs/bed/store}
MODEL=${MODEL:-smollm2-135m}
OUT=${OUT:-runs/ladder}
RESULTS=${RESULTS:-docs/results/composer-ladder}
LOPD=${LOPD:-lopd}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
# today's bed composer (examples/study/bed_run.sh): J 2, K 8, depth 2, 20 steps at lr 1e-3
base=(--experiences "$STORE" --model "$MODEL" --J 2 --K 8 --depth 2 --max-exp-tokens 192 --lr 1e-3
      --no-activation-checkpointing --heldout-fraction 0.2 --seed 0 --ladder-targets 12 --batch-size 2)
declare -A LEVERS=(
  [today]="--steps 20 --ladder-targets 8"
  [self]="--steps 20 --self-retrieval --ladder-targets 8"
  [self-recon]="--steps 20 --self-retrieval --reconstruction-steps 8"
  [self-lrenc]="--steps 20 --self-retrieval --lr-encoder 1e-4"
  [self-40]="--steps 40 --self-retrieval"
  [official]="--steps 20 --self-retrieval --J 3 --K 32"
  [self-recon40]="--steps 60 --self-retrieval --reconstruction-steps 40"
  [self-token]="--steps 20 --self-retrieval --memory-norm token"
  [self-contrast]="--steps 20 --self-retrieval --memory-norm token --contrast-weight 1"
  [self-small]="--steps 20 --self-retrieval --memory-norm token --latent-scale 0.1 --contrast-weight 1"
  [self-contrast-lr4]="--steps 20 --self-retrieval --memory-norm token --contrast-weight 1 --lr 1e-4"
  [self-span]="--steps 20 --self-retrieval --memory-norm token --readout span --K 16"
  [self-span-framed]="--steps 20 --self-retrieval --memory-norm token --readout span --K 16 --placement framed"
  [shipped]="--steps 200 --lr 1e-4 --J 3 --K 32 --depth 8 --max-exp-tokens 256 --checkpoint-every 10"
  [self-textkl]="--steps 20 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1"
  [self-textkl-lr4]="--steps 20 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 --lr 1e-4"
  [self-textkl-lr4-60]="--steps 60 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 --lr 1e-4"
  [self-textkl-lr3e4-60]="--steps 60 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 --lr 3e-4"
  [self-textkl-lr4-150]="--steps 150 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 --lr 1e-4 --checkpoint-every 30"
  [self-textkl-lr4-350]="--steps 350 --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 --lr 1e-4 --checkpoint-every 50 --eval-every 1000"
  [self-lrcomp]="--steps 20 --self-retrieval --memory-norm token --lr 1e-5 --lr-encoder 1e-3"
  [self-pointer]="--steps 20 --self-retrieval --memory-norm token --readout pointer"
  [self-centred]="--steps 20 --self-retrieval --memory-norm token --readout centred"
  [self-centred-lr4]="--steps 20 --self-retrieval --memory-norm token --readout centred --lr 1e-4"
  [self-centred-textkl-lr4]="--steps 20 --self-retrieval --memory-norm token --readout centred --placement framed --text-kl-weight 1 --lr 1e-4"
)
# levers that keep today's steps, lr, batches, J and K share one trained free-vector control (h):
# FreePrompt ignores its inputs, so it trains to the same vectors in every such run
SHARES_H=" today self self-recon self-lrenc self-token self-pointer "
mkdir -p "$RESULTS"
for name in "$@"; do
  if [[ "$SHARES_H" == *" $name "* && ! -d "$OUT/$name" ]]; then
    for other in $SHARES_H; do
      if [ -f "$OUT/$other/free_prompt.safetensors" ]; then
        mkdir -p "$OUT/$name" && cp "$OUT/$other/free_prompt.safetensors" "$OUT/$name/" && break
      fi
    done
  fi
  # a lever's own flags come last so that they win (a repeated option keeps its last value)
  # shellcheck disable=SC2086
  $LOPD coldstart "${base[@]}" --checkpoint-every 100 --eval-every 100 ${LEVERS[$name]} --out "$OUT/$name" --resume
  cp "$OUT/$name/ladder.json" "$RESULTS/$name.json"
  cp "$OUT/$name/config.json" "$RESULTS/$name.config.json"
done
