"""
KernelBench problems in AutoKernel. A problem file in KernelBench's format (Model, get_inputs(),
get_init_inputs()) becomes kernel.py for the overnight loop, behind the same gate; a solution is
KernelBench's ModelNew (Model's init arguments, Model's forward), so it moves between the two
unchanged.

    uv run kernelbench.py setup PROBLEM.py                 # kernel.py: ModelNew for PROBLEM
                                                           #   (starts as Model renamed; committed)
    uv run kernelbench.py setup PROBLEM.py --from SOL.py   # start from an existing solution
    uv run bench.py -m "..."                               # then the loop, as program.md says

    uv run kernelbench.py score --problems KernelBench/level1 --solutions my_solutions/
        [--dtype fp32] [--out workspace/kernelbench.json] [--timeout 180] [--call-timeout S]
        [--compile-mode default|max-autotune|none]

score: solutions matched to problems by file name, each judged in its own process by the gate
(autokernel/kernelbench.py) in one dtype (KernelBench's fp32 unless --dtype), one line per problem
(`NAME: correct|incorrect|missing|error`, the speedups vs eager and vs torch.compile), then
KernelBench's fast_p against both, and the JSON. Timings mean something on a GPU only.
"""
import sys
from pathlib import Path

import autokernel as ak
from autokernel.cli import ArgumentParser, UsageError, run_main


def parse_args(argv=None):
    p = ArgumentParser(description="KernelBench problems: set one up as kernel.py, or "
                                            "score a folder of solutions.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup", help="write kernel.py for a problem (committed in the repo)")
    s.add_argument("problem", help="the KernelBench problem file")
    s.add_argument("--from", dest="solution", help="a solution file (ModelNew) to start from "
                   "(default: the problem's Model renamed ModelNew)")
    s.add_argument("--dtype", default=None, help="the timed dtype: fp32 (default, KernelBench's), "
                   "fp16 or bf16")
    s.add_argument("--kernel", help="write this file instead of kernel.py (no commit)")
    s.add_argument("--force", action="store_true", help="replace uncommitted edits of kernel.py")
    c = sub.add_parser("score", help="judge every solution against its problem; fast_p")
    c.add_argument("--problems", required=True, help="folder of problem files")
    c.add_argument("--solutions", required=True, help="folder of solution files (same names)")
    c.add_argument("--dtype", default="fp32", help="the dtype judged and timed (default fp32)")
    c.add_argument("--out", default=str(ak.WORKSPACE / "kernelbench.json"),
                   help="the JSON report (default workspace/kernelbench.json)")
    c.add_argument("--timeout", type=float, default=180.0,
                   help="wall-clock limit per solution in seconds (default 180)")
    c.add_argument("--call-timeout", type=float, default=None,
                   help="limit for one call of a solution (default bench.py's: 30 s, 90 on a CPU)")
    c.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of the baseline: default (KernelBench's), "
                        "max-autotune, ... or none")
    args = p.parse_args(argv)
    if args.command == "score":
        for flag in ("problems", "solutions"):
            if not Path(getattr(args, flag)).is_dir():
                p.error(f"--{flag} {getattr(args, flag)} is not a folder")
        if not args.timeout > 0 or (args.call_timeout is not None and not args.call_timeout > 0):
            p.error("--timeout and --call-timeout must be positive (seconds)")
    if args.dtype is not None:
        try:
            ak.parse_dtype(args.dtype)
        except ValueError as e:
            p.error(str(e))
        args.dtype = ak.DTYPE_NAMES[ak.parse_dtype(args.dtype)]
    return args


def main(argv=None):
    args = parse_args(argv)
    return run_main("kernelbench.py", lambda _: setup(args) if args.command == "setup"
                    else score(args))


def setup(args):
    from autokernel.kernelbench_setup import setup as write
    if not Path(args.problem).is_file():
        raise UsageError(f"problem file {args.problem} not found: pass a KernelBench problem "
                         f"(a .py file with Model, get_inputs, get_init_inputs)")
    write(args.problem, args.solution, args.dtype, args.kernel, args.force)
    return 0


def score(args):
    from autokernel import kernelbench, kernelbench_score
    from autokernel.workspace import write_json
    mode = args.compile_mode or kernelbench.COMPILE_MODE
    report = kernelbench_score.score(args.problems, args.solutions, args.dtype, args.timeout,
                                     args.call_timeout, mode,
                                     log=lambda line: print(line, file=sys.stderr, flush=True))
    for line in kernelbench_score.table(report):
        print(line)
    write_json(args.out, report)
    print(f"json: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
