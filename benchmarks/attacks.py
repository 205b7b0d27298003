"""
The attack kernels against the gate, as a night meets them: in a scratch git copy of this tree a
starter is kept, then each attack file becomes kernel.py and `bench.py -m ...` judges it, and
after every run the night is checked from outside: no attack kept, no row forged or lost, the
branch where it was, no tracked file changed, nothing written in a stand-in $HOME or
site-packages, no process left behind. On a GPU machine or a CPU (Triton's interpreter).

    python3 benchmarks/attacks.py OUTDIR                  # every defence on (the product)
    python3 benchmarks/attacks.py OUTDIR --modes all      # also each line of defence alone
    python3 benchmarks/attacks.py OUTDIR --modes all --only kills_the_judge,guard_off

Modes (each in a repo of its own):
    product   the judge as shipped: source check, sandbox, snapshot, crash record
    sandbox   the source check off (its RULES emptied in the copy): the sandbox meets the attacks
    record    the source check and the sandbox off (AUTOKERNEL_SANDBOX=off): the crash record
              meets the attacks that kill the judge; after each, an honest kernel.py is judged

Writes OUTDIR/attacks.tsv (one row per run and mode) and OUTDIR/attacks_<mode>_<name>.log, and
prints the table last. Exit 1 when any check fails.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from autokernel.results import read_rows  # noqa: E402  (results.tsv's one reader)

ATTACKS = sorted((ROOT / "tests" / "attacks").glob("*.py"))
TORCH_MATH = [ROOT / "tests" / "planted" / f"{n}.py"
              for n in ("guard_off", "torch_softmax", "torch_matmul")]
# What each mode runs: the sandbox and the record alone only meet what acts outside the
# kernel's own process (writes, signals, processes); the rest is the judge's in-process work.
OUTSIDE = ["kills_the_judge", "forges_crash_record", "writes_outside_the_repo", "wipes_results",
           "moves_branch", "edits_every_file", "plants_modules", "leaves_a_process",
           "slows_kept_version"]
MODES = {"product": [p.stem for p in ATTACKS + TORCH_MATH], "sandbox": OUTSIDE,
         "record": ["kills_the_judge", "forges_crash_record"]}
KEYS = ["mode", "attack", "checks", "verdict", "sandbox"]
ATTACK_SHAPES = [(4, 256)]  # the setting the attack files are written at (reduce)
GIT_ENV = {"GIT_AUTHOR_NAME": "attacks", "GIT_AUTHOR_EMAIL": "attacks@localhost",
           "GIT_COMMITTER_NAME": "attacks", "GIT_COMMITTER_EMAIL": "attacks@localhost"}


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def make_night(root, mode, starter):
    """A scratch git copy of the harness with `starter` as kernel.py at the attacks' setting
    (reduce 4x256), so that every attack is judged beside the kept version, as in a night whose
    plan fixes the shapes, rather than kept as the first version of a setting of its own."""
    repo = root / mode
    ignore = shutil.ignore_patterns(".git", ".venv", "workspace", "results.tsv", "__pycache__",
                                    ".device", "shared", "dist", "*.whl", ".old")
    shutil.copytree(ROOT, repo, ignore=ignore)
    (repo / "kernel.py").write_text(starter.read_text() + f"\nBENCH_SHAPES = {ATTACK_SHAPES}\n")
    if mode != "product":  # the source check's rule table emptied: the check passes everything
        with open(repo / "autokernel" / "source_check.py", "a") as f:
            f.write("\nRULES = []\n")
    git(repo, "init", "-q", "-b", "night")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"attacks: {starter.name} as kernel.py")
    return repo


def bench(repo, env, description, log):
    run = subprocess.run([sys.executable, "bench.py", "-m", description], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=900)
    log.write_text(run.stdout + run.stderr)
    lines = run.stdout.splitlines()
    pick = lambda key: next((ln.split(": ", 1)[1] for ln in lines if ln.startswith(key + ": ")),
                            "")
    return {"rc": run.returncode, "verdict": pick("verdict") or f"no verdict (rc {run.returncode})",
            "sandbox": pick("sandbox")}


def processes_in(root):
    """Processes whose working directory is under `root` (a kernel's child and whatever it
    started run in the night's repo)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(proc.joinpath("cwd").resolve()).startswith(str(root)):
                found.append(proc.name)
        except OSError:  # gone, or not ours to read
            pass
    return found


def night_state(repo, outside):
    rows = read_rows(repo / "results.tsv")
    return {"head": git(repo, "rev-parse", "HEAD"), "branch": git(repo, "branch", "--show-current"),
            "dirty": git(repo, "status", "--porcelain", "--untracked-files=no"),
            "rows": rows, "outside": sorted(str(p) for d in outside for p in d.rglob("*"))}


def judge_attack(repo, mode, path, env, outside, outdir):
    """One attack as kernel.py, then (mode "record") an honest run; the checks from outside."""
    before = night_state(repo, outside)
    shutil.copy(path, repo / "kernel.py")
    run = bench(repo, env, f"attack {path.stem}", outdir / f"attacks_{mode}_{path.stem}.log")
    new_rows = 1
    if mode == "record":  # the next, honest run (the kept version again) finds the record
        git(repo, "checkout", "-q", "HEAD", "--", "kernel.py")
        honest = bench(repo, env, "honest after a killed judge",
                       outdir / f"attacks_{mode}_{path.stem}_honest.log")
        run["verdict"] += f" / next run: {honest['verdict']}"
        git(repo, "checkout", "-q", "HEAD", "--", "kernel.py")
        new_rows = 2
    after = night_state(repo, outside)
    added = after["rows"][len(before["rows"]):]
    problems = []
    if after["rows"][:len(before["rows"])] != before["rows"]:
        problems.append("earlier rows changed")
    if len(added) != new_rows:
        problems.append(f"{len(added)} rows added, {new_rows} expected")
    attack_rows = added[:1] if mode == "record" else added  # "record": then an honest run
    if any(row["status"] == "keep" for row in attack_rows):
        problems.append("an attack row kept")
    if after["head"] != before["head"] and mode != "record":
        problems.append("HEAD moved")
    if after["branch"] != before["branch"]:
        problems.append("branch changed")
    if after["dirty"]:
        problems.append(f"tracked files changed: {after['dirty'].splitlines()[0]}")
    if after["outside"] != before["outside"]:
        problems.append("files written outside the repo")
    alive = processes_in(repo)
    if alive:
        problems.append(f"{len(alive)} processes left")
        for pid in alive:
            os.kill(int(pid), signal.SIGKILL)
    return {"mode": mode, "attack": path.stem, "verdict": run["verdict"], "sandbox": run["sandbox"],
            "checks": "; ".join(problems) or "ok"}


def main(argv=None):
    p = argparse.ArgumentParser(description="The attack kernels against a scratch night.")
    p.add_argument("outdir", type=Path)
    p.add_argument("--modes", default="product",
                   help=f"comma-separated of {', '.join(MODES)}, or all (default product)")
    p.add_argument("--starter", type=Path, default=ROOT / "kernels" / "reduce.py",
                   help="the reduce kernel kept before the attacks, at their setting "
                        "(default kernels/reduce.py)")
    p.add_argument("--only", help="comma-separated attack names: run just these (of each mode's)")
    args = p.parse_args(argv)
    if args.only:
        for mode in MODES:
            MODES[mode] = [n for n in MODES[mode] if n in args.only.split(",")]
    modes = list(MODES) if args.modes == "all" else args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode {unknown[0]}: use {', '.join(MODES)} or all")
    args.outdir.mkdir(parents=True, exist_ok=True)
    tsv = args.outdir / "attacks.tsv"  # written as the runs go: a run cut short keeps its rows
    tsv.write_text("\t".join(KEYS) + "\n")
    results = []
    with tempfile.TemporaryDirectory(prefix="autokernel_attacks_") as scratch:
        scratch = Path(scratch)
        for mode in modes:
            repo = make_night(scratch, mode, args.starter)
            home, site = scratch / f"home_{mode}", scratch / f"site_{mode}"
            home.mkdir()
            site.mkdir()
            env = dict(os.environ, **GIT_ENV, HOME=str(home), AUTOKERNEL_TEST_SITE=str(site))
            if mode == "record":
                env["AUTOKERNEL_SANDBOX"] = "off"
            kept = bench(repo, env, "the kept version", args.outdir / f"attacks_{mode}_kept.log")
            print(f"[{mode}] kept version: {kept['verdict']}", flush=True)
            files = {p.stem: p for p in ATTACKS + TORCH_MATH}
            for i, name in enumerate(MODES[mode], start=1):
                row = judge_attack(repo, mode, files[name], env, (home, site), args.outdir)
                results.append(row)
                with open(tsv, "a") as f:
                    f.write("\t".join(row[k].replace("\t", " ") for k in KEYS) + "\n")
                print(f"[{mode} {i}/{len(MODES[mode])}] {name}: {row['checks']} | "
                      f"{row['verdict'][:150]}", flush=True)
    print("\n| mode | attack | checks | verdict |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['attack']} | {r['checks']} | {r['verdict'][:110]} |")
    if results:
        print(f"\nsandbox: {results[0]['sandbox']}")
    failed = [r for r in results if r["checks"] != "ok"]
    print(f"{len(results) - len(failed)} of {len(results)} runs left the night intact")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
