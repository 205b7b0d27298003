#!/usr/bin/env bash
# KernelBench level 1: our solutions (kernels/kernelbench/level1/) scored against KernelBench's
# own problem files by kernelbench.py score (fp32, KernelBench's precision), then fast_p over
# every problem scored into OUTDIR so far.
#
#   KERNELBENCH=path/to/KernelBench/level1 bash benchmarks/kernelbench.sh [OUTDIR] [PREFIX...]
#   KERNELBENCH=~/KernelBench/KernelBench/level1 bash benchmarks/kernelbench.sh /tmp/b
#   KERNELBENCH=... bash benchmarks/kernelbench.sh /tmp/b 1_ 23_ 95_   # only these problems
#
# KERNELBENCH is the level1 folder of a checkout of https://github.com/ScalingIntelligence/KernelBench
# (the problems are KernelBench's, not in this repository). Only the problems we have a solution
# for are scored (26), in a scratch folder of links; PREFIX... narrows them to the problems
# whose file names start with one of the prefixes. Each call writes
# OUTDIR/kernelbench_<prefixes or all>.{json,log}; the closing table merges every
# OUTDIR/kernelbench_*.json, so the 26 can be scored in several calls (about 30 s a problem on
# an H100, a few minutes for the largest).
source "$(dirname "$0")/common.sh"
shift $(( $# < 1 ? $# : 1 ))
need_kernelbench level1
KERNELBENCH=$(cd "$KERNELBENCH" && pwd)
SOLUTIONS=kernels/kernelbench/level1
problems=$(mktemp -d)
trap 'rm -rf "$problems"' EXIT
for solution in "$SOLUTIONS"/*.py; do
    name=$(basename "$solution")
    wanted=$(( $# == 0 ))
    for prefix in "$@"; do
        [[ $name == "$prefix"* ]] && wanted=1
    done
    [ "$wanted" = 1 ] || continue
    if [ -f "$KERNELBENCH/$name" ]; then
        ln -s "$KERNELBENCH/$name" "$problems/$name"
    else
        echo "kernelbench.sh: $KERNELBENCH has no $name (our solution's problem); left out" >&2
    fi
done
if [ -z "$(ls "$problems")" ]; then
    echo "kernelbench.sh: no problem to score (prefixes: ${*:-none})" >&2
    exit 2
fi
tag=$(IFS=-; echo "${*:-all}")
out="$OUTDIR/kernelbench_$tag"
header "kernelbench: python3 kernelbench.py score --problems <KERNELBENCH: $(ls "$problems" | wc -l) problems> --solutions $SOLUTIONS" | tee "$out.log"
status=0
"${PY[@]}" kernelbench.py score --problems "$problems" --solutions "$SOLUTIONS" \
    --out "$out.json" 2>&1 | tee -a "$out.log" || status=$?
"${PY[@]}" benchmarks/summary.py kernelbench "$OUTDIR"/kernelbench_*.json
exit "$status"
