#!/usr/bin/env bash
# The gate's own speed: seconds per bench.py verdict, as a night pays them. In a scratch git
# copy of this tree, one starter becomes kernel.py; prepare.py measures its baselines, then
# bench.py judges it RUNS times in git mode: the first verdict keeps it (the first correct
# version: one child), each later one pairs the same file with the kept version (two children,
# paired rounds) and reverts it.
#
#   bash benchmarks/gate_speed.sh [OUTDIR] [KERNEL_FILE]
#   bash benchmarks/gate_speed.sh /tmp/b                          # kernels/softmax.py
#   RUNS=6 bash benchmarks/gate_speed.sh /tmp/b kernels/cuda/reduce.py
#
# Writes OUTDIR/gate_speed.tsv (run, seconds from the shell, the log) and OUTDIR/gate_<n>.log
# (bench.py's output: wall_s, the verdict). Needs git. About 3 minutes on an H100 with RUNS=4.
source "$(dirname "$0")/common.sh"
KERNEL=${2:-kernels/softmax.py}
RUNS=${RUNS:-4}
[ -f "$KERNEL" ] || { echo "gate_speed.sh: $KERNEL is not a file: pass a starter, e.g. kernels/softmax.py" >&2; exit 2; }
KTYPE=$(sed -n 's/^KERNEL_TYPE *= *["'"'"']\([a-z_]*\)["'"'"'].*/\1/p' "$KERNEL" | head -1)
[ -n "$KTYPE" ] || { echo "gate_speed.sh: $KERNEL names no KERNEL_TYPE" >&2; exit 2; }

header "gate speed: $RUNS x python3 bench.py -m ... on $KERNEL as kernel.py (git mode)" | tee "$OUTDIR/gate_speed.log"
night=$(mktemp -d)
trap 'rm -rf "$night"' EXIT
tar --exclude=./.git --exclude=./.venv --exclude=./workspace --exclude=./results.tsv \
    --exclude=./.device --exclude=./shared --exclude=./dist --exclude='*/__pycache__' -cf - . | tar -xf - -C "$night"
cp "$KERNEL" "$night/kernel.py"
(cd "$night" && git init -q -b gate-speed && git config user.name benchmark \
    && git config user.email benchmark@localhost && git add -A && git commit -qm "gate speed: $KERNEL as kernel.py")

ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs() { local d=$(( $(ms) - $1 )); printf '%d.%d' $(( d / 1000 )) $(( d % 1000 / 100 )); }
t0=$(ms)
(cd "$night" && "${PY[@]}" prepare.py --types "$KTYPE") >> "$OUTDIR/gate_speed.log" 2>&1
echo "prepare.py --types $KTYPE: $(secs "$t0") s" | tee -a "$OUTDIR/gate_speed.log"

printf 'run\tseconds\tlog\n' > "$OUTDIR/gate_speed.tsv"
for run in $(seq 1 "$RUNS"); do
    what="the same file again"
    [ "$run" = 1 ] && what="the starter"
    t0=$(ms)
    (cd "$night" && "${PY[@]}" bench.py -m "$what") > "$OUTDIR/gate_$run.log" 2>&1 || true
    seconds=$(secs "$t0")
    printf '%s\t%s\t%s\n' "$run" "$seconds" "$OUTDIR/gate_$run.log" >> "$OUTDIR/gate_speed.tsv"
    echo "run $run: $(grep '^verdict:' "$OUTDIR/gate_$run.log" || tail -1 "$OUTDIR/gate_$run.log") ($seconds s)" | tee -a "$OUTDIR/gate_speed.log"
done
"${PY[@]}" benchmarks/summary.py gate "$OUTDIR/gate_speed.tsv"
