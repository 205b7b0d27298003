"""The overnight run, end to end on a CPU, through the real CLIs: a scripted agent that uses only
commands program.md gives profiles a two-op model, extracts its kernels and works on both with a
switch between them: seven experiments on the first (slow, faster, slower, wrong, crashing,
torch doing the math, a forged results.tsv: the last two refused by the source check before they
run; syntax errors and hangs are tests/test_bench.py's CLI cases), then a baseline and a cached output on the second; then the morning: analysis and
verify. Checked: every attempt has its row, one commit per keep, the orchestrator's moves (by
reverts and speedup, and by time), each kernel's workspace file is its last kept version, verify
re-gated exactly those versions, and analysis prints results.tsv's numbers.

The "agent" runs `uv run X.py ...` as `sys.executable X.py ...`: the same interpreter and venv
(`uv run` inside the temp copy would build a second venv). The clock the orchestrator sees is
injected through AUTOKERNEL_NOW. Interpreter timings are noisy (and each run costs 5-20 s on two
cores), so every timed verdict is certain: the first kernel's first version is the starter with
a 0.1 s pause per call (~10x the call itself) at the timed shape and dtype (kept: the first
correct version), the "faster" edit removes the pause (kept), the "slower" one puts it back
(reverted). The pause is at that shape and dtype alone, so the five stages stay cheap.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import matplotlib.image

import autokernel as ak
from autokernel.results import read_rows

REPO = ak.ROOT
T0 = datetime(2025, 1, 1, 22, 0, tzinfo=timezone.utc)

# A model with two ops the gate judges quickly on a CPU: an RMSNorm (most of the time) and a
# last-dim sum. KernelBench's format: get_inputs() fixes the shape.
MODEL = '''"""Two ops: RMSNorm, then a sum over the last dim (the overnight test's model)."""
import torch
import torch.nn.functional as F


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(200) + 0.5)

    def forward(self, x):
        h = F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)
        return torch.sum(h, dim=-1)


def get_inputs():
    return [torch.randn(40, 200)]


def get_init_inputs():
    return []
