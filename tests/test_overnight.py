"""The overnight run, end to end on a CPU: a scripted agent plays 20 experiments on two kernels
through the real CLIs, using only commands that program.md gives, then we check results.tsv, the
git log (one commit per kept experiment), the orchestrator moving on by its rules, and
progress.png.

The "agent" runs `uv run X.py ...` as `sys.executable X.py ...`: the same interpreter and venv
(`uv run` inside the temp copy would build a second venv). The clock the orchestrator sees is
injected through AUTOKERNEL_NOW. Interpreter timings are noisy, so good edits are ~5x faster
(several rows per program instead of one program per row: the interpreter pays per program),
slower edits launch the kernel twice, and every bench run uses a generous --margin.
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
import pandas as pd

import autokernel as ak

REPO = ak.ROOT
T0 = datetime(2025, 1, 1, 22, 0, tzinfo=timezone.utc)
MARGIN = "0.3"

REDUCE = '''"""Sum over the last dim, ROWS rows per program (the overnight test's reduce kernel)."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"
ROWS = 4  # rows per program: a power of two


@triton.jit
def sum_rows(x_ptr, y_ptr, M, N, stride, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    safe_rows = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M re-read the last one
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        mask = (start + cols[None, :]) < N
        x = tl.load(x_ptr + safe_rows[:, None] * stride + start + cols[None, :], mask=mask,
                    other=0.0)
        acc += x.to(tl.float32)
    total = tl.sum(acc, axis=1)
    tl.store(y_ptr + rows, total.to(y_ptr.dtype.element_ty), mask=rows < M)


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    block_n = min(triton.next_power_of_2(N), 2048)
    sum_rows[(triton.cdiv(M, ROWS),)](x, y, M, N, x.stride(0), ROWS=ROWS, BLOCK_N=block_n)
    return y
'''

SOFTMAX = '''"""Softmax over the last dim, ROWS whole rows per program (the overnight test's softmax)."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"
ROWS = 4  # rows per program: a power of two


@triton.jit
def softmax_rows(x_ptr, y_ptr, M, N, stride_x, stride_y, ROWS: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    safe_rows = tl.minimum(rows, M - 1).to(tl.int64)  # rows past M re-read the last one
    cols = tl.arange(0, BLOCK_N)
    mask = cols[None, :] < N
    x = tl.load(x_ptr + safe_rows[:, None] * stride_x + cols[None, :], mask=mask,
                other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(z)
    y = e / tl.sum(e, axis=1)[:, None]
    out = y_ptr + safe_rows[:, None] * stride_y + cols[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask & (rows[:, None] < M))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty_like(x)
    block_n = triton.next_power_of_2(N)
    rows = max(1, min(ROWS, 16384 // block_n))  # a tile stays under Triton's numel limit
    softmax_rows[(triton.cdiv(M, rows),)](x, y, M, N, x.stride(0), y.stride(0), ROWS=rows,
                                          BLOCK_N=block_n)
    return y
'''

# What extract.py would append: the model's shapes and the name results.tsv tags rows with.
KERNELS = {"reduce_1": REDUCE, "softmax_1": SOFTMAX}
SHARES = {"reduce_1": 0.30, "softmax_1": 0.20}


def extracted(name, source):
    return source + f'\nKERNEL_NAME = "{name}"\nBENCH_SHAPES = [(64, 256)]\nBENCH_DTYPE = "fp16"\n'


def slower(src):
    """A redundant second launch: the same result in twice the time."""
    src = src.replace("def kernel_fn(x):", "def kernel_fn_once(x):")
    return src + ("\n\ndef kernel_fn(x):\n    for _ in range(2):\n"
                  "        y = kernel_fn_once(x)\n    return y\n")


WRONG_MATH = {"reduce_1": ("total = tl.sum(acc, axis=1)", "total = tl.max(acc, axis=1)"),
              "softmax_1": ("y = e / tl.sum(e, axis=1)[:, None]", "y = e")}
TORCH_OP = {"reduce_1": "return x.sum(dim=-1)", "softmax_1": "return torch.softmax(x, dim=-1)"}

EDITS = {  # name -> (description for -m, edit(kernel name, source) -> source)
    "good": ("32 rows per program: fewer programs",
             lambda k, s: re.sub(r"^ROWS = \d+", "ROWS = 32", s, count=1, flags=re.M)),
    "wrong": ("drop a term (wrong math)", lambda k, s: s.replace(*WRONG_MATH[k])),
    "syntax": ("typo", lambda k, s: s.replace("def kernel_fn(x):", "def kernel_fn(x:")),
    "slower": ("launch twice", lambda k, s: slower(s)),
    "hang": ("spin", lambda k, s: s.replace("def kernel_fn(x):",
                                            "def kernel_fn(x):\n    while True:\n        pass")),
    "torch": ("let torch do it", lambda k, s: s.replace(
        "def kernel_fn(x):", f"def kernel_fn(x):\n    {TORCH_OP[k]}")),
}

# (kernel in kernel.py, edit or None for the baseline, correctness, status, what `next` says).
# program.md has the agent ask `next` after every run; a `stay` changes nothing, and each call
# costs a torch import (~4 s of CPU), so the test asks where a rule is about to fire or fires
# (None: not asked).
SCRIPT = [
    ("reduce_1", None, "PASS", "keep", None),                # visit 1: first in plan order
    ("reduce_1", "wrong", "FAIL", "revert", None),
    ("reduce_1", "syntax", "FAIL", "revert", None),
    ("reduce_1", "slower", "PASS", "revert", None),
    ("reduce_1", "hang", "TIMEOUT", "revert", "stay"),       # 4 consecutive reverts
    ("reduce_1", "torch", "FAIL", "revert", "switch"),       # 5 consecutive reverts
    ("softmax_1", None, "PASS", "keep", None),               # visit 2
    ("softmax_1", "wrong", "FAIL", "revert", None),
    ("softmax_1", "slower", "PASS", "revert", "stay"),
    ("softmax_1", "good", "PASS", "keep", "switch"),         # 2x this visit
    ("reduce_1", "slower", "PASS", "revert", None),          # visit 3: revisit
    ("reduce_1", "good", "PASS", "keep", "switch"),          # 2x over the visit's start
    ("softmax_1", "wrong", "FAIL", "revert", None),          # visit 4
    ("softmax_1", "syntax", "FAIL", "revert", "switch"),     # 2 h on it (the clock jumps)
    ("reduce_1", "wrong", "FAIL", "revert", None),           # visit 5
    ("reduce_1", "syntax", "FAIL", "revert", None),
    ("reduce_1", "torch", "FAIL", "revert", None),
    ("reduce_1", "wrong", "FAIL", "revert", "stay"),         # 4 consecutive reverts
    ("reduce_1", "syntax", "FAIL", "revert", "switch"),      # 5 consecutive reverts
    ("softmax_1", "wrong", "FAIL", "revert", None),          # visit 6
]
CLOCK_JUMP_AT = 14  # experiment after which the agent "spent" two more hours


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
        uses = [c for c in self.documented if c.split()[2] == script]
        assert uses, f"program.md gives no `uv run {script}`"
        for flag in flags:
            assert f"`{flag}" in self.program or any(flag in c.split() for c in uses), \
                f"program.md never mentions {script} {flag}"
        # CPU mode even on a GPU box: the script's expectations are the interpreter's.
        env = {**os.environ, "AUTOKERNEL_NOW": self.clock.isoformat(), "CUDA_VISIBLE_DEVICES": ""}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, *argv[2:]], cwd=self.repo, env=env,
                              capture_output=True, text=True, timeout=timeout)
        self.log.append((command, proc.returncode, round(time.monotonic() - started, 1)))
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        lines = [line for line in proc.stdout.splitlines() if ": " in line]
        return proc, dict(line.split(": ", 1) for line in lines)

    def bench(self, description, *extra):
        proc, out = self.run(f"uv run bench.py --margin {MARGIN} {' '.join(extra)} "
                             f"-m {shlex.quote(description)}")
        assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("verdict: "), \
            proc.stdout[-2000:] + proc.stderr[-2000:]
        return out

    def next(self):
        proc, out = self.run("uv run orchestrate.py next")
        assert proc.returncode == 0, proc.stderr
        return out


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def make_repo(tmp_path):
    """A copy of the working tree (tracked and untracked-but-not-ignored files), committed."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        src = REPO / name
        if src.is_file() and not name.startswith(("tests/", "scratch/")):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(src.read_bytes())
    git(tmp_path, "init", "-q")
    git(tmp_path, "symbolic-ref", "HEAD", "refs/heads/autokernel/20250101-test")  # setup's branch
    git(tmp_path, "config", "user.email", "agent@example.com")
    git(tmp_path, "config", "user.name", "agent")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "harness")
    # What profile.py + extract.py would leave: starters with the model's shapes, and the plan.
    (tmp_path / "workspace").mkdir(exist_ok=True)
    plan = {"model": "test", "created": T0.isoformat(), "kernels": []}
    for name, source in KERNELS.items():
        (tmp_path / f"workspace/{name}.py").write_text(extracted(name, source))
        kernel_type = name.split("_")[0]
        plan["kernels"].append({
            "name": name, "kernel_type": kernel_type, "file": f"workspace/{name}.py",
            "shapes": [[64, 256]], "dtype": "fp16", "share": SHARES[name], "time_us": 100.0,
            "amdahl_ceiling": 1 / (1 - SHARES[name]), "bound": "memory"})
    (tmp_path / "workspace/plan.json").write_text(json.dumps(plan, indent=2))
    return tmp_path


def test_overnight(tmp_path):
    repo = make_repo(tmp_path)
    agent = Agent(repo)
    out = agent.next()  # setup: install the first kernel
    assert (out["action"], out["kernel"]) == ("switch", "reduce_1")
    reasons = []
    for number, (kernel, edit, correctness, status, action) in enumerate(SCRIPT, start=1):
        source = (repo / "kernel.py").read_text()
        assert f'KERNEL_NAME = "{kernel}"' in source, f"experiment {number}: wrong kernel.py"
        if edit is None:  # a kernel without rows yet: its baseline, as program.md says
            verdict = agent.bench(f"baseline: {kernel}")
        else:
            description, change = EDITS[edit]
            edited = change(kernel, source)
            assert edited != source, f"experiment {number}: edit {edit} changed nothing"
            (repo / "kernel.py").write_text(edited)
            extra = ["--timeout", "4"] if edit == "hang" else []
            verdict = agent.bench(description, *extra)
        assert (verdict["correctness"], verdict["status"]) == (correctness, status), \
            f"experiment {number} ({edit}): {verdict}"
        if status == "revert":
            assert (repo / "kernel.py").read_text() == source  # bench.py restored the best
        agent.clock += timedelta(minutes=5)
        if number == CLOCK_JUMP_AT:
            agent.clock += timedelta(hours=2)
        if action:
            out = agent.next()
            assert out["action"] == action, f"after experiment {number}: {out}"
            reasons.append(out["reason"])
    timings = "\n".join(f"{s:6.1f}s rc={rc} {c}" for c, rc, s in agent.log)

    # results.tsv: one row per experiment, as scripted
    rows = pd.read_csv(repo / "results.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert list(rows.columns) == ak.RESULTS_COLUMNS
    assert list(rows.experiment.astype(int)) == list(range(1, len(SCRIPT) + 1))
    assert list(rows.tag) == [s[0] for s in SCRIPT]
    assert list(rows.correctness) == [s[2] for s in SCRIPT]
    assert list(rows.status) == [s[3] for s in SCRIPT]
    assert "syntax error" in rows.reason[2] and "torch" in rows.reason[5]
    assert "wall-clock limit" in rows.reason[4]

    # git: exactly one "bench: keep" commit per kept experiment that changed kernel.py; the
    # baselines are kept as the orchestrator's switch commit that already holds them.
    subjects = {line.split(" ", 1)[0]: line.split(" ", 1)[1]
                for line in git(repo, "log", "--format=%h %s").splitlines()}
    kept = rows[rows.status == "keep"]
    baselines = kept[kept.description.str.startswith("baseline")]
    for commit, description in zip(kept.commit, kept.description):
        subject = next(s for h, s in subjects.items() if commit.startswith(h) or
                       h.startswith(commit))
        expected = "orchestrate: switch to" if description.startswith("baseline") else \
            "bench: keep"
        assert subject.startswith(expected), (description, subject)
    bench_commits = [s for s in subjects.values() if s.startswith("bench: keep")]
    assert len(bench_commits) == len(kept) - len(baselines) == 2
    switches = [s for s in subjects.values() if s.startswith("orchestrate: switch to")]
    assert len(switches) == 1 + sum(s[4] == "switch" for s in SCRIPT)
    assert git(repo, "status", "--porcelain") == ""

    # the orchestrator moved on by rule, and kept each kernel's best in its workspace file
    rules = [r for r, s in zip(reasons, [s for s in SCRIPT if s[4]]) if s[4] == "switch"]
    assert all("no move-on rule met" in r for r, s in zip(reasons, [s for s in SCRIPT if s[4]])
               if s[4] == "stay")
    assert "4 of 5 consecutive reverts" in reasons[0]
    assert "5 consecutive reverts" in rules[0] and "this visit" in rules[1]
    assert "this visit" in rules[2] and "h on it" in rules[3]
    assert "5 consecutive reverts" in rules[4]
    for name in KERNELS:
        assert "ROWS = 32" in (repo / f"workspace/{name}.py").read_text()
    state = json.loads((repo / "workspace/orchestrate.json").read_text())
    assert [v["kernel"] for v in state["visits"]] == \
        ["reduce_1", "softmax_1", "reduce_1", "softmax_1", "reduce_1", "softmax_1"]

    # the morning: status and progress.png
    proc, _ = agent.run("uv run orchestrate.py status")
    assert proc.returncode == 0 and "projected model speedup" in proc.stdout
    proc, _ = agent.run("uv run analysis.py")
    assert proc.returncode == 0, proc.stderr
    image = matplotlib.image.imread(repo / "progress.png")
    assert image.shape[0] > 200 and image.shape[1] > 800
    print(timings)


def test_program_md_names_real_scripts_and_flags():
    """Every `uv run X.py` in program.md is a script in the repo; orchestrate's flags are real."""
    commands = documented_commands()
    scripts = {c.split()[2] for c in commands}
    assert {"bench.py", "orchestrate.py", "analysis.py", "extract.py"} <= scripts
    for script in scripts:
        assert (REPO / script).is_file(), f"program.md runs {script}, which does not exist"
    for c in commands:
        if c.split()[2] == "orchestrate.py":
            assert c.split()[3] in ("status", "next", "install"), c
