"""
Read the night: the last experiments as a table, or progress.png with one panel per kernel, a
per-kernel summary table and the projected end-to-end model speedup. Runs on a CPU.

Usage:
    uv run analysis.py --last 8     # the last 8 experiments: what was tried and what bench.py said
    uv run analysis.py              # summary table, projection, progress.png
    uv run analysis.py --results results.tsv --plan workspace/plan.json --out progress.png

Each panel plots throughput per experiment (GB/s for memory-bound kernel types, TFLOP/s for
compute-bound ones): kept points, reverted points (correct but not faster), failed runs
(FAIL/TIMEOUT/CRASH, marked along the bottom) and the running best of the kept ones. The
projection needs plan.json's shares of model time (Amdahl); without a plan it is n/a. The
statistics come from autokernel/night.py, the same that orchestrate.py decides with.
"""
import math
import sys
from pathlib import Path

import autokernel as ak
from autokernel import night, regate
from autokernel.cli import ArgumentParser, UsageError, run_main
from autokernel.results import read_rows, rel
from autokernel.workspace import read_plan

LAST_COLUMNS = {"experiment": "exp", "tag": "tag", "latency_us": "latency_us",
                "speedup_vs_pytorch": "vs_eager", "speedup_vs_compile": "vs_compile",
                "pct_peak": "peak%", "correctness": "correctness", "status": "status",
                "description": "description", "reason": "reason"}


def main(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--last", type=int, metavar="N",
                        help="print the last N experiments and stop (no plot)")
    parser.add_argument("--results", default=str(ak.RESULTS_TSV))
    parser.add_argument("--plan", default=None,
                        help=f"plan.json with shares (default {rel(ak.PLAN_JSON)} if present)")
    parser.add_argument("--out", default=str(ak.PROGRESS_PNG))
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        raise UsageError(f"--last {args.last}: pass how many experiments to show, 1 or more")
    rows = read_rows(args.results, must_exist=True)
    if not rows:
        raise UsageError(f"{args.results} has a header but no experiments yet: run "
                         f"`uv run bench.py` first")
    unbacked = {row["experiment"]: why for row, why in regate.unbacked_keeps(rows)}
    if args.last is not None:
        shown = last_rows(rows, args.last, unbacked)
        print(night.table(shown, left=("tag", "description", "reason")))
        warn_unbacked({line["exp"]: unbacked[line["exp"]] for line in shown
                       if line["exp"] in unbacked})
        return
    plan_path = Path(args.plan) if args.plan else ak.PLAN_JSON
    plan = read_plan(plan_path) if args.plan or plan_path.exists() else None
    table, projection = summarize(rows, plan)
    print(night.table(table))
    if projection is None:
        print("projected model speedup: n/a (no plan.json with shares of model time)")
    else:
        print(night.projection_line(plan, rows))
    if not all(map(night.timing_ok, rows)):
        print("timings: CPU interpreter, not meaningful")
    warn_unbacked(unbacked)
    plot(rows, plan, projection, args.out)
    print(f"wrote {args.out}")


def last_rows(rows, n, unbacked=()):
    """The last n rows, the columns that say what was tried and what bench.py decided; a kept
    row that git does not back shows as `keep!`."""
    table = [{short: r[column] or "-" for column, short in LAST_COLUMNS.items()}
             for r in rows[-n:] if n > 0]
    for line in table:
        if line["exp"] in unbacked:
            line["status"] = "keep!"
    return table


def warn_unbacked(unbacked):
    """Kept rows whose commit is gone or holds other bytes: a forged or rewritten history."""
    for experiment, why in unbacked.items():
        print(f"warning: experiment {experiment} is marked kept but {why}: do not trust it "
              f"(verify.py re-gates every kernel it plugs in)", file=sys.stderr)


def kernel_order(rows, plan):
    """Plan kernels first (priority order), then any other tags in order of appearance."""
    planned = [k["name"] for k in plan["kernels"]] if plan else []
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    return [t for t in planned if t in tags] + [t for t in tags if t not in planned]


