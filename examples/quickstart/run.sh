#!/usr/bin/env bash
# CPU quickstart: LOPD end to end on lopd's study bed (examples/envscaler_bed, `--env lopd-bed`) with
# the embedded SmolLM2-135M-Instruct: a warm start on the bed's verified warm-up demonstrations, the
# experience store of verified train-task references, a cold-started composer, LOPD distillation from
# the warm start, then the warm start and LOPD's student side by side on held-out bed tasks, and
# closing words saying what moved. BFCL=1 adds both students on held-out BFCL single-turn tasks.
# Every artifact goes under $RUN (default runs/quickstart). Running it again resumes each stage:
# stored tasks are skipped, finished training is not repeated, reports are reused.
set -euo pipefail
RUN=${RUN:-runs/quickstart}
BED_TASKS=${BED_TASKS:-40}      # held-out bed tasks scored (the `test` split: 270 exist)
WARM_STEPS=${WARM_STEPS:-20}    # lopd sft steps of the warm start (docs/results/demo-bed-step7/)
WARM_LR=${WARM_LR:-1e-4}
STORE_TASKS=${STORE_TASKS:-160} # train tasks whose verified references form the experience store
COMPOSER_STEPS=${COMPOSER_STEPS:-20}
LOPD_STEPS=${LOPD_STEPS:-4}     # LOPD steps of 8 rollouts each (examples/quickstart/lopd_bed.toml)
BFCL=${BFCL:-0}                 # 1: also both students on HELDOUT held-out BFCL single-turn tasks
HELDOUT=${HELDOUT:-40}
here=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
N=$(( BFCL == 1 ? 9 : 8 ))
start=$(date +%s)
i=0
step() { i=$(( i + 1 )); printf '\n\033[1m== [%s] %d/%d %s ==\033[0m\n' "$(date -u -d @$(( $(date +%s) - start )) +%M:%S)" "$i" "$N" "$*"; }
student="$RUN/warm/final/student"

step "collect: the bed's verified warm-up demonstrations (3 environments no test task uses)"
lopd collect --env lopd-bed --split warmup --reference --store "$RUN/bed-warm" --resume

step "sft: the warm start, $WARM_STEPS fine-tuning steps on them (the model learns the tool-call format)"
lopd sft --store "$RUN/bed-warm" --out "$RUN/warm" --steps "$WARM_STEPS" --lr "$WARM_LR" --resume

step "collect: the experience store, verified references of $STORE_TASKS train tasks"
lopd collect --env lopd-bed --split train --reference --limit "$STORE_TASKS" --model "$student" \
  --store "$RUN/store" --resume

step "index: embeddings + full-text index for retrieval"
lopd index --store "$RUN/store"

step "coldstart: the composer on the warm start ($COMPOSER_STEPS steps, action NLL + the text teacher's KL)"
# the recipe whose latents carry content (docs/results/composer-ladder.md) at the demo's size; its
# final check scores the teacher on held-out train-task targets with the retrieved experiences and
# with another task's: the composer's own control
lopd coldstart --experiences "$RUN/store" --model "$student" --out "$RUN/composer" --steps "$COMPOSER_STEPS" \
  --J 2 --K 8 --depth 2 --max-exp-tokens 192 --lr 1e-4 --no-activation-checkpointing --batch-size 2 \
  --self-retrieval --memory-norm token --placement framed --text-kl-weight 1 \
  --ladder-rungs a,c,d --ladder-targets 16 --checkpoint-every 5 --eval-every 1000 --resume

step "distill: LOPD from the warm start ($LOPD_STEPS steps x 8 rollouts of train tasks)"
lopd distill --config "$here/lopd_bed.toml" --model "$student" --store "$RUN/store" \
  --composer "$RUN/composer/final" --steps "$LOPD_STEPS" --out "$RUN/lopd" --resume

evaluate() {  # bench who model extra-flags...
  local bench=$1 who=$2 model=$3; shift 3
  local report="$RUN/eval/$bench-$who.json"
  if [ -f "$report" ]; then echo "reusing $report"; return; fi
  lopd evaluate --bench "$bench" --model "$model" --out "$report" "$@"
}
step "evaluate: the warm start and LOPD's student on $BED_TASKS held-out bed tasks (never trained on)"
evaluate lopd-bed warm "$student" --limit "$BED_TASKS" --batch-size 10
evaluate lopd-bed lopd "$RUN/lopd/final/student" --limit "$BED_TASKS" --batch-size 10
lopd evaluate --compare "$RUN/eval/lopd-bed-warm.json" "$RUN/eval/lopd-bed-lopd.json"
if [ "$BFCL" = 1 ]; then
  step "evaluate: both students on $HELDOUT held-out BFCL single-turn tasks (another benchmark)"
  evaluate bfcl-single warm "$student" --limit "$HELDOUT" --max-new-tokens 96 --batch-size 8
  evaluate bfcl-single lopd "$RUN/lopd/final/student" --limit "$HELDOUT" --max-new-tokens 96 --batch-size 8
  lopd evaluate --compare "$RUN/eval/bfcl-single-warm.json" "$RUN/eval/bfcl-single-lopd.json"
fi
step "report: training curves, summary.md (every training and evaluation of this run) and what happened"
inputs=("$RUN/warm" "$RUN/composer" "$RUN/lopd" "$RUN/eval/lopd-bed-warm.json" "$RUN/eval/lopd-bed-lopd.json")
if [ "$BFCL" = 1 ]; then inputs+=("$RUN/eval/bfcl-single-warm.json" "$RUN/eval/bfcl-single-lopd.json"); fi
lopd report "${inputs[@]}" --out "$RUN/report"  # each bench's reports paired against the warm start's
python "$here/closing.py" "$RUN" | tee "$RUN/report/what-happened.txt"
echo "quickstart finished in $(( $(date +%s) - start )) s; artifacts in $RUN, plots in $RUN/report"
