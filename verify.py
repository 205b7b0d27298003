"""
verify.py: plug the kept kernels back into the model, run it, and report whether it still computes
the same thing and how much faster it got end to end.

    uv run verify.py                      # plan.json's kernels, the model profile.json recorded
    uv run verify.py --model models/llama.py --config compact --input-shape 8x2048 --dtype bf16
    uv run verify.py --model models/gpt2.py --input-shape 8x1024 --dtype bf16 --starters
    uv run verify.py --model models/custom.py --kernels kernels/softmax.py,kernels/reduce.py
    uv run verify.py --module transformers --hf-config tiny-llama --starters
    uv run verify.py --pretrained ~/models/Llama-3.2-1B --dtype bf16   # real weights, offline
    uv run verify.py ... --diagnose       # each kernel alone: which one breaks the model?
    uv run verify.py ... --cuda-graphs    # time as CUDA graph replays (no launch overhead)
    uv run verify.py --module transformers --hf-config tiny-llama --starters --generate 16x8
                                          # generation: prefill, decode steps, tokens/s

The model flags are profile.py's (models/load.py); with none given, the flags recorded in the
profile the plan was extracted from (plan.json's "profile": extract.py --profile; for --kernels
and --starters, workspace/profile.json) are reused. Kernels come from workspace/plan.json, from
--kernels FILE[,FILE], or from --starters; each file's correctness is checked by the gate again
before it is plugged in (autokernel/verify_select.py says which files and how). The run, its
correctness check and its timings: autokernel/verify_run.py. The report, verify.json beside the
plan (--out to change), its schema and printing: autokernel/verify_report.py.

Exit status: 0 all kernels ran and the outputs match; 1 a kernel never ran, crashed, or the
outputs mismatch; 2 usage errors (bad flags, missing files).
"""
import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import argparse
import sys
from pathlib import Path

from autokernel.cli import ArgumentParser, UsageError, one_line, run_main
from autokernel.endtoend import GraphCaptureError
from autokernel.results import rel
from autokernel.decode import decoder_for, parse_generate
from autokernel.verify_decode import print_generation, probe, verify_generation
from autokernel.verify_report import Steps, print_report
from autokernel.verify_run import PAIRED_ROUNDS, run_steps, verify
from autokernel.verify_select import idle_entry, kernel_specs, plugged_kernels
from autokernel.workspace import read_plan, read_profile, recorded_model_args, write_json
from models.load import MODEL_FLAGS, add_model_args, check_model_args, load_model


def main(argv=None):
    return run_main("verify.py", _verify, argv)


def _verify(argv):
    args = build_parser().parse_args(argv)
    args.plan_given, args.plan = args.plan is not None, args.plan or str(autokernel.PLAN_JSON)
    args.out = args.out or str(Path(args.plan).with_name("verify.json") if args.plan_given
                               else autokernel.VERIFY_JSON)
    if args.kernels and args.starters:
        raise UsageError("pass either --kernels or --starters, not both")
    if args.warmup is not None and args.warmup < 0 or args.repeat is not None \
            and args.repeat < 1 or args.paired_rounds is not None and args.paired_rounds < 0:
        raise UsageError("--warmup and --paired-rounds must be >= 0, --repeat >= 1")
    if args.cuda_graphs and not autokernel.CUDA:
        raise UsageError("--cuda-graphs needs a CUDA GPU: drop it on this machine")
    check_model_args(args)  # a typo in the model flags: before minutes of re-gating
    specs, rows = kernel_specs(args)
    profile = reuse_profile_flags(args)
    if profile:
        given = " ".join(f"--{f.replace('_', '-')} {getattr(args, f)}"
                         for f in MODEL_FLAGS + ("generate",) if getattr(args, f, None) is not None)
        print(f"model flags from {rel(profile)}: {given or 'none (the defaults)'}")
    generate = parse_generate(args.generate) if args.generate else None
    if generate and (args.diagnose or args.cuda_graphs or args.paired_rounds):
        raise UsageError("--generate times every variant as CUDA graphs of a step already; "
                         "drop --diagnose, --cuda-graphs and --paired-rounds")
    steps = Steps(["load the model", "find call sites"] + ["re-gate"] * (not args.no_regate)
                  + (["generate with the original"] if generate else
                     run_steps(args.diagnose, not args.no_timing)))
    steps.start("load the model")
    model, inputs, description = load_model(args)  # before re-gating: its call sites decide
    batch = inputs[0].shape[0] if generate else None
    if generate:
        decoder_for(model, batch, sum(generate))  # not a decoder: say so before any re-gate
    kernels, checked, idle = plugged_kernels(args, specs, rows, model, inputs, steps,
                                             probe=probe(model, batch) if generate else None)
    refused = {f: c for f, c in checked.items() if not c["passed"]}
    if refused and not kernels:
        first = next(iter(refused.values()))
        raise UsageError(f"every kernel failed its re-gate: {one_line(first['gate'])}", code=1)
    backend = "none" if args.no_compile else args.compile_backend
    if generate:
        report = verify_generation(model, kernels, *generate, batch, timing=not args.no_timing,
                                   repeat=args.repeat, compile_backend=backend,
                                   description=description, steps=steps)
        report["kernels"] += [idle_entry(*i) for i in idle]
        return finish(args, report, checked, refused, print_generation)
    try:
        report = verify(model, inputs, kernels, diagnose=args.diagnose,
                        timing=not args.no_timing, warmup=args.warmup, repeat=args.repeat,
                        compile_backend=backend, weight_layout=args.weight_layout,
                        cuda_graphs=args.cuda_graphs, description=description,
                        compile_alone=args.compile_alone, paired_rounds=args.paired_rounds,
                        left_out=[idle_entry(*i) for i in idle], steps=steps)
    except GraphCaptureError as e:
        raise UsageError(str(e), code=1) from None
    return finish(args, report, checked, refused, print_report)


