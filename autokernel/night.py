"""
What the night adds up to: per-kernel statistics and the Amdahl projection from results.tsv.
orchestrate.py decides with them; analysis.py prints and draws them.

Rows are results.tsv's rows as autokernel.results.read_rows returns them (dicts of strings, in
file order). Latencies compare only within one setting (tag, shape, dtype, device), so a
kernel's best and speedup are taken at its latest setting: the one of its last PASS row.
Plain Python, no pandas: `orchestrate.py next` runs after every experiment and stays quick.
"""
import math

import autokernel as ak
from autokernel.results import kept_rows, setting


def number(row, column) -> float:
    """A numeric cell as a float, NaN when empty or not a number."""
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        return math.nan


def passed(row) -> bool:
    return row["correctness"] == "PASS"


def is_kept(row) -> bool:
    return row["status"] == "keep" and passed(row)


def timing_ok(row) -> bool:
    """False for rows timed where timings mean nothing (the CPU interpreter)."""
    return str(row["timing_valid"]).lower() != "false"


def rows_of(rows, tag) -> list:
    return [r for r in rows if r["tag"] == tag]


# ---- throughput -----------------------------------------------------------------------------

def unit(kernel_type) -> str:
    """GB/s for memory-bound kernel types, TFLOP/s for compute-bound ones."""
    ktype = ak.KERNEL_TYPES.get(kernel_type)
    return "GB/s" if ktype is not None and ktype.bound == "memory" else "TFLOP/s"


def throughput(row, kernel_type) -> float:
    """The row's throughput in unit(kernel_type), from latency_us and the type's byte or FLOP
    count at the row's shape and dtype: bench.py rounds its columns, which leaves interpreter
    timings at 0.00. A row without a usable shape keeps its recorded column."""
    memory = unit(kernel_type) == "GB/s"
    latency = number(row, "latency_us")
    try:
        ktype = ak.KERNEL_TYPES[kernel_type]
        shape = tuple(int(d) for d in str(row["shape"]).split("x"))
        # bytes / us / 1e3 = GB/s; FLOPs / us / 1e6 = TFLOP/s
        work = ktype.bytes(shape, ak.DTYPES[row["dtype"]]) / 1e3 if memory \
            else ktype.flops(shape) / 1e6
        return work / latency if latency > 0 else math.nan
    except (AttributeError, KeyError, ValueError, TypeError, IndexError):
        return number(row, "bandwidth_gb_s" if memory else "throughput_tflops")


# ---- one kernel -----------------------------------------------------------------------------

def latest_setting(rows):
    """The setting of the last PASS row (a row that failed before the file parsed has no
    shape), or None."""
    last = next((r for r in reversed(rows) if passed(r)), None)
    return None if last is None else setting(last)


def kernel_stats(rows, like=None) -> dict:
    """One kernel's rows summed up at the setting `like` (default: its latest). speedup_basis
    says what the speedup is against: 'eager' (speedup_vs_pytorch, valid timing), 'starter'
    (the setting's first PASS row) or '-' (nothing kept)."""
    key = latest_setting(rows) if like is None else like
    timed = [r for r in rows if passed(r) and setting(r) == key and number(r, "latency_us") > 0]
    kept = [r for r in kept_rows(rows, key) if number(r, "latency_us") > 0]
    eager = [r for r in timed if timing_ok(r) and number(r, "speedup_vs_pytorch") > 0]
    stats = {"runs": len(rows), "kept": sum(map(is_kept, rows)),
             "failed": sum(not passed(r) for r in rows), "best": None, "best_us": math.nan,
             "baseline_us": number(timed[0], "latency_us") if timed else math.nan,
             "eager_us": math.nan, "pct_peak": math.nan, "speedup": 1.0, "speedup_basis": "-"}
    if eager:
        stats["eager_us"] = number(eager[-1], "latency_us") * number(eager[-1],
                                                                     "speedup_vs_pytorch")
    if kept:
        best = min(kept, key=lambda r: number(r, "latency_us"))
        stats.update(best=best, best_us=number(best, "latency_us"),
                     pct_peak=number(best, "pct_peak"))
        basis = "eager" if not math.isnan(stats["eager_us"]) else "starter"
        against = stats["eager_us"] if basis == "eager" else stats["baseline_us"]
        stats.update(speedup=against / stats["best_us"], speedup_basis=basis)
    return stats


def summary(name, kernel_type, rows, share=None) -> dict:
    """One line of a per-kernel table (strings, '-' where there is nothing to show)."""
    s = kernel_stats(rows)
    best = s["best"]
    tp = math.nan if best is None else throughput(best, kernel_type)
    return {
        "kernel": name, "type": kernel_type,
        "share": "-" if share is None else f"{100 * share:.1f}%",
        "runs": s["runs"], "kept": s["kept"], "failed": s["failed"],
        "best_us": "-" if best is None else f"{s['best_us']:.1f}",
        "throughput": "-" if math.isnan(tp) else f"{tp:.4g} {unit(kernel_type)}",
        "peak": "-" if math.isnan(s["pct_peak"]) else f"{s['pct_peak']:.0f}%",
        "speedup": "-" if best is None else f"{s['speedup']:.2f}x {s['speedup_basis']}",
    }


def unplaced_keeps(plan, rows) -> list:
    """One line for each kept row on this branch (its commit an ancestor of HEAD) whose tag no
    kernel of the plan has: a keep verify.py and export.py cannot place (kernel.py judged under
    another name), so it is neither verified nor exported nor counted for a plan kernel."""
    from autokernel import git
    names = {k["name"] for k in plan["kernels"]}
    return [f"unplaced keep: experiment {r['experiment']}, tag {r['tag'] or '(none)'}, commit "
            f"{r['commit']}: no kernel of plan.json is named {r['tag']!r}, so it is neither "
            f"verified nor exported (its code: git show {r['commit']}:kernel.py)"
            for r in rows if is_kept(r) and r["tag"] not in names and git.on_branch(r["commit"])]


# ---- the whole model ------------------------------------------------------------------------

def amdahl(shares_and_speedups) -> float:
    """Whole-model speedup when kernel i (share_i of model time) runs s_i times faster."""
    covered = sum(share for share, _ in shares_and_speedups)
    remaining = 1.0 - covered + sum(share / max(s, 1e-12) for share, s in shares_and_speedups)
    return 1.0 / remaining if remaining > 0 else math.inf


def projection(plan, rows) -> list:
    """(share, best speedup) for each plan kernel: what amdahl() projects from."""
    return [(k["share"], kernel_stats(rows_of(rows, k["name"]))["speedup"])
            for k in plan["kernels"]]


def projection_line(plan, rows) -> str:
    """The night's projection as orchestrate.py and analysis.py both print it."""
    pairs = projection(plan, rows)
    covered = sum(share for share, _ in pairs)
    ceiling = amdahl([(share, math.inf) for share, _ in pairs])
    return (f"projected model speedup: {amdahl(pairs):.3f}x with each kernel at its best kept "
            f"speed (Amdahl's law over the {100 * covered:.1f}% of model time they cover; at "
            f"most {ceiling:.2f}x were they free)")


def table(records, left=()) -> str:
    """A list of dicts as an aligned text table, one line per dict: values right-aligned, except
    the columns named in `left` (free text such as descriptions)."""
    if not records:
        return ""
    columns = list(records[0])
    cells = [[str(c) for c in columns]] + [[str(r[c]) for c in columns] for r in records]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(" ".join(v.ljust(w) if c in left else v.rjust(w)
                              for c, v, w in zip(columns, line, widths)).rstrip()
                     for line in cells)
