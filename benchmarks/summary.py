"""
The short tables the benchmarks/*.sh scripts print last, read from what the product's own
commands wrote: rows ready to paste into BENCHMARKS.md.

    python3 benchmarks/summary.py starters OUTDIR/starters_triton.json   # bench_starters.py's JSON
    python3 benchmarks/summary.py verify OUTDIR/verify_llama.json ...    # verify.py's reports
    python3 benchmarks/summary.py kernelbench OUTDIR/kernelbench_*.json  # kernelbench.py score's
    python3 benchmarks/summary.py gate OUTDIR/gate_speed.tsv             # gate_speed.sh's runs
    python3 benchmarks/summary.py profile OUTDIR/profile_*.json          # profile.py's, per model
    python3 benchmarks/summary.py regions OUTDIR/*/results.tsv           # any_model.sh's
    python3 benchmarks/summary.py generation OUTDIR/generate_b*.json     # verify.py --generate's

kernelbench merges its reports (a problem scored twice: the later file's row) and gives fast_p
over all of them, so the problems can be scored in several calls.
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def num(value, digits=1, suffix=""):
    return "-" if value is None else f"{value:,.{digits}f}{suffix}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def starters(path):
    report = json.loads(Path(path).read_text())
    meta, cuda = report["meta"], report["meta"].get("backend") == "cuda"
    print(f"starters ({meta.get('backend', 'triton')}) on {meta['gpu']}, {meta['timestamp']}, "
          f"torch.compile mode {meta['compile_mode']}; us, ratios = baseline / starter")
    header = ["kernel", "shape", "dtype", "starter"] + (["Triton"] if cuda else []) + \
        ["eager", "compile", "library", "vs eager", "vs compile", "vs library", "status"]
    rows = []
    for r in report["rows"]:
        library = "-" if r["library_us"] is None else f"{num(r['library_us'])} ({r['library']})"
        rows.append([r["kernel"], r["shape_str"], r["dtype"], num(r["starter_us"])]
                    + ([num(r["triton_us"])] if cuda else [])
                    + [num(r["eager_us"]), num(r["compile_us"]), library,
                       num(r["x_eager"], 2, "x"), num(r["x_compile"], 2, "x"),
                       num(r["x_library"], 2, "x"), r["status"]])
    print(table(header, rows))


def verify(paths):
    rows = []
    for path in paths:
        if not Path(path).is_file():
            name = Path(path).parent.name if Path(path).stem == "verify" else Path(path).stem
            rows.append([name, "no report (verify.py stopped: see its log)"] + [""] * 6)
            continue
        v = json.loads(Path(path).read_text())
        t, paired = v.get("timing") or {}, (v.get("timing") or {}).get("paired") or {}
        ratios = paired.get("ratios") or []
        rows.append([v["model"], v["device"], "PASS" if v["passed"] else "FAIL",
                     num(t.get("eager_ms"), 3), num(t.get("compile_ms"), 3),
                     f"{v.get('best_variant')} {num(v.get('best_ms'), 3)}",
                     f"{num(paired.get('best_ms'), 3)} / {num(paired.get('compile_ms'), 3)}, "
                     f"{num(paired.get('ratio'), 3, 'x')}",
                     f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"])
    print("end to end (ms a forward; paired: the best variant / torch.compile in interleaved "
          "rounds, the median of the rounds' ratios)")
    print(table(["model", "device", "logits", "eager", "torch.compile", "best variant, one-shot",
                 "paired", "rounds"], rows))


def kernelbench(paths):
    sys.path.insert(0, str(ROOT))
    from autokernel.kernelbench_score import fast_p, natural  # the scorer's own definitions
    by_name, devices = {}, set()
    for path in paths:
        report = json.loads(Path(path).read_text())
        devices.add(f"{report['device']}, {report['dtype']}")
        by_name.update({row["name"]: row for row in report["problems"]})
    rows = [row for _, row in sorted(by_name.items(), key=lambda kv: natural(Path(kv[0])))]
    print(f"KernelBench: {len(rows)} problems from {len(paths)} report(s) on "
          f"{'; '.join(sorted(devices))}")
    print(table(["problem", "verdict", "us", "eager us", "compile us", "vs eager", "vs compile"],
                [[r["name"], r["verdict"], num(r["latency_us"]), num(r["eager_us"]),
                  num(r["compile_us"]), num(r["speedup_vs_eager"], 2, "x"),
                  num(r["speedup_vs_compile"], 2, "x")] for r in rows]))
    print()
    print(table(["baseline", "fast_0", "fast_1", "fast_1.5", "fast_2"],
                [[base] + [num(share, 2) for share in fast_p(rows, key).values()]
                 for base, key in (("eager", "eager"), ("torch.compile", "compile"))]))


def last_value(text, key):
    """The value of bench.py's last `key: value` line, or "-"."""
    return (re.findall(rf"^{key}: (.*)$", text, re.M) or ["-"])[-1]


