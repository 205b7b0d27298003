#!/usr/bin/env bash
# Region starters against torch.compile: for KernelBench level 3 models, profile.py ranks the
# model (fp16 on a GPU), extract.py writes its top kernels (types and regions), and bench.py
# judges every region kernel file it wrote: the five stages, then timed beside eager and
# torch.compile of the same region (the starter's speedup_vs_compile, and its library calls).
#
#   KERNELBENCH=path/to/KernelBench/level3 bash benchmarks/region_starters.sh [OUTDIR] [NAME...]
#   KERNELBENCH=... TOP=8 bash benchmarks/region_starters.sh /tmp/b 9_ResNet18
#
# Per model: OUTDIR/<name>/ holds profile.json, extract.py's workspace (plan.json, the kernel
# files, regions/) and bench_<kernel>.log; OUTDIR/<name>/results.tsv bench.py's rows.
# Without NAMEs: ResNet18, MobileNetV2, VisionTransformer, MiniGPTBlock. About a minute a
# region on an H100 (torch.compile of each region included).
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
need_kernelbench level3
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(9_ResNet18 20_MobileNetV2 28_VisionTransformer 44_MiniGPTBlock)
TOP=${TOP:-6}
header "region starters: profile.py, extract.py --top $TOP, bench.py --kernel on each region" \
    > "$OUTDIR/region_starters.log"
tables=()
for name in "${NAMES[@]}"; do
    dir="$OUTDIR/$name"
    mkdir -p "$dir"
    "${PY[@]}" profile.py --model "$KERNELBENCH/$name.py" --output "$dir/profile.json" \
        > "$dir/profile.log" 2>&1 || { echo "$name: profile.py failed ($dir/profile.log)"; continue; }
    "${PY[@]}" extract.py --profile "$dir/profile.json" --workspace "$dir" --top "$TOP" \
        > "$dir/extract.log" 2>&1 || true
    cat "$dir/extract.log" | tee -a "$OUTDIR/region_starters.log"
    for file in $("${PY[@]}" -c 'import json,sys; print(" ".join(k["file"] for k in json.load(open(sys.argv[1]))["kernels"] if k["kernel_type"] == "region"))' "$dir/plan.json" 2>/dev/null); do
        kernel=$(basename "$file" .py)
        "${PY[@]}" bench.py --kernel "$file" --results "$dir/results.tsv" \
            > "$dir/bench_$kernel.log" 2>&1 || true
        echo "$name $kernel: $(grep '^verdict:' "$dir/bench_$kernel.log" || tail -1 "$dir/bench_$kernel.log")" \
            | tee -a "$OUTDIR/region_starters.log"
    done
    tables+=("$dir/results.tsv")
done
"${PY[@]}" benchmarks/summary.py regions "${tables[@]}"
