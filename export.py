"""
export.py: ship the night's kept kernels as a package that needs only torch and triton: each
kernel registered as a torch custom op on import, patch(model) to swap them in, PyTorch's own op
for every call outside a kernel's contract, and its own smoke test.

    uv run export.py --out dist                    # dist/autokernel_kernels/
    uv run export.py --out dist --name llama_kernels
    uv run export.py --out dist --starters         # the shipped starters (kernels/*.py)

Where it is used (the folder's parent on PYTHONPATH, or the folder copied next to the code):

    python -m autokernel_kernels.smoke_test        # each kernel against PyTorch on this machine

    import autokernel_kernels
    with autokernel_kernels.patch(model):          # or handle = ...patch(model); handle.undo()
        out = model(x)

The kernels: those of workspace/plan.json whose file is a kept version in results.tsv, byte for
byte the version bench.py judged (a kernel with no kept version is left out; a file edited after
its keep stops the export; a kept row on this branch that no plan kernel is named after is named
on a line of its own). A kept region kernel ships with its region's reference (the smoke test's
oracle) and is plugged in where the model computes its region, as verify.py plugs it. Exporting
does not re-gate: verify.py is the morning re-check, and
the package's smoke test checks each kernel on the machine it runs on. The package's layout and
manifest: autokernel/export.py. An earlier export of the same name in --out is replaced.

Exit status: 0 written; 1 no kept kernel, or a kernel file that is not its kept version; 2 usage
errors (bad flags, missing plan.json).
"""
import autokernel.kernel_types  # noqa: F401  (first: CPU mode is set before triton is imported)

import argparse
import sys

import autokernel
from autokernel import export
from autokernel.cli import ArgumentParser, UsageError, run_main
from autokernel.night import unplaced_keeps
from autokernel.results import read_rows, rel
from autokernel.workspace import read_plan


def main(argv=None):
    return run_main("export.py", _export, argv)


def _export(argv):
    args = build_parser().parse_args(argv)
    export.check_target(args.out, args.name)
    if args.starters:
        kernels = export.starter_kernels()
        source = {"starters": rel(autokernel.KERNELS_DIR), "commit": export.head_commit()}
    else:
        plan = read_plan(args.plan)
        print(f"kept kernels of {rel(args.plan)}:")
        rows = read_rows(args.results)
        kernels = export.kept_kernels(plan, rows)
        for line in unplaced_keeps(plan, rows):
            print(line)
        if not kernels:
            raise UsageError(f"nothing to export: no kernel of {rel(args.plan)} has a kept "
                             f"version in {rel(args.results)} (run the night first, or pass "
                             f"--starters)", code=1)
        source = {"plan": rel(args.plan), "model": plan.get("model"), "dtype": plan.get("dtype"),
                  "commit": export.head_commit()}
    print(f"writing the package: {len(kernels)} kernel{'s' if len(kernels) != 1 else ''} ...")
    target = export.write_package(kernels, args.out, args.name, source)
    print(f"wrote {target} (how to use it: its README.md)")
    print(f"check it: cd {target.parent} && uv run python -m {args.name}.smoke_test  "
          "(elsewhere: any python with torch and triton)")
    return 0


def build_parser():
    parser = ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]).strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder to write the package into")
    parser.add_argument("--name", default="autokernel_kernels",
                        help="the package's import name (default autokernel_kernels)")
    parser.add_argument("--starters", action="store_true",
                        help="export the shipped starters (kernels/*.py) instead of the plan's "
                             "kept kernels")
    parser.add_argument("--plan", default=str(autokernel.PLAN_JSON), help="extract.py's plan")
    parser.add_argument("--results", default=str(autokernel.RESULTS_TSV),
                        help="results.tsv whose kept rows the plan's kernel files must match")
    return parser


if __name__ == "__main__":
    sys.exit(main())
