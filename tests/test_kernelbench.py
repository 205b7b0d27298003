"""
KernelBench's format behind the gate (autokernel/kernelbench*.py, kernelbench.py), on the CPU
interpreter, with tiny problems and solutions of our own in tests/kernelbench/: problems/ and
solutions/ (matched by file name: correct, wrong, torch-only, crashing, hanging, and one problem
without a solution), planted/ for the in-process cases.

In process: the plan and its oracle probe, a ModelNew whose parameters come from the judge's seed,
the named failures, the chunked comparison, fast_p and the verdicts, the kernel file setup writes.
Through the CLIs, in a copy of the harness (the judge snapshots and restores the repo it runs in,
so never this checkout): `kernelbench.py score`, and `kernelbench.py setup` then `bench.py`, the
agent's path. The two run at once in one module fixture.

    uv run pytest tests/test_kernelbench.py
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autokernel
from autokernel import gate, kernelbench, kernelbench_score, kernelbench_setup, state
from autokernel.child import Runner
from autokernel.contract import KernelFileError, load_module, read_attrs

HERE = Path(__file__).resolve().parent / "kernelbench"
PROBLEMS, SOLUTIONS, PLANTED = HERE / "problems", HERE / "solutions", HERE / "planted"
GIT_ENV = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="kb test", GIT_AUTHOR_EMAIL="kb@test",
               GIT_COMMITTER_NAME="kb test", GIT_COMMITTER_EMAIL="kb@test")


def attrs(problem, **extra):
    path = PROBLEMS / f"{problem}.py"
    return {"KERNEL_TYPE": "kernelbench", "KERNELBENCH_PROBLEM": str(path),
            "KERNELBENCH_SHA256": state.digest(path.read_bytes()), **extra}


def judge(problem, solution, **extra):
    """The gate's verdict on a solution file, judged in this process."""
    plan = kernelbench.plan(attrs(problem, **extra))
    lines = []
    result = gate.check(Runner(None, load_module(solution).ModelNew), plan, log=lines.append,
                        judge_class=kernelbench.ProblemJudge)
    return result, lines


# ---- in process -----------------------------------------------------------------------------

def test_plan_probes_every_dtype_against_a_float64_oracle():
    plan = kernelbench.plan(attrs("5_scale_shift"))
    assert (plan["kernel_type"], plan["dtype"], plan["shape_str"]) == ("kernelbench", "fp32",
                                                                      "8x32")
    assert {n: e["oracle"] for n, e in plan["oracles"].items()} == {"fp32": "float64",
                                                                    "fp16": "float64"}
    assert plan["oracles"]["fp16"]["out_dtype"] == "float16"


def test_parameters_drawn_under_the_judges_seed_pass_every_stage():
    result, lines = judge("5_scale_shift", PLANTED / "scale_shift.py")
    assert result["correctness"] == "PASS", result["reason"]
    assert result["stages"] == {"smoke": "PASS", "sweep": "PASS", "stability": "PASS",
                                "determinism": "PASS", "edge": "skipped"}
    assert "oracle_fp16: float64 (Model in fp16 is within fp16's tolerance of it)" in lines
    assert any("stage_5_edge: skipped (a KernelBench problem fixes its shapes" in line
               for line in lines)


@pytest.mark.parametrize("problem, planted, reason", [
    ("5_scale_shift", PLANTED / "scale_shift_own_init.py", "smoke: wrong values at fp32"),
    ("1_softmax", PLANTED / "softmax_writes_input.py", "ModelNew.forward modified its input x"),
    ("1_softmax", PLANTED / "softmax_cached.py", "a result cached from an earlier call"),
    ("3_sum_rows", SOLUTIONS / "3_sum_rows.py", "ModelNew.forward called torch compute op "
                                                "aten.sum"),
    ("2_log_softmax", SOLUTIONS / "2_log_softmax.py", "stability: output has Inf"),
])
def test_a_dishonest_or_wrong_solution_is_named(problem, planted, reason):
    result, _ = judge(problem, planted)
    assert result["correctness"] == "FAIL" and reason in result["reason"], result["reason"]


