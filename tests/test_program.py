"""Every command program.md gives is run here, in program.md's order of use, in one fresh copy of
the repo on a CPU: the setup block line by line, then the loop, the harness restore, the CUDA
rewrite, the morning and a KernelBench setup. The commands are found as
tests/test_benchmarks_doc.py finds them (`uv run ...` lines of code blocks and backtick spans),
plus the `git ...` spans of the prose; a command program.md gives that this test does not run
fails it. (That test checks the files they name exist; this one runs them.)

How each runs, honestly:
- as written, `uv run X.py` as `sys.executable X.py` (the same venv), with the placeholders
  filled (`-m "<...>"` is any description; PROBLEM.py a problem of tests/kernelbench/,
  `<that file>` the harness file the test changed) and profile.py given a one-op model (the
  user's model flags, as program.md says);
- `uv run orchestrate.py rewrite` and `uv run verify.py --cuda-graphs` need an NVIDIA GPU: on the
  CPU each is run and must refuse in one line, exit 2, having changed nothing; the rewrite itself
  (its file, commit and revert budget) is tests/test_orchestrate.py's, with the GPU faked;
- `uv run verify.py` (timed) would time the model in Triton's interpreter for minutes and mean
  nothing: only `--help` runs, which proves the script parses; `verify.py --no-timing` runs in full.
"""
import os
import re
import shutil
import subprocess
import sys

from test_benchmarks_doc import commands
from test_setup_path import REPO, block_commands, fresh_copy, git, shell

PROGRAM = REPO / "program.md"
PROBLEM = REPO / "tests/kernelbench/problems/3_sum_rows.py"


def form(command):
    """A command with its trailing comment dropped and -m's description as MSG: the same code
    path whatever the description says."""
    command = re.split(r"\s+#\s", command)[0].strip()
    return re.sub(r'-m\s+("[^"]*"|\S+)', "-m MSG", command)


def documented():
    """Every command program.md gives, as forms."""
    text = PROGRAM.read_text()
    spans = [s.strip() for s in re.findall(r"`([^`\n]+)`", text) if s.startswith("git ")]
    return {form(c) for c in commands(text) + spans}


class Runner:
    """Runs commands in the copy and remembers which forms ran."""

    def __init__(self, repo):
        self.repo, self.ran = repo, set()

    def ok(self, command, run_as=None):
        """Run (run_as, or the command itself) and expect exit 0 with no note."""
        self.ran.add(form(command))
        return shell(self.repo, run_as or command)

    def exit_code(self, command, code, run_as=None):
        """Run it and expect `code`; returns stdout + stderr."""
        self.ran.add(form(command))
        line = re.sub(r"^uv run ", f"{sys.executable} ", run_as or command)
        proc = subprocess.run(["bash", "-c", line], cwd=self.repo, capture_output=True,
                              text=True, timeout=300,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.returncode == code, f"{command}: rc {proc.returncode}\n{proc.stdout[-2000:]}" \
                                        f"{proc.stderr[-2000:]}"
        return proc.stdout + proc.stderr


def test_every_command_in_program_md_runs(tmp_path):
    repo = fresh_copy(tmp_path)
    run = Runner(repo)
    clone = git(repo, "rev-parse", "HEAD")

    # §6, the setup, line by line: the night's branch before the first commit, nothing on main
    for command in block_commands(PROGRAM, "## 6. Setup"):
        run.ok(command)
    assert git(repo, "branch", "--show-current").startswith("autokernel/")
    assert git(repo, "rev-parse", "main") == clone
    assert git(repo, "log", "-1", "--format=%s") == "orchestrate: switch to reduce_1"
    assert git(repo, "status", "--porcelain") == ""
    assert "CPU mode" in (repo / "workspace/reduce_1.py").read_text()

    # §1, the loop: --quick leaves kernel.py edited, and `next` answers stay until a full run
    out = run.ok("uv run orchestrate.py status")
    assert out["current"].startswith("reduce_1: ")
    assert "reduce_1" in run.exit_code("uv run analysis.py --last 8", 0)  # the night's rows
    (repo / "kernel.py").write_text((repo / "kernel.py").read_text() + "# an idea\n")
    out = run.ok('uv run bench.py --quick -m "an idea, smoke test"')
    assert out["status"] == "judged" and out["keep_rule"].startswith("not compared (--quick")
    out = run.ok("uv run orchestrate.py next")
    assert out["action"] == "stay" and "uv run bench.py" in out["reason"]
    assert (repo / "kernel.py").read_text().endswith("# an idea\n")
    out = run.ok('uv run bench.py -m "the idea in a few words"')
    assert out["status"] in ("keep", "revert") and git(repo, "status", "--porcelain") == ""

    # §2, a harness file that differs from HEAD: refused, shown, restored
    reference = (repo / "autokernel" / "reference.py").read_text()
    (repo / "autokernel" / "reference.py").write_text(reference + "# changed\n")
    said = run.exit_code('uv run bench.py -m "refused"', 2)
    assert "bench.py: error:" in said and "autokernel/reference.py" in said
    assert "autokernel/reference.py" in run.exit_code("git diff --stat HEAD", 0)
    run.exit_code("git checkout HEAD -- <that file>", 0,
                  "git checkout HEAD -- autokernel/reference.py")
    assert (repo / "autokernel" / "reference.py").read_text() == reference

    # §4, the rewrite: on a CPU refused in one line, nothing changed
    head = git(repo, "rev-parse", "HEAD")
    said = run.exit_code("uv run orchestrate.py rewrite", 2)
    assert "need an NVIDIA GPU" in said and said.count("\n") == 1
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""

    # §9, the morning
    out = run.ok("uv run verify.py --no-timing")
    assert out["verdict"] == "PASS"
    assert "--no-timing" in run.exit_code("uv run verify.py", 0, "uv run verify.py --help")
    said = run.exit_code("uv run verify.py --cuda-graphs", 2)
    assert "--cuda-graphs needs a CUDA GPU" in said and said.count("\n") == 1
    run.ok("uv run analysis.py")
    assert (repo / "progress.png").is_file()

    # §10, a KernelBench night: kernel.py is the problem's ModelNew, committed
    shutil.copy(PROBLEM, repo / "problem.py")
    run.exit_code("uv run kernelbench.py setup PROBLEM.py", 0,
                  "uv run kernelbench.py setup problem.py")
    assert 'KERNEL_TYPE = "kernelbench"' in (repo / "kernel.py").read_text()
    assert git(repo, "status", "--porcelain", "--", "kernel.py") == ""

    missing = documented() - run.ran
    assert not missing, f"program.md gives commands this test does not run: {sorted(missing)}"


def test_the_forms_group_descriptions_and_drop_comments():
    assert form('uv run bench.py -m "baseline: x"   # its row') == "uv run bench.py -m MSG"
    assert form("uv run bench.py --quick -m idea") == "uv run bench.py --quick -m MSG"
    assert form("uv run analysis.py --last 8") == "uv run analysis.py --last 8"
    assert form('uv run bench.py -m "<the idea in a few words>"') == "uv run bench.py -m MSG"
    assert form("uv run orchestrate.py next") != form("uv run orchestrate.py status")