def finish(args, report, checked, refused, show):
    """The re-gates' verdicts into the report, the report printed and written: the exit code."""
    report["regate"] = None if args.no_regate else checked
    for path, c in refused.items():
        report["failures"].append(f"{rel(path)} left out: it failed its re-gate "
                                  f"({c['version'] if c['version_ok'] is False else c['gate']})")
        report["passed"] = False
    show(report)
    write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")
    return 0 if report["passed"] else 1


def build_parser():
    parser = ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]).strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser, "model (none of these given: the model the plan's profile recorded, "
                           "with its flags, workspace/profile.json's for --kernels and "
                           "--starters; the defaults below apply without one)")
    src = parser.add_argument_group("kernels (default: workspace/plan.json)")
    src.add_argument("--plan", help="extract.py's plan (default: workspace/plan.json); with "
                     "--kernels, the plan those files come from (their model, their regions)")
    src.add_argument("--kernels", help="explicit kernel files, comma-separated")
    src.add_argument("--starters", action="store_true",
                     help="the kernels/*.py starters (kernels/cuda/*.py with --backend cuda) "
                          "whose kernel type this model calls")
    src.add_argument("--backend", choices=("triton", "cuda"), default="triton",
                     help="which starters --starters takes: triton or cuda (CUDA C++, GPU only)")
    src.add_argument("--results", default=str(autokernel.RESULTS_TSV),
                     help="results.tsv whose kept rows the plan's kernel files must match")
    src.add_argument("--no-regate", action="store_true",
                     help="plug kernels in without judging each through bench.py first (quick "
                          "checks only: the morning report should re-gate)")
    parser.add_argument("--diagnose", action="store_true",
                        help="run each kernel alone and name the ones that break the model")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile timing")
    parser.add_argument("--compile-backend", help="torch.compile backend (default: inductor on "
                        "CUDA; on CPU compile is skipped unless this is given)")
    parser.add_argument("--compile-alone", action=argparse.BooleanOptionalAction,
                        help="time each kernel alone inside torch.compile too, a compile each "
                             "(default: on a GPU)")
    parser.add_argument("--paired-rounds", type=int,
                        help="time the best variant against torch.compile again in this many "
                             "interleaved rounds, the headline ratio their median (default "
                             f"{PAIRED_ROUNDS} on a GPU, 0 on a CPU; 0: off)")
    parser.add_argument("--generate", metavar="PROMPTxNEW",
                        help="verify generation instead of one forward: a PROMPT-token prompt "
                             "(batch from --input-shape) prefilled, then NEW decode steps over a "
                             "static KV cache, every step's logits checked, tokens/s per variant "
                             "(autokernel/verify_decode.py), e.g. 512x256")
    parser.add_argument("--no-timing", action="store_true", help="check correctness only")
    parser.add_argument("--warmup", type=int, help="untimed forwards (default 5 CUDA, 1 CPU)")
    parser.add_argument("--repeat", type=int, help="timed forwards (default 20 CUDA, 3 CPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="time every variant as CUDA graph replays: kernels without the "
                        "per-launch host cost that makes small forwards launch-bound")
    parser.add_argument("--weight-layout", choices=("copy", "view"), default="copy",
                        help="matmul B operand: contiguous W.t() copy (default) or strided view")
    parser.add_argument("--out", help="report JSON path (default: verify.json beside --plan, "
                        "workspace/verify.json without one)")
    return parser


def reuse_profile_flags(args):
    """No model flags given: rebuild the model profile.py profiled (its profile records the
    flags), since plan.json's kernels were extracted from that model. -> the profile read, or
    None (flags given, or no profile recorded any)."""
    if any(getattr(args, f, None) is not None for f in MODEL_FLAGS):
        return None
    profile = profile_path(args)
    recorded = recorded_model_args(profile)
    for f in MODEL_FLAGS:
        if recorded.get(f) is not None:
            setattr(args, f, recorded[f])
    if recorded and args.generate is None:  # a profile of generation: verify generation
        args.generate = read_profile(profile).get("generate")
    return profile if recorded else None


def profile_path(args):
    """The profile the kernels come from: the one plan.json names (extract.py --profile) when
    they are the plan's, else workspace/profile.json. A path recorded relative is taken from
    the current directory, else from the repo's root."""
    from_plan = not args.starters and (not args.kernels or args.plan_given)
    named = read_plan(args.plan).get("profile") if from_plan else None
    if not named:
        return autokernel.PROFILE_JSON
    path = Path(named)
    if not path.is_absolute() and not path.exists():
        path = autokernel.ROOT / path
    if not path.is_file():
        raise UsageError(f"{rel(args.plan)} was extracted from {named}, which is gone: pass the "
                         f"model flags (--model ...), or run profile.py and extract.py again")
    return path


if __name__ == "__main__":
    sys.exit(main())