def test_a_changed_problem_is_refused(tmp_path):
    copy = tmp_path / "1_softmax.py"
    copy.write_text((PROBLEMS / "1_softmax.py").read_text())
    sha = state.digest(copy.read_bytes())
    copy.write_text(copy.read_text().replace("dim = 64", "dim = 65"))
    with pytest.raises(KernelFileError, match="changed since this kernel file was set up"):
        kernelbench.plan({"KERNEL_TYPE": "kernelbench", "KERNELBENCH_PROBLEM": str(copy),
                          "KERNELBENCH_SHA256": sha})


def test_a_file_that_is_not_a_problem_is_named(tmp_path):
    path = tmp_path / "not_a_problem.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
    with pytest.raises(KernelFileError, match="defines no get_inputs\\(\\), get_init_inputs"):
        kernelbench.Problem(path)


def test_inputs_that_a_seed_does_not_reproduce_are_refused(tmp_path):
    path = tmp_path / "unseeded.py"
    # Each call adds the next count: never the same values twice (random bytes were, 1 in 256).
    path.write_text((PROBLEMS / "4_relu.py").read_text().replace(
        "return [torch.randn(4, 32)]", "return [torch.randn(4, 32) + next(_calls)]")
        + "\n_calls = __import__('itertools').count()\n")
    with pytest.raises(KernelFileError, match="other values under the same torch.manual_seed"):
        kernelbench.plan({"KERNEL_TYPE": "kernelbench", "KERNELBENCH_PROBLEM": str(path),
                          "KERNELBENCH_SHA256": state.digest(path.read_bytes())})


