#!/usr/bin/env bash
# Generation: a Llama-3.2-1B-shaped transformers model (models/configs/llama-3.2-1b.json, random
# weights), bf16, a 512-token prompt then 256 decode steps over a static KV cache, at batch 1 and
# 8: every variant's logits checked on every step, tokens/s for eager, eager as CUDA graphs,
# torch.compile (a CUDA graph a step), the kernels and torch.compile with the kernels, each as a
# share of the bandwidth roofline: verify.py --generate, then a short table.
#
#   bash benchmarks/generation.sh [OUTDIR] [BATCH ...]      # default batches: 1 8
#   KERNELS=kernels/decode_attention.py bash benchmarks/generation.sh /tmp/g 1
#                                                          # these files instead of --starters
#   GENERATE=128x64 bash benchmarks/generation.sh /tmp/g 1 # another prompt x new
#
# Runs prepare.py --types decode_attention first (the copy bandwidth the roofline uses), then
# per batch:
#   python3 verify.py --module transformers --hf-config models/configs/llama-3.2-1b.json
#       --dtype bf16 --input-shape Bx512 --generate 512x256 --starters --no-regate
# (--no-regate: the starters' gate verdicts come from benchmarks/starters.sh; every step's
# logits are still checked against the original). Writes OUTDIR/generate_b<B>.{json,log}.
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
BATCHES=("$@")
[ ${#BATCHES[@]} -gt 0 ] || BATCHES=(1 8)
GENERATE=${GENERATE:-512x256}
PROMPT=${GENERATE%x*}
SOURCE=(--starters)
[ -n "${KERNELS:-}" ] && SOURCE=(--kernels "$KERNELS")

"${PY[@]}" prepare.py --types decode_attention > "$OUTDIR/prepare.log" 2>&1 || { tail -5 "$OUTDIR/prepare.log"; exit 1; }
status=0
reports=()
for batch in "${BATCHES[@]}"; do
    cmd=(verify.py --module transformers --hf-config models/configs/llama-3.2-1b.json
         --dtype bf16 --input-shape "${batch}x$PROMPT" --generate "$GENERATE" "${SOURCE[@]}"
         --no-regate --out "$OUTDIR/generate_b$batch.json")
    header "generation (batch $batch): python3 ${cmd[*]}" | tee "$OUTDIR/generate_b$batch.log"
    "${PY[@]}" "${cmd[@]}" 2>&1 | tee -a "$OUTDIR/generate_b$batch.log" || status=$?
    reports+=("$OUTDIR/generate_b$batch.json")
done
"${PY[@]}" benchmarks/summary.py generation "${reports[@]}"
exit "$status"
