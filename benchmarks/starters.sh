#!/usr/bin/env bash
# The starters against eager PyTorch, torch.compile and the vendor library, at each kernel
# type's primary shape (and the extra rows of the bar): bench_starters.py, then a short table.
#
#   bash benchmarks/starters.sh [OUTDIR] [triton|cuda] [bench_starters.py flags...]
#   bash benchmarks/starters.sh /tmp/b                  # the Triton starters (kernels/)
#   bash benchmarks/starters.sh /tmp/b cuda             # the CUDA C++ starters (kernels/cuda/)
#   bash benchmarks/starters.sh /tmp/b triton --types softmax,matmul
#
# Writes OUTDIR/starters_<backend>.{md,json,log}. About 5-6 minutes a backend on an H100 (every
# type, torch.compile max-autotune-no-cudagraphs). On a CPU it runs the tiny shapes through
# Triton's interpreter without torch.compile: a check of the plumbing, not a benchmark.
source "$(dirname "$0")/common.sh"
BACKEND=${2:-triton}
shift $(( $# < 2 ? $# : 2 ))

header "starters ($BACKEND): python3 bench_starters.py --backend $BACKEND $*" | tee "$OUTDIR/starters_$BACKEND.log"
status=0
"${PY[@]}" bench_starters.py --backend "$BACKEND" --out "$OUTDIR/starters_$BACKEND.md" "$@" \
    2>&1 | tee -a "$OUTDIR/starters_$BACKEND.log" || status=$?
"${PY[@]}" benchmarks/summary.py starters "$OUTDIR/starters_$BACKEND.json"
exit "$status"