def test_the_chunked_comparison_is_the_gates_rule(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    want = torch.randn(1000, generator=gen, dtype=torch.float64) * 3
    got = (want + torch.randn(1000, generator=gen, dtype=torch.float64) * 1e-3).float()
    got[[5, 500, 999]] += 1.0
    bad, atol = autokernel.mismatches(got, want, torch.float32)
    monkeypatch.setattr(kernelbench, "CHUNK", 7)
    found = kernelbench.summary(got, want, torch.float32)
    assert found["bad"] == int(bad.sum()) and found["atol"] == pytest.approx(atol)
    assert found["worst"][0] in (5, 500, 999)


def test_changed_elements_counts_bits_without_an_int64_copy():
    """Inputs and repeated outputs are compared bit for bit (NaN equal to the same NaN) with no
    full-size int64 temporary: a bool .sum() made one of 14 GiB at problem 36's 1.9G elements."""
    a = torch.tensor([1.0, float("nan"), -0.0, 3.0])
    b = a.clone()
    assert gate.changed_elements(a, b) == 0
    b[2], b[3] = 0.0, 4.0  # -0.0 vs 0.0 differ in bits
    assert gate.changed_elements(a, b) == 2


def test_fast_p_counts_correct_and_faster_over_all_problems():
    rows = [{"verdict": "correct", "speedup_vs_eager": 2.5, "speedup_vs_compile": 0.9},
            {"verdict": "correct", "speedup_vs_eager": 1.2, "speedup_vs_compile": None},
            {"verdict": "incorrect", "speedup_vs_eager": None, "speedup_vs_compile": None},
            {"verdict": "missing", "speedup_vs_eager": None, "speedup_vs_compile": None}]
    assert kernelbench_score.fast_p(rows, "eager") == {"0": 0.5, "1": 0.5, "1.5": 0.25,
                                                       "2": 0.25}
    assert kernelbench_score.fast_p(rows, "compile") == {"0": 0.5, "1": 0.0, "1.5": 0.0,
                                                         "2": 0.0}
    untimed = [dict(r, speedup_vs_compile=None) for r in rows]
    assert kernelbench_score.fast_p(untimed, "compile")["1"] is None


@pytest.mark.parametrize("outcome, verdict", [
    ({"correctness": "PASS", "latency_us": 3.0}, "correct"),
    ({"correctness": "FAIL", "reason": "smoke: wrong values at fp32"}, "incorrect"),
    ({"correctness": "FAIL", "reason": "smoke: ModelNew.forward called torch compute op aten.mm"},
     "incorrect"),
    ({"correctness": "FAIL", "reason": "smoke: ModelNew.forward raised ValueError: x"}, "error"),
    ({"correctness": "FAIL", "reason": "import error: No module named 'x'", "unjudged": True},
     "error"),
    ({"correctness": "TIMEOUT", "reason": "exceeded the 5 s limit"}, "error"),
    ({"correctness": "FAIL", "reason": "the kernel's process changed bench.py during the run"},
     "incorrect"),
])
def test_verdicts(outcome, verdict):
    assert kernelbench_score.verdict(outcome) == verdict


def test_the_limit_bounds_the_judges_own_work_too(monkeypatch):
    """A row's wall-clock limit holds while the judge itself is busy (a huge problem's inputs
    and float64 oracle), not only while it waits for the child: the row is an error, in time."""
    import time
    problem = PROBLEMS / "1_softmax.py"
    monkeypatch.setattr(kernelbench_score, "GRACE_S", 0.0)
    finished = []

    def busy_judge(*args):
        time.sleep(600)
        finished.append(True)
    monkeypatch.setattr(kernelbench_score, "run_solution", busy_judge)
    row = kernelbench_score.judge("1_softmax", problem, SOLUTIONS / "1_softmax.py", "fp32",
                                  1.0, None, "none")
    assert not finished, "the judge waited for its own work past the limit"
    assert row["verdict"] == "error" and "exceeded the 1 s wall-clock limit" in row["reason"]


def test_the_reference_model_runs_in_full_fp32():
    """cuDNN's TF32 convolutions (torch's default) would make fp32 Model miss its float64
    result, and an exact solution would be judged against the rounded one."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
            return x
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    kernelbench.run(Probe(), {"x": torch.ones(2)})
    assert seen == [(False, False)]
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


def test_the_judges_own_helpers_outlive_each_solutions_processes():
    """The scorer kills what a solution left running but spares what the judge had before it:
    inductor's compile workers serve the next problem's torch.compile baseline, which hung
    when they were killed."""
    helper = subprocess.Popen(["sleep", "60"])  # stands for inductor's compile workers
    helpers = set(state.children())
    left_running = subprocess.Popen(["sleep", "60"])  # stands for a solution's process
    try:
        assert state.kill_descendants(spare=helpers) == 1
        assert left_running.poll() is not None and helper.poll() is None
    finally:
        for process in (helper, left_running):
            process.kill()
            process.wait()


def test_setup_starts_from_model_renamed_and_the_gate_refuses_its_torch_ops(tmp_path):
    problem = kernelbench.Problem(PROBLEMS / "1_softmax.py")
    text = kernelbench_setup.kernel_file_text(problem, str(problem.path), "fp32")
    assert "class ModelNew(nn.Module)" in text and "super(ModelNew, self)" in text
    assert "def get_inputs" not in text and "class Model(" not in text
    kernel = tmp_path / "kernel.py"
    kernel.write_text(text)
    plan = kernelbench.plan(read_attrs(text)[0])
    assert plan["tag"] == "kb_1_softmax"
    result = gate.check(Runner(None, load_module(kernel).ModelNew), plan,
                        judge_class=kernelbench.ProblemJudge)
    assert "called torch compute op aten._softmax" in result["reason"]


def test_setup_from_a_solution_replaces_an_earlier_contract_block():
    problem = kernelbench.Problem(PROBLEMS / "1_softmax.py")
    once = kernelbench_setup.kernel_file_text(problem, "p.py", "fp32",
                                              (SOLUTIONS / "1_softmax.py").read_text())
    twice = kernelbench_setup.kernel_file_text(problem, "p.py", "fp16", once)
    assert twice.count(kernelbench_setup.CONTRACT_MARK) == 1
    assert read_attrs(twice)[0]["BENCH_DTYPE"] == "fp16"
    assert twice.startswith((SOLUTIONS / "1_softmax.py").read_text().rstrip())


# ---- through the CLIs, in a copy of the harness ---------------------------------------------

def make_repo(path):
    path.mkdir(parents=True)
    for name in ("bench.py", "kernelbench.py", ".gitignore"):
        shutil.copy(autokernel.ROOT / name, path / name)
    for folder in ("autokernel", "kernels", "tests/kernelbench"):
        shutil.copytree(autokernel.ROOT / folder, path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PLANTED / "scale_shift.py", path / "kernel.py")  # any committed kernel.py
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, env=GIT_ENV, check=True, capture_output=True)
    return path


def run(repo, *args):
    proc = subprocess.run([sys.executable, *args], cwd=repo, env=GIT_ENV, capture_output=True,
                          text=True, timeout=600)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def score_scenario(root):
    repo = make_repo(root / "score")
    out = run(repo, "kernelbench.py", "score", "--problems", "tests/kernelbench/problems",
              "--solutions", "tests/kernelbench/solutions", "--timeout", "120",
              "--call-timeout", "5")
    report = repo / "workspace" / "kernelbench.json"
    return dict(out, report=json.loads(report.read_text()) if report.exists() else None,
                status=subprocess.run(["git", "status", "--porcelain"], cwd=repo,
                                      capture_output=True, text=True).stdout)


def setup_then_bench_scenario(root):
    repo = make_repo(root / "setup")
    setup = run(repo, "kernelbench.py", "setup", "tests/kernelbench/problems/5_scale_shift.py",
                "--from", "tests/kernelbench/planted/scale_shift.py")
    bench = run(repo, "bench.py", "-m", "a KernelBench solution")
    log = subprocess.run(["git", "log", "--format=%s"], cwd=repo, capture_output=True,
                         text=True).stdout
    return {"setup": setup, "bench": bench, "log": log}


@pytest.fixture(scope="module")
def clis(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernelbench")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        score = pool.submit(score_scenario, root)
        setup = pool.submit(setup_then_bench_scenario, root)
        return {"score": score.result(), "setup": setup.result()}


def test_score_judges_each_solution_and_prints_fast_p(clis):
    run = clis["score"]
    assert run["rc"] == 0, run["stderr"]
    lines = run["stdout"].splitlines()
    verdicts = {line.split(":")[0]: line.split(": ", 1)[1].split()[0] for line in lines
                if line[:1].isdigit()}
    assert verdicts == {"1_softmax": "correct", "2_log_softmax": "incorrect",
                        "3_sum_rows": "incorrect", "4_relu": "error", "5_scale_shift": "error",
                        "6_square": "missing"}, run["stdout"]
    # the torch-only solution is refused before it runs, by the source check
    assert "torch.sum: torch doing the math" in run["stdout"] and "SIGABRT" in run["stdout"]
    assert "exceeded the 5 s limit for one call" in run["stdout"]
    header = next(line for line in lines if "baseline" in line).split()
    assert header == ["baseline", "fast_0", "fast_1", "fast_1.5", "fast_2"]
    eager = next(line for line in lines if line.strip().startswith("eager")).split()
    assert eager[1] == "0.17"  # one correct of six
    report = run["report"]
    assert report["n"] == 6 and report["fast_p"]["eager"]["0"] == pytest.approx(1 / 6)
    correct = report["problems"][0]
    assert correct["verdict"] == "correct" and correct["latency_us"] > 0
    assert correct["eager_us"] > 0 and correct["compile_us"] is None  # no compile on a CPU
    assert run["status"] == ""  # whatever the solutions did, the repo is as committed


def test_setup_then_bench_keeps_a_correct_solution(clis):
    setup, bench = clis["setup"]["setup"], clis["setup"]["bench"]
    assert setup["rc"] == 0, setup["stderr"]
    assert "oracle_fp32: float64" in setup["stdout"] and "commit: " in setup["stdout"]
    assert bench["rc"] == 0, bench["stderr"]
    keys = dict(line.split(": ", 1) for line in bench["stdout"].splitlines() if ": " in line)
    assert keys["kernel_type"] == "kernelbench" and keys["tag"] == "kb_5_scale_shift"
    assert keys["correctness"] == "PASS" and keys["status"] == "keep", bench["stdout"]
    assert keys["stage_5_edge"].startswith("skipped") and float(keys["eager_us"]) > 0
    assert clis["setup"]["log"].splitlines()[0] == "kernelbench: set up 5_scale_shift"