def gate(path):
    runs = []
    for line in Path(path).read_text().splitlines()[1:]:
        run, seconds, log = line.split("\t")
        text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
        runs.append([run, seconds] + [last_value(text, key) for key in
                                      ("wall_s", "status", "latency_us")])
    print("the gate's speed: one bench.py verdict each (seconds: the whole command, from the "
          "shell; wall_s: bench.py's own)")
    print(table(["run", "seconds", "wall_s", "status", "latency_us"], runs))
    paired = [float(r[1]) for r in runs[1:]]
    if paired:
        print(f"\nfirst verdict {runs[0][1]} s; paired verdicts median "
              f"{statistics.median(paired):.1f} s ({min(paired):.1f}-{max(paired):.1f}, "
              f"{len(paired)} runs)")


def profiles(paths):
    """Per model: the share of its op time in the kernel types, in regions, and in neither."""
    rows = []
    for path in paths:
        name = Path(path).parent.name if Path(path).stem == "profile" else \
            Path(path).stem.removeprefix("profile_")
        if not Path(path).is_file():
            rows.append([name, "no report (see its log)"]
                        + ["-"] * 5)
            continue
        p = json.loads(Path(path).read_text())
        entries = p["entries"]
        typed = 100 * sum(e["share"] for e in entries if e["kernel_type"])
        regions = [e for e in entries if e["group"] == "region"]
        top = regions[0] if regions else None
        rows.append([name, p["dtype"], num(typed),
                     num(p.get("region_pct")), num(100 - typed - (p.get("region_pct") or 0)),
                     len(regions), f"{top['name']} {100 * top['share']:.1f}%: "
                     f"{' '.join(top['region']['ops'][:5])}" if top else "-"])
    print("share of op time (%): in the kernel types, in regions, in neither")
    print(table(["model", "dtype", "types", "regions", "neither", "regions (distinct)",
                 "top region"], rows))


def regions(paths):
    """Per region kernel bench.py judged (any_model.sh): its verdict and its time beside
    eager and torch.compile of the same region."""
    import csv
    rows = []
    for path in paths:
        if not Path(path).is_file():
            rows.append([Path(path).parent.name, "no rows (see its logs)"] + ["-"] * 5)
            continue
        with open(path) as f:
            for r in csv.DictReader(f, delimiter="\t"):
                speed = r.get("speedup_vs_compile") or ""
                rows.append([Path(path).parent.name, r["tag"], r["correctness"],
                             r["latency_us"], r["speedup_vs_pytorch"] or "-", speed or "-",
                             (r.get("reason") or "")[:80]])
    print("region starters (bench.py): latency us, speedups = baseline / starter")
    print(table(["model", "kernel", "correctness", "latency_us", "vs eager", "vs compile",
                 "reason"], rows))
    cover = []  # what extract.py wrote, from the plan beside each results file
    for path in paths:
        plan_path = Path(path).parent / "plan.json"
        if plan_path.is_file():
            kernels = json.loads(plan_path.read_text())["kernels"]
            share = lambda kind: 100 * sum(k["share"] for k in kernels  # noqa: E731
                                           if (k["kernel_type"] == "region") == (kind == "r"))
            cover.append([Path(path).parent.name, len(kernels), num(share("t")),
                          num(share("r")), num(share("t") + share("r"))])
    print("share of op time (%) in the kernel files extract.py wrote (--top)")
    print(table(["model", "kernels", "types", "regions", "total"], cover))


def generation(paths):
    rows = []
    for path in paths:
        if not Path(path).is_file():
            rows.append([Path(path).stem, "no report (verify.py stopped: see its log)"] + [""] * 7)
            continue
        g = json.loads(Path(path).read_text())
        v, w = g["variants"], g["workload"]

        def rate(name):
            e = v.get(name) or {}
            if not e:
                return "-"
            if not e["correctness"]["passed"]:
                return "FAIL"
            return f"{num(e['tokens_per_s'], 0)} ({num(e['roofline_pct'], 0, '%')})"
        rows.append([f"b{w['batch']} {w['prompt']}+{w['new']}", g["device"],
                     "PASS" if g["passed"] else "FAIL", num(g["roofline_tokens_per_s"], 0)]
                    + [rate(n) for n in ("eager", "eager, CUDA graph",
                                         g.get("compile_variant") or "torch.compile",
                                         "kernels", "torch.compile + kernels")]
                    + [num(g.get("best_speedup_vs_compile"), 3, "x")])
    print("generation (tokens/s over the decode steps, and the share of the bandwidth roofline)")
    print(table(["workload", "device", "logits", "roofline", "eager", "eager graph",
                 "torch.compile (faster)", "kernels", "compile+kernels", "best/compile"], rows))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("what", choices=("starters", "verify", "kernelbench", "gate", "profile",
                                         "regions", "generation"))
    parser.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.what in ("starters", "gate") and len(args.files) != 1:
        parser.error(f"{args.what} reads one file")
    missing = [f for f in args.files if not Path(f).is_file()]
    if missing and args.what not in ("verify", "profile", "regions", "generation"):
        print(f"summary.py: {', '.join(missing)} not found: the benchmark wrote no report "
              f"(see its log)", file=sys.stderr)
        return 1
    {"starters": lambda: starters(args.files[0]), "verify": lambda: verify(args.files),
     "kernelbench": lambda: kernelbench(args.files), "gate": lambda: gate(args.files[0]),
     "profile": lambda: profiles(args.files), "regions": lambda: regions(args.files),
     "generation": lambda: generation(args.files)}[
        args.what]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