def summarize(rows, plan):
    """Per-kernel summary records and the projected model speedup (None without a plan)."""
    planned = {k["name"]: k for k in plan["kernels"]} if plan else {}
    names = kernel_order(rows, plan) + [n for n in planned if not night.rows_of(rows, n)]
    table = []
    for name in names:
        sub = night.rows_of(rows, name)
        ktype = sub[-1]["kernel_type"] if sub else planned[name]["kernel_type"]
        share = planned[name]["share"] if name in planned else None
        table.append(night.summary(name, ktype, sub, share))
    return table, (night.amdahl(night.projection(plan, rows)) if plan else None)


def plot(rows, plan, projection, out):
    import matplotlib
    matplotlib.use("Agg")  # no display on a GPU box or in CI
    import matplotlib.pyplot as plt

    names = kernel_order(rows, plan)
    ncols = 1 if len(names) == 1 else 2
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    numbered = list(enumerate(rows, start=1))
    for ax, name in zip(axes.flat, names):
        panel(ax, name, [(i, r) for i, r in numbered if r["tag"] == name])
    # One legend for the figure, with every marker kind that appears in any panel.
    handles = {}
    for ax in axes.flat[:len(names)]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
               fontsize=8, frameon=False)
    kept = sum(map(night.is_kept, rows))
    head = (f"AutoKernel: {len(rows)} experiments, {kept} kept; projected model speedup "
            f"{'n/a (no plan.json)' if projection is None else f'{projection:.2f}x'}")
    if not all(map(night.timing_ok, rows)):
        head += "\nCPU interpreter timings: not meaningful"
    fig.suptitle(head, fontsize=11)
    fig.tight_layout(rect=(0, 0.06 / nrows, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def panel(ax, name, numbered):
    """One kernel's experiments: (line number, row) pairs in file order."""
    from matplotlib.ticker import MaxNLocator

    sub = [r for _, r in numbered]
    ktype, unit = sub[-1]["kernel_type"], night.unit(sub[-1]["kernel_type"])
    x = [night.number(r, "experiment") for r in sub]
    x = [n if not math.isnan(v) else float(n) for (n, _), v in zip(numbered, x)]
    y = [night.throughput(r, ktype) for r in sub]

    def points(keep):
        return [xi for xi, r in zip(x, sub) if keep(r)], [yi for yi, r in zip(y, sub) if keep(r)]

    def reverted(r):
        return night.passed(r) and r["status"] == "revert"

    def judged(r):
        return night.passed(r) and r["status"] == "judged"

    ax.scatter(*points(night.is_kept), s=36, color="tab:green", zorder=3, label="kept")
    ax.scatter(*points(reverted), s=30, facecolors="none", edgecolors="tab:gray", zorder=2,
               label="reverted (not faster)")
    if any(map(judged, sub)):  # --quick / --no-git runs: measured, neither kept nor reverted
        ax.scatter(*points(judged), s=24, marker="^", color="tab:blue", alpha=0.6, zorder=2,
                   label="judged only")
    # Failed runs have no throughput: mark them along the bottom edge of the panel.
    failed = points(lambda r: not night.passed(r))[0]
    ax.scatter(failed, [0.02] * len(failed), marker="x", color="tab:red",
               transform=ax.get_xaxis_transform(), zorder=3, clip_on=False,
               label="FAIL / TIMEOUT / CRASH")
    best = running_best(y, [night.is_kept(r) for r in sub])
    if any(not math.isnan(b) for b in best):
        ax.step(x, best, where="post", color="tab:green", alpha=0.6, label="running best")
    s = night.kernel_stats(sub)
    bound = ak.KERNEL_TYPES[ktype].bound if ktype in ak.KERNEL_TYPES else "?"
    title = f"{name} ({ktype}, {bound}-bound)"
    if s["best"] is not None:
        title += f": best {night.throughput(s['best'], ktype):.4g} {unit}"
        title += f", {s['speedup']:.2f}x {s['speedup_basis']}"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(min(x) - 0.7, max(x) + 0.7)  # the failed markers are not autoscaled
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("experiment")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def running_best(values, kept):
    """The highest kept value so far at each point (NaN before the first keep)."""
    best, out = math.nan, []
    for value, keep in zip(values, kept):
        if keep and not math.isnan(value) and not value <= best:
            best = value
        out.append(best)
    return out


if __name__ == "__main__":
    sys.exit(run_main("analysis.py", main))
