#!/usr/bin/env bash
# Any model: how much of a model nobody here wrote the night can see, by profile.py (its
# defaults: fp16 on a GPU): the share of op time in the kernel types, in regions (the rest of
# the model's own code, autokernel/regions.py) and in neither, for KernelBench's level 3 models.
#
#   KERNELBENCH=path/to/KernelBench/level3 bash benchmarks/regions.sh [OUTDIR] [NAME...]
#   KERNELBENCH=~/KernelBench/KernelBench/level3 bash benchmarks/regions.sh /tmp/b
#   KERNELBENCH=... bash benchmarks/regions.sh /tmp/b 9_ResNet18 44_MiniGPTBlock
#
# KERNELBENCH is the level3 folder of a checkout of https://github.com/ScalingIntelligence/KernelBench
# (the models are KernelBench's, not in this repository). Without NAMEs: ResNet18, MobileNetV2,
# VisionTransformer, SwinTransformerV2, MiniGPTBlock, UNetSoftmax, Mamba2ReturnY. Writes
# OUTDIR/profile_<name>.{json,log}. About a minute a model on an H100.
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
need_kernelbench level3
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(9_ResNet18 20_MobileNetV2 28_VisionTransformer
    30_SwinTransformerV2 44_MiniGPTBlock 45_UNetSoftmax 48_Mamba2ReturnY)
reports=()
for name in "${NAMES[@]}"; do
    cmd=(profile.py --model "$KERNELBENCH/$name.py" --output "$OUTDIR/profile_$name.json")
    header "regions ($name): python3 ${cmd[*]}" > "$OUTDIR/profile_$name.log"
    "${PY[@]}" "${cmd[@]}" >> "$OUTDIR/profile_$name.log" 2>&1 \
        || echo "$name: profile.py failed (see $OUTDIR/profile_$name.log)"
    reports+=("$OUTDIR/profile_$name.json")
done
"${PY[@]}" benchmarks/summary.py profile "${reports[@]}"
