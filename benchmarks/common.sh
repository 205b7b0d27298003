# Sourced by the benchmarks/*.sh scripts (not run on its own): the Python to use, the output
# folder, the repo root as the working directory, and a header naming what was measured.
#
#   PYTHON   the interpreter (default python3: a GPU machine's own, with its torch and triton;
#            in a uv checkout e.g. PYTHON="uv run --frozen python")
#   OUTDIR   the script's first argument, else $OUT, else workspace/benchmarks
#   COMMIT   names the measured commit where the tree is not a git checkout, or is a copy laid
#            over an older one (a lent GPU machine's: git there names its base, "+edits")
set -euo pipefail

PYTHON=${PYTHON:-python3}
read -r -a PY <<< "$PYTHON"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${1:-${OUT:-$ROOT/workspace/benchmarks}}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$ROOT"

commit() {  # the commit measured: git's, with "+edits" for a dirty tree, else $COMMIT
    if [ -n "${COMMIT:-}" ]; then
        echo "$COMMIT"
    elif sha=$(git rev-parse --short HEAD 2>/dev/null); then
        git diff --quiet HEAD -- 2>/dev/null && echo "$sha" || echo "$sha+edits"
    else
        echo "unknown (not a git checkout: set COMMIT)"
    fi
}

header() {  # header NAME: what was measured, on which GPU, when, at which commit
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
    echo "benchmark: $1"
    echo "commit: $(commit)"
    echo "date: $(date -u +%Y-%m-%d)"
    echo "gpu: ${gpu:-none (a CPU: the timings mean nothing)}"
    echo "python: $PYTHON ($("${PY[@]}" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1))"
    echo "outdir: $OUTDIR"
}

need_kernelbench() {  # need_kernelbench LEVEL: KERNELBENCH must name that folder of KernelBench
    if [ -z "${KERNELBENCH:-}" ] || [ ! -d "$KERNELBENCH" ]; then
        echo "$(basename "$0"): set KERNELBENCH to KernelBench's $1 folder (the problem files)" >&2
        exit 2
    fi
}