'''


def wrapped(body, prelude=""):
    """kernel_fn replaced by one that runs `body` around the original (`_original`)."""
    return lambda k, s, starter: (prelude + s + "\n\n_original = kernel_fn\n\n\n"
                                  "def kernel_fn(*args, **kwargs):\n" + body)


PAUSED = wrapped("    first = (list(args) + list(kwargs.values()))[0]\n"
                 "    if tuple(first.shape) == tuple(BENCH_SHAPES[0]) and first.dtype == "
                 "torch.float32:\n"  # the timed shape and dtype
                 "        time.sleep(0.1)  # surely slower, whatever the interpreter's noise\n"
                 "    return _original(*args, **kwargs)\n", "import time\n")
WRONG_MATH = {"reduce": ("total = tl.sum(acc, axis=1)", "total = tl.max(acc, axis=1)"),
              "rmsnorm": ("rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)",
                          "rstd = 1.0 / tl.sqrt(tl.sum(x, axis=1) / N + eps)")}

EDITS = {  # name -> (description for -m, edit(kernel type, source, starter) -> source)
    "paused": ("first version: the starter, pausing at the timed shape", PAUSED),
    "faster": ("drop the pause", lambda k, s, starter: starter),
    "slower": ("add a pause back", PAUSED),
    "wrong": ("drop a term (wrong math)", lambda k, s, starter: s.replace(*WRONG_MATH[k])),
    "crash": ("abort", wrapped("    import os\n    os.abort()\n")),
    "torch": ("let torch do it", wrapped(
        "    from autokernel import reference\n"
        "    return getattr(reference, KERNEL_TYPE)(*args, **kwargs)\n")),
    "cached": ("cache the output", wrapped(
        "    if not _cache:\n        _cache.append(_original(*args, **kwargs))\n"
        "    return _cache[0]\n", "_cache = []\n")),
    "forge": ("forge a kept row", lambda k, s, starter: s + (
        "\nwith open('results.tsv', 'a') as _f:\n"
        "    _f.write('999\\tforged\\n')\n")),
}

# The two visits: (edit or None for the kernel as installed, correctness, status, a fragment of
# the reason or keep rule). program.md has the agent ask `next` after every full run; a `stay`
# changes nothing and each call costs a torch import, so the agent asks at the end of a visit.
FIRST_VISIT = [
    ("paused", "PASS", "keep", "first correct version"),
    ("faster", "PASS", "keep", "faster than the kept version"),
    # Reverted either as slower or, on a loaded CPU, as within the rounds' noise.
    ("slower", "PASS", "revert", "the kept version"),
    ("wrong", "FAIL", "revert", "smoke"),
    ("crash", "CRASH", "revert", "SIGABRT"),
    ("torch", "FAIL", "revert", "import autokernel.reference: the judge's own code"),  # source check
    ("forge", "FAIL", "revert", "open('results.tsv', 'a'): writing files"),
]
SECOND_VISIT = [
    (None, "PASS", "keep", "first correct version"),  # the baseline, as program.md says
    ("cached", "FAIL", "revert", "cached"),
]


def documented_commands():
    """Every `uv run ...` command program.md gives (inline code and code blocks)."""
    text = (REPO / "program.md").read_text()
    return [c.strip() for c in re.findall(r"(uv run [^`\n#|]+)", text)]


class Agent:
    def __init__(self, repo):
        self.repo, self.clock, self.log = repo, T0, []
        self.documented = documented_commands()
        self.program = (REPO / "program.md").read_text()

    def run(self, command, timeout=300):
        argv = shlex.split(command)
        assert argv[:2] == ["uv", "run"], command
        script, flags = argv[2], [a for a in argv[3:] if a.startswith("-")]
        assert any(c.split()[2] == script for c in self.documented), \
            f"program.md gives no `uv run {script}`"
        for flag in flags:
            assert flag in self.program, f"program.md never mentions {script} {flag}"
        # CPU mode even on a GPU box: the script's expectations are the interpreter's.
        env = {**os.environ, "AUTOKERNEL_NOW": self.clock.isoformat(), "CUDA_VISIBLE_DEVICES": ""}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, *argv[2:]], cwd=self.repo, env=env,
                              capture_output=True, text=True, timeout=timeout)
        self.log.append((command, proc.returncode, round(time.monotonic() - started, 1)))
        print(f"{self.log[-1][2]:6.1f}s rc={proc.returncode} {command}", flush=True)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "corrupt" not in proc.stderr, proc.stderr
        lines = [line for line in proc.stdout.splitlines() if ": " in line]
        return proc, dict(line.split(": ", 1) for line in lines)

    def ok(self, command):
        proc, out = self.run(command)
        assert proc.returncode == 0, f"{command}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        return proc, out

    def bench(self, description):
        proc, out = self.ok(f"uv run bench.py -m {shlex.quote(description)}")
        assert proc.stdout.splitlines()[-1].startswith("verdict: "), proc.stdout[-2000:]
        return out

    def next(self):
        return self.ok("uv run orchestrate.py next")[1]


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def make_repo(tmp_path):
    """A copy of the working tree (tracked and untracked-but-not-ignored files), committed on
    the night's branch, with the test's model beside it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file() and not name.startswith(("tests/", "scratch/")):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(src.read_bytes())
    (tmp_path / "night_model.py").write_text(MODEL)
    git(tmp_path, "init", "-q")
    git(tmp_path, "symbolic-ref", "HEAD", "refs/heads/autokernel/20250101-test")  # setup's branch
    git(tmp_path, "config", "user.email", "agent@example.com")
    git(tmp_path, "config", "user.name", "agent")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "harness")
    return tmp_path


def play_visit(agent, repo, kernel, starter, visit, number):
    """The experiments of `visit` on the kernel in kernel.py; returns the next number."""
    ktype = re.search(r'^KERNEL_TYPE = "(\w+)"', starter, re.M).group(1)
    for edit, correctness, status, reason in visit:
        source = (repo / "kernel.py").read_text()
        assert f"KERNEL_NAME = {kernel!r}" in source, f"experiment {number}: wrong kernel.py"
        description, change = EDITS[edit] if edit else (f"baseline: {kernel}", None)
        edited = change(ktype, source, starter) if change else source
        assert change is None or edited != source, f"experiment {number}: {edit} changed nothing"
        (repo / "kernel.py").write_text(edited)
        verdict = agent.bench(description)
        assert (verdict["correctness"], verdict["status"]) == (correctness, status), \
            f"experiment {number} ({edit}): {verdict}"
        assert reason in verdict.get("reason", "") + verdict.get("keep_rule", ""), verdict
        if status == "revert":
            assert (repo / "kernel.py").read_text() == source  # bench.py restored the best
        else:
            assert (repo / f"workspace/{kernel}.py").read_text() == edited  # file of record
        agent.clock += timedelta(minutes=5)
        number += 1
    return number


def test_overnight(tmp_path):
    repo = make_repo(tmp_path)
    agent = Agent(repo)
    agent.ok("uv run profile.py --model night_model.py")
    agent.ok("uv run extract.py --top 5")
    plan = json.loads((repo / "workspace/plan.json").read_text())
    names = [k["name"] for k in plan["kernels"]]
    assert sorted(k["kernel_type"] for k in plan["kernels"]) == ["reduce", "rmsnorm"]
    starters = {n: (repo / f"workspace/{n}.py").read_text() for n in names}

    out = agent.next()
    assert (out["action"], out["kernel"]) == ("switch", names[0])
    number = play_visit(agent, repo, names[0], starters[names[0]], FIRST_VISIT, 1)
    out = agent.next()
    assert (out["action"], out["kernel"]) == ("switch", names[1])
    assert "5 consecutive reverts" in out["reason"] and "this visit" in out["reason"]
    play_visit(agent, repo, names[1], starters[names[1]], SECOND_VISIT, number)
    agent.clock += timedelta(hours=2)  # the agent spent two more hours on the second kernel
    out = agent.next()  # every kernel visited: back to the first, from its best
    assert (out["action"], out["kernel"]) == ("switch", names[0]) and "revisit" in out["next"]
    assert "h on it" in out["reason"]
    assert (repo / "kernel.py").read_text() == starters[names[0]]

    # results.tsv: one row per attempt, as scripted
    rows = read_rows(repo / "results.tsv")  # refuses a file whose header is not bench.py's
    script = [(names[0], *step) for step in FIRST_VISIT] + \
        [(names[1], *step) for step in SECOND_VISIT]
    assert [int(r["experiment"]) for r in rows] == list(range(1, len(script) + 1))
    assert [(r["tag"], r["correctness"], r["status"]) for r in rows] == \
        [(n, c, s) for n, _, c, s, _ in script]
    assert all(r["description"].startswith(EDITS[e][0] if e else "baseline")
               for r, (_, e, *_) in zip(rows, script))

    # git: one commit per keep: "bench: keep" for an edit, the switch commit for a baseline
    # (it already holds the installed kernel); each holds that row's file
    kept = [r for r in rows if r["status"] == "keep"]
    subjects = dict(line.split(" ", 1) for line in
                    git(repo, "log", "--format=%h %s").splitlines())
    bench_commits = {h: s for h, s in subjects.items() if s.startswith("bench: keep")}
    assert len(bench_commits) == len(kept) - 1 == 2
    for r in kept:
        subject = next(s for h, s in subjects.items() if h.startswith(r["commit"])
                       or r["commit"].startswith(h))
        expected = f"orchestrate: switch to {r['tag']}" if r["description"].startswith(
            "baseline") else f"bench: keep {r['tag']} exp {r['experiment']}"
        assert subject.startswith(expected), (r["description"], subject)
    assert sum(s.startswith("orchestrate: switch to") for s in subjects.values()) == 3
    assert git(repo, "status", "--porcelain") == ""

    # each kernel's file of record is its last kept version: the starter, pause dropped
    last_kept = {n: [r for r in kept if r["tag"] == n][-1] for n in names}
    for n in names:
        assert (repo / f"workspace/{n}.py").read_text() == starters[n]
        assert git(repo, "show", f"{last_kept[n]['commit']}:kernel.py") == starters[n]

    # the morning
    check_analysis(agent, rows, names)
    proc, _ = agent.run("uv run verify.py --no-timing")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((repo / "workspace/verify.json").read_text())
    assert report["passed"]
    assert {k["name"]: k["status"] for k in report["kernels"]} == {n: "ok" for n in names}
    for n in names:
        entry = next(v for k, v in report["regate"].items() if k.endswith(f"workspace/{n}.py"))
        assert entry["passed"] and entry["version_ok"], entry
        assert f"experiment {last_kept[n]['experiment']}, commit {last_kept[n]['commit']}" \
            in entry["version"] and "older keep" not in entry["version"], entry
    print(f"{sum(s for _, _, s in agent.log):.0f} s in {len(agent.log)} commands")


def check_analysis(agent, rows, names):
    """analysis.py's table and --last agree with results.tsv, counted here independently."""
    proc, _ = agent.ok("uv run analysis.py")
    lines = proc.stdout.splitlines()
    header = lines[0].split()[:7]  # kernel type share runs kept failed best_us: one word each
    assert header == ["kernel", "type", "share", "runs", "kept", "failed", "best_us"], lines[0]
    for n in names:
        line = next(t for t in lines if t.split()[:1] == [n])
        printed = dict(zip(header, line.split()))
        mine = [r for r in rows if r["tag"] == n]
        kept = [float(r["latency_us"]) for r in mine if r["status"] == "keep"]
        first = next(float(r["latency_us"]) for r in mine if r["correctness"] == "PASS")
        assert int(printed["runs"]) == len(mine)
        assert int(printed["kept"]) == len(kept)
        assert int(printed["failed"]) == sum(r["correctness"] != "PASS" for r in mine)
        assert printed["best_us"] == f"{min(kept):.1f}"
        assert f" {first / min(kept):.2f}x starter" in line, line
    assert "projected model speedup" in proc.stdout
    image = matplotlib.image.imread(agent.repo / "progress.png")
    assert image.shape[0] > 200 and image.shape[1] > 800


def test_program_md_names_real_scripts_and_flags():
    """Every `uv run X.py` in program.md is a script in the repo; orchestrate's flags are real."""
    commands = documented_commands()
    scripts = {c.split()[2] for c in commands}
    assert {"bench.py", "orchestrate.py", "analysis.py", "extract.py"} <= scripts
    for script in scripts:
        assert (REPO / script).is_file(), f"program.md runs {script}, which does not exist"
    for c in commands:
        if c.split()[2] == "orchestrate.py":
            assert c.split()[3] in ("status", "next", "install", "rewrite"), c
