"""
The gate: judge kernel.py (five correctness stages, then timing and roofline), append one row to
results.tsv, and keep (git commit) or revert (git checkout HEAD -- kernel.py) the edit.

    uv run bench.py -m "BLOCK_N 2048"     # judge kernel.py, keep or revert it; -m: what you tried
    uv run bench.py --quick -m "idea"     # smoke test + timing only, to iterate: recorded as
                                          #   "judged", never kept or reverted
    uv run bench.py --no-git              # judge and record (status "judged"), no git action
    uv run bench.py --kernel kernels/softmax.py   # any kernel file; implies --no-git
    uv run bench.py --kernel F --correctness-only # the five stages alone: no timing, no
                                                  #   baselines, no row, no git (verify.py)
    uv run bench.py --timeout 60 --results /tmp/r.tsv

Keep rule (autokernel/results.keep_rule): a candidate that passes all five stages is timed in paired
rounds against the best kept version of its tag, shape, dtype and device, in the same run, on this
process's clock; it is kept only when its median gain beats the rounds' spread (and 1%), and, where
the kept version read more than 10% above its recorded latency, that record by 5%
(autokernel/results.keep_rule_checked). The first correct version of a setting is kept. A keep
commits kernel.py alone and copies it to the kernel's file in workspace/ (its file of record in
plan.json); a revert restores kernel.py from HEAD.

Trust. This process is the judge. The kernel file is read first (autokernel/source_check.py)
and refused by name if it reaches past its own code; it is then imported only by child processes
(autokernel/child.py), confined before the kernel's code runs (autokernel/sandbox.py), which the
judge treats as hostile: they get inputs and output buffers, answer in JSON, and decide nothing.
Outputs are compared with the float64 oracle here (autokernel/gate.py), every timing round is
measured by this process's own clock (autokernel/timing.py), the repo's state is snapshotted
before the children start and restored after (autokernel/state.py), a bench.py killed mid-run
becomes a CRASH row in the next one, and no process they started outlives the verdict. README's
"The gate's trust model" says what is prevented, what is only detected and what remains possible.

During a night (workspace/plan.json and orchestrate.py's current kernel) the tag, type and shapes
a run of kernel.py is recorded under, and its file of record, are the plan's for that kernel.

Output: `key: value` lines, the verdict last. Exit 0 for a judgement (keep, revert or judged),
2 when it refuses to judge (usage, no -m for kernel.py, dirty harness, not a git repo, malformed
or unwritable results.tsv, another bench.py running, a CUDA C++ kernel on a machine without a
GPU, a kernel.py whose KERNEL_NAME, KERNEL_TYPE or BENCH_SHAPES disagree with the kernel the
night is on: no row is written then), 1 when the harness itself fails.
"""
import sys

import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)
from autokernel import experiment
from autokernel.cli import ArgumentParser, run_main

DEFAULT_TIMEOUT_S = 180


def parse_args(argv=None):
    p = ArgumentParser(description="AutoKernel gate: correctness, timing, keep/revert.")
    p.add_argument("--quick", action="store_true", help="smoke test on the primary shape + timing")
    p.add_argument("--no-git", action="store_true", help="judge and record, no commit/restore")
    p.add_argument("--kernel", help="kernel file to judge (default kernel.py; others imply --no-git)")
    p.add_argument("--correctness-only", action="store_true",
                   help="the five correctness stages alone: no timing, no baselines, no row in "
                        "results.tsv, no git action (verify.py's re-gate)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"wall-clock limit for the kernel's run in seconds (default "
                        f"{DEFAULT_TIMEOUT_S}); each call also has its own limit")
    p.add_argument("-m", "--description", default="",
                   help="what this experiment tries (required when judging kernel.py)")
    p.add_argument("--results", help="results file (default results.tsv in the repo)")
    args = p.parse_args(argv)
    if not args.timeout > 0:
        p.error(f"--timeout {args.timeout} must be positive (seconds)")
    args.no_git = args.no_git or args.correctness_only
    return args


def main(argv=None):
    args = parse_args(argv)
    return run_main("bench.py", lambda _: experiment.run(args))


if __name__ == "__main__":
    sys.exit(main())
