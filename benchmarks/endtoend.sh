#!/usr/bin/env bash
# End to end: every starter plugged into the compact LLaMA (8x2048) and GPT-2 small (8x1024),
# bf16, timed as CUDA-graph replays, the best variant paired with torch.compile in 15
# interleaved rounds: verify.py, then a short table.
#
#   bash benchmarks/endtoend.sh [OUTDIR] [llama|gpt2 ...]
#   bash benchmarks/endtoend.sh /tmp/b                  # both models
#   bash benchmarks/endtoend.sh /tmp/b gpt2
#   REGATE=1 bash benchmarks/endtoend.sh /tmp/b llama   # the morning command: re-gate first
#   EXTRA="--no-compile-alone" bash benchmarks/endtoend.sh /tmp/b
#
# Runs, per model:
#   python3 verify.py <model flags> --dtype bf16 --starters --cuda-graphs --no-regate $EXTRA
# (--no-regate: the starters' gate verdicts come from benchmarks/starters.sh and the gate
# itself; the logits are still checked against the original model). Writes
# OUTDIR/verify_<model>.{json,log}. A few minutes a model on an H100.
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
MODELS=("$@")
[ ${#MODELS[@]} -gt 0 ] || MODELS=(llama gpt2)
read -r -a EXTRA_FLAGS <<< "${EXTRA:-}"
REGATE_FLAG=(--no-regate)
[ "${REGATE:-0}" = 1 ] && REGATE_FLAG=()

status=0
reports=()
for model in "${MODELS[@]}"; do
    case $model in
        llama) flags=(--model models/llama.py --config compact --input-shape 8x2048) ;;
        gpt2) flags=(--model models/gpt2.py --input-shape 8x1024) ;;
        *) echo "endtoend.sh: unknown model $model: use llama or gpt2" >&2; exit 2 ;;
    esac
    cmd=(verify.py "${flags[@]}" --dtype bf16 --starters --cuda-graphs "${REGATE_FLAG[@]}"
         "${EXTRA_FLAGS[@]}" --out "$OUTDIR/verify_$model.json")
    header "end to end ($model): python3 ${cmd[*]}" | tee "$OUTDIR/verify_$model.log"
    "${PY[@]}" "${cmd[@]}" 2>&1 | tee -a "$OUTDIR/verify_$model.log" || status=$?
    reports+=("$OUTDIR/verify_$model.json")
done
"${PY[@]}" benchmarks/summary.py verify "${reports[@]}"
exit "$status"
