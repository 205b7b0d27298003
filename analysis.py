"""
Draw the night: progress.png with one panel per kernel, a per-kernel summary table and the
projected end-to-end model speedup. Works on any results.tsv (bench.py's, or the seed's
ten-column format), on a CPU.

Usage:
    uv run analysis.py
    uv run analysis.py --results results.tsv --plan workspace/plan.json --out progress.png

Each panel plots throughput per experiment (GB/s for memory-bound kernel types, TFLOP/s for
compute-bound ones): kept points, reverted points (correct but not faster), failed runs
(FAIL/TIMEOUT/CRASH, marked along the bottom) and the running best of the kept ones. The
projection needs plan.json's shares of model time (Amdahl); without a plan it is n/a.
"""
import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a GPU box or in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

import autokernel as ak  # noqa: E402
from orchestrate import (OrchestrateError, amdahl, kernel_stats, read_plan,  # noqa: E402
                         read_results, rel, throughput)


def kernel_order(rows, plan):
    """Plan kernels first (priority order), then any other tags in order of appearance."""
    planned = [k["name"] for k in plan["kernels"]] if plan else []
    others = [t for t in dict.fromkeys(rows.tag) if t not in planned]
    return [t for t in planned if t in set(rows.tag)] + others


def summarize(rows, plan):
    """Per-kernel summary table and the projected model speedup (None without a plan)."""
    shares = {k["name"]: k["share"] for k in plan["kernels"]} if plan else {}
    types = {k["name"]: k["kernel_type"] for k in plan["kernels"]} if plan else {}
    table, pairs = [], []
    names = kernel_order(rows, plan) + [n for n in shares if n not in set(rows.tag)]
    for name in names:
        sub = rows[rows.tag == name]
        ktype = sub.kernel_type.iloc[-1] if len(sub) else types[name]
        s = kernel_stats(sub)
        values, unit = throughput(sub, ktype)
        best = s["best"]
        table.append({
            "kernel": name, "type": ktype,
            "share": f"{100 * shares[name]:.1f}%" if name in shares else "-",
            "runs": s["runs"], "kept": s["kept"], "failed": s["failed"],
            "best_us": "-" if s["best"] is None else f"{s['best_us']:.1f}",
            "best": "-" if best is None else f"{values[best.name]:.4g} {unit}",
            "peak": "-" if s["pct_peak"] != s["pct_peak"] else f"{s['pct_peak']:.0f}%",
            "speedup": "-" if s["speedup_basis"] == "-"
            else f"{s['speedup']:.2f}x {s['speedup_basis']}",
        })
        if name in shares:
            pairs.append((shares[name], s["speedup"]))
    return pd.DataFrame(table), (amdahl(pairs) if plan else None)


def plot(rows, plan, projection, out):
    names = kernel_order(rows, plan)
    ncols = 1 if len(names) == 1 else 2
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        sub = rows[rows.tag == name]
        ktype = sub.kernel_type.iloc[-1]
        y, unit = throughput(sub, ktype)
        x = sub.experiment.where(sub.experiment.notna(), pd.Series(sub.index + 1.0,
                                                                     index=sub.index))
        passed, judged = sub.correctness.eq("PASS"), sub.status.eq("judged")
        kept, failed = passed & sub.kept, ~passed
        reverted = passed & ~kept & ~judged
        ax.scatter(x[kept], y[kept], s=36, color="tab:green", zorder=3, label="kept")
        ax.scatter(x[reverted], y[reverted], s=30, facecolors="none", edgecolors="tab:gray",
                   zorder=2, label="reverted (not faster)")
        if (passed & judged).any():  # --quick / --no-git runs: measured, neither kept nor reverted
            ax.scatter(x[passed & judged], y[passed & judged], s=24, marker="^",
                       color="tab:blue", alpha=0.6, zorder=2, label="judged only")
        # Failed runs have no throughput: mark them along the bottom edge of the panel.
        ax.scatter(x[failed], [0.02] * int(failed.sum()), marker="x", color="tab:red",
                   transform=ax.get_xaxis_transform(), zorder=3, clip_on=False,
                   label="FAIL / TIMEOUT / CRASH")
        best = y.where(kept).cummax().ffill()
        if best.notna().any():
            ax.step(x, best, where="post", color="tab:green", alpha=0.6, label="running best")
        s = kernel_stats(sub)
        bound = ak.KERNEL_TYPES[ktype].bound if ktype in ak.KERNEL_TYPES else "?"
        title = f"{name} ({ktype}, {bound}-bound)"
        if s["best"] is not None:
            title += f": best {y[s['best'].name]:.4g} {unit}"
            title += f", {s['speedup']:.2f}x {s['speedup_basis']}"
        ax.set_title(title, fontsize=10)
        ax.set_xlim(x.min() - 0.7, x.max() + 0.7)  # the failed markers are not autoscaled
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("experiment")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    # One legend for the figure, with every marker kind that appears in any panel.
    handles = {}
    for ax in axes.flat[:len(names)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
               fontsize=8, frameon=False)
    head = (f"AutoKernel: {len(rows)} experiments, {int(rows.kept.sum())} kept; projected "
            f"model speedup {'n/a (no plan.json)' if projection is None else f'{projection:.2f}x'}")
    if not rows.timing_ok.all():
        head += "\nCPU interpreter timings: not meaningful"
    fig.suptitle(head, fontsize=11)
    fig.tight_layout(rect=(0, 0.06 / nrows, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ak.RESULTS_TSV))
    parser.add_argument("--plan", default=None,
                        help=f"plan.json with shares (default {rel(ak.PLAN_JSON)} if present)")
    parser.add_argument("--out", default=str(ak.PROGRESS_PNG))
    args = parser.parse_args(argv)
    try:
        rows = read_results(args.results, must_exist=True)
        if rows.empty:
            raise OrchestrateError(f"{args.results} has a header but no experiments yet: run "
                                   f"`uv run bench.py` first")
        plan_path = Path(args.plan) if args.plan else ak.PLAN_JSON
        plan = read_plan(plan_path) if args.plan or plan_path.exists() else None
    except OrchestrateError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.code)
    table, projection = summarize(rows, plan)
    print(table.to_string(index=False))
    if projection is None:
        print("projected model speedup: n/a (no plan.json with shares of model time)")
    else:
        print(f"projected model speedup: {projection:.3f}x (Amdahl over plan.json's shares)")
    if not rows.timing_ok.all():
        print("timings: CPU interpreter, not meaningful")
    plot(rows, plan, projection, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
