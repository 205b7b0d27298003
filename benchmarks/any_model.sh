#!/usr/bin/env bash
# Any model, the whole night's path on models nobody here wrote (KernelBench level 3): per model,
# profile.py ranks it (fp16 on a GPU), extract.py writes its top kernels (types and regions),
# bench.py judges every region kernel file (the five stages, then timed beside eager and
# torch.compile of the same region), and verify.py plugs every extracted starter into the model
# and times it end to end against torch.compile (CUDA graphs).
#
#   KERNELBENCH=path/to/KernelBench/level3 bash benchmarks/any_model.sh [OUTDIR] [NAME...]
#   KERNELBENCH=... TOP=8 BENCH=0 bash benchmarks/any_model.sh /tmp/b 9_ResNet18
#
#   TOP      kernels extract.py writes a model (default 6)
#   BENCH=0  skips bench.py on the region files; VERIFY=0 skips verify.py
#   LIMIT    seconds a model may take before its remaining steps are skipped (default 900)
#
# Per model: OUTDIR/<name>/ holds profile.json, extract.py's workspace (plan.json, the kernel
# files, regions/), bench_<kernel>.log, results.tsv (bench.py's rows) and verify.{json,log}.
# Without NAMEs: ResNet18, MobileNetV2, VisionTransformer, MiniGPTBlock. On an H100 about a
# minute a region verdict (torch.compile of each region included) and two a verify.
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
need_kernelbench level3
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(9_ResNet18 20_MobileNetV2 28_VisionTransformer 44_MiniGPTBlock)
TOP=${TOP:-6}
LIMIT=${LIMIT:-900}
header "any model: profile.py, extract.py --top $TOP, bench.py --kernel on each region, verify.py" \
    > "$OUTDIR/any_model.log"
log() { echo "$*" | tee -a "$OUTDIR/any_model.log"; }
profiles=()
tables=()
reports=()
for name in "${NAMES[@]}"; do
    dir="$OUTDIR/$name"
    mkdir -p "$dir"
    start=$SECONDS
    left() { echo $(( LIMIT - (SECONDS - start) )); }
    log "$name: profile.py"
    "${PY[@]}" profile.py --model "$KERNELBENCH/$name.py" --output "$dir/profile.json" \
        > "$dir/profile.log" 2>&1 || { log "$name: profile.py failed ($dir/profile.log)"; continue; }
    "${PY[@]}" extract.py --profile "$dir/profile.json" --workspace "$dir" --top "$TOP" \
        > "$dir/extract.log" 2>&1 || log "$name: extract.py failed ($dir/extract.log)"
    tee -a "$OUTDIR/any_model.log" < "$dir/extract.log"
    profiles+=("$dir/profile.json")
    tables+=("$dir/results.tsv")
    if [ "${BENCH:-1}" = 1 ]; then
        for file in $("${PY[@]}" -c 'import json,sys; print(" ".join(k["file"] for k in json.load(open(sys.argv[1]))["kernels"] if k["kernel_type"] == "region"))' "$dir/plan.json" 2>/dev/null); do
            kernel=$(basename "$file" .py)
            [ "$(left)" -gt 0 ] || { log "$name $kernel: skipped (past LIMIT=$LIMIT s)"; continue; }
            timeout "$(left)" "${PY[@]}" bench.py --kernel "$file" --results "$dir/results.tsv" \
                > "$dir/bench_$kernel.log" 2>&1 || true
            log "$name $kernel ($(( SECONDS - start )) s): $(grep '^verdict:' "$dir/bench_$kernel.log" || tail -1 "$dir/bench_$kernel.log")"
        done
    fi
    if [ "${VERIFY:-1}" = 1 ]; then
        reports+=("$dir/verify.json")
        if [ "$(left)" -gt 0 ]; then
            log "$name: verify.py"
            timeout "$(left)" "${PY[@]}" verify.py --plan "$dir/plan.json" --cuda-graphs \
                --no-regate --no-compile-alone --results "$dir/results.tsv" --out "$dir/verify.json" > "$dir/verify.log" 2>&1 \
                || log "$name: verify.py stopped ($dir/verify.log: $(tail -1 "$dir/verify.log"))"
        else
            log "$name: verify.py skipped (past LIMIT=$LIMIT s)"
        fi
    fi
done
"${PY[@]}" benchmarks/summary.py profile "${profiles[@]}"
"${PY[@]}" benchmarks/summary.py regions "${tables[@]}"
[ ${#reports[@]} -eq 0 ] || "${PY[@]}" benchmarks/summary.py verify "${reports[@]}"
