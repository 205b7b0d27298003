"""
The gate (bench.py) judged by its own CLI, on the CPU interpreter.

Every planted bad kernel in tests/planted/ runs through the real `python bench.py` in a temporary
git repo of its own (the harness files copied in and committed with a good kernel.py; the planted
file then put in as kernel.py). Each must give its named reason and a non-PASS row, leave a
results.tsv that pandas reads with the schema's columns, and leave the repo as committed. Then the
keep/revert decisions, --no-git, and the refusals (dirty harness, malformed results.tsv, no repo).
tests/attacks/ holds kernels that attack the gate from their own process (forged reports, slowed
clocks, wiped history, git moves, edited files, planted modules, leftover processes): none may be
kept, and the night's rows, commits and files must come through intact. The source check
refuses each of them before it runs (tests/test_source_check.py); their repos here are built
without it, so that the defences behind it are tested too.

The ~25 CLI runs (each pays torch's import) run two at a time in one module fixture.

    uv run pytest tests/test_bench.py
"""
import concurrent.futures
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import autokernel
from autokernel import gate
from autokernel.child import Runner
from autokernel.cli import UsageError
from autokernel.contract import KernelFileError, check_module, load_module
from autokernel.results import COLUMNS, read_rows

PLANTED = Path(__file__).resolve().parent / "planted"
GOOD = PLANTED / "good_reduce.py"
ATTACKS = Path(__file__).resolve().parent / "attacks"
REPO_FILES = ["bench.py", ".gitignore"]
# Hermetic git: no user/system config (hooks, signing), a fixed identity.
GIT_ENV = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="bench test", GIT_AUTHOR_EMAIL="bench@test",
               GIT_COMMITTER_NAME="bench test", GIT_COMMITTER_EMAIL="bench@test")

# planted file -> (extra CLI args, expected correctness, a phrase the reason must contain).
# Those that need a process of their own (or show the CLI's row) run through bench.py; every
# other one is judged in-process too (test_planted_kernel_is_named_in_process), which is faster.
CLI_CASES = ("syntax_error", "import_error", "infinite_loop", "abort", "guard_off")
PLANTED_CASES = {
    "syntax_error": ([], "FAIL", "syntax error"),
    "import_error": ([], "FAIL", "import error"),
    "missing_kernel_fn": ([], "FAIL", "defines no kernel_fn"),
    "missing_kernel_type": ([], "FAIL", "defines no KERNEL_TYPE"),
    "unknown_type": ([], "FAIL", "unknown KERNEL_TYPE 'conv3d'"),
    "wrong_shape": ([], "FAIL", "wrong output shape (4, 1), expected (4,)"),
    "wrong_dtype": ([], "FAIL", "wrong output dtype float32, expected float16"),
    "nan_output": ([], "FAIL", "output has NaN"),
    "wrong_non_pow2": ([], "FAIL", "wrong values at 16x1000"),
    "unwritten": ([], "FAIL", "elements left unwritten (1 of 4)"),
    "infinite_loop": (["--timeout", "5"], "TIMEOUT", "exceeded the 5 s wall-clock limit"),
    "abort": ([], "CRASH", "SIGABRT"),
    "out_of_memory": ([], "FAIL", "out of memory"),
    "torch_softmax": ([], "FAIL", "called torch compute op aten._softmax"),
    "torch_matmul": ([], "FAIL", "called torch compute op aten.mm"),
    "guard_off": ([], "FAIL", "torch.utils._python_dispatch._disable_current_modes: the "
                              "dispatcher's internals"),
    "cached_result": ([], "FAIL", "cached from an earlier call"),
    "returns_input": ([], "FAIL", "shares memory with input x"),
    "writes_input": ([], "FAIL", "modified its input x"),
    "nondeterministic": ([], "FAIL", "non-deterministic"),
    "attention_contiguous_only": ([], "FAIL", "layout=bshd"),
    "qkv_rotary_flat_positions": ([], "FAIL", "wrong values at 2x8x48x3x3x32"),
    "residual_contiguous_only": ([], "FAIL", "bias=True residual=True"),
    "ln_bias_dropped": ([], "FAIL", "ln=True"),
    "mlp_residual_dropped": ([], "FAIL", "residual=True"),
    "decode_attention_whole_cache": ([], "FAIL", "ragged=True"),
    "decode_attention_one_position": ([], "FAIL", "wrong values at 1x2x2x2x33x32"),
}


# ---- helpers --------------------------------------------------------------------------------

def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True,
                          check=True).stdout


def make_repo(path, init_git=True, source_check=True):
    """The harness and a good kernel.py, committed: what a user's checkout looks like.
    source_check=False: a harness without the source check (autokernel/source_check.py), for
    the attacks on the defences behind it, which it would refuse before they run."""
    path.mkdir(parents=True)
    for name in REPO_FILES:
        shutil.copy(autokernel.ROOT / name, path / name)
    for folder in ("autokernel", "kernels"):  # the attacks' correct halves are the starters
        shutil.copytree(autokernel.ROOT / folder, path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if not source_check:
        with open(path / "autokernel" / "source_check.py", "a") as f:
            f.write("\nRULES = []  # this repo tests the defences behind the source check\n")
    shutil.copy(GOOD, path / "kernel.py")
    if init_git:
        git(path, "init", "-q")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "init")
    return path


def run_bench(repo, *args, timeout=300, env=None):
    proc = subprocess.run([sys.executable, "bench.py", *args], cwd=repo, env=env or GIT_ENV,
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    keys = {}
    for line in lines:
        key, sep, value = line.partition(": ")
        if sep and key.replace("_", "").isalnum():
            keys[key] = value
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "keys": keys, "last_line": lines[-1] if lines else ""}


def snapshot(repo):
    """What a test asserts about the repo after a run."""
    results = repo / "results.tsv"
    return {"status": git(repo, "status", "--porcelain"),
            "commits": int(git(repo, "rev-list", "--count", "HEAD")),
            "head_message": git(repo, "log", "-1", "--format=%s").strip(),
            "kernel": (repo / "kernel.py").read_text(),
            "committed_kernel": git(repo, "show", "HEAD:kernel.py"),
            "results": pd.read_csv(results, sep="\t", keep_default_na=False,
                                   dtype={"commit": str})  # a hash can be all digits
            if results.exists() else None}


def variant(text, n):
    return text + f"\n# variant {n}\n"


def slower(text):
    """The same kernel doing its work four times over."""
    return text + ("\n_once = kernel_fn\n\n\ndef kernel_fn(**args):\n    for _ in range(3):\n"
                   "        _once(**args)\n    return _once(**args)\n")


# ---- scenarios (each in its own repo; run concurrently by the fixture) ----------------------

def planted_scenario(root, name, folder=PLANTED, cases=PLANTED_CASES):
    repo = make_repo(root / name, source_check=folder != ATTACKS)
    shutil.copy(folder / f"{name}.py", repo / "kernel.py")
    extra = cases[name][0]
    run = run_bench(repo, "--timeout", "120", *extra, "-m", f"planted {name}")
    return {"run": run, **snapshot(repo)}


def keep_then_revert_scenario(root):
    repo = make_repo(root / "keep_then_revert")
    good = GOOD.read_text()
    (repo / "kernel.py").write_text(variant(good, 1))
    first = run_bench(repo, "-m", 'faster "tiles"\twith a tab\nand a newline')
    after_first = snapshot(repo)
    (repo / "kernel.py").write_text(slower(good))
    second = run_bench(repo, "-m", "slower")
    return {"first": first, "after_first": after_first, "second": second, **snapshot(repo)}


def no_git_scenario(root):
    repo = make_repo(root / "no_git")
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 1))
    run = run_bench(repo, "--no-git")
    return {"run": run, **snapshot(repo)}


def dirty_reference_scenario(root):
    repo = make_repo(root / "dirty_reference")
    with open(repo / "autokernel" / "reference.py", "a") as f:
        f.write("\n# an agent 'fixed' the oracle\n")
    shutil.copy(PLANTED / "wrong_dtype.py", repo / "kernel.py")
    run = run_bench(repo)
    return {"run": run, **snapshot(repo)}


MALFORMED = "experiment\ttag\tlatency\n1\tsoftmax\n"


def malformed_results_scenario(root):
    repo = make_repo(root / "malformed_results")
    (repo / "results.tsv").write_text(MALFORMED)
    shutil.copy(PLANTED / "wrong_dtype.py", repo / "kernel.py")
    run = run_bench(repo)
    return {"run": run, "results_text": (repo / "results.tsv").read_text(),
            "status": git(repo, "status", "--porcelain"),
            "kernel": (repo / "kernel.py").read_text()}


def not_a_repo_scenario(root):
    repo = make_repo(root / "not_a_repo", init_git=False)
    run = run_bench(repo)
    return {"run": run, "results_exists": (repo / "results.tsv").exists()}


def no_description_scenario(root):
    repo = make_repo(root / "no_description")
    run = run_bench(repo)  # kernel.py with git, and no -m
    return {"run": run, **snapshot(repo)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    jobs = {f"planted:{name}": (planted_scenario, root, name) for name in CLI_CASES}
    jobs.update({f"attack:{name}": (planted_scenario, root, name, ATTACKS, ATTACK_CASES)
                 for name in ATTACK_CASES})
    jobs.update({name: (fn, root) for name, fn in [
        ("tampering", tampering_scenario), ("orphan", orphan_scenario),
        ("concurrency", concurrency_scenario),
        ("keep_then_revert", keep_then_revert_scenario), ("no_git", no_git_scenario),
        ("kept_version", kept_version_scenario), ("night", night_scenario),
        ("dirty_reference", dirty_reference_scenario),
        ("malformed_results", malformed_results_scenario), ("not_a_repo", not_a_repo_scenario),
        ("no_description", no_description_scenario)]})
    # Longest first, so the two workers finish together.
    first = ["tampering", "keep_then_revert", "concurrency", "no_git"]
    order = first + [k for k in jobs if k not in first]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(jobs[name][0], *jobs[name][1:]) for name in order}
        return {name: future.result() for name, future in futures.items()}


# ---- tests ----------------------------------------------------------------------------------

def assert_schema(results):
    assert list(results.columns) == COLUMNS


@pytest.mark.parametrize("name", CLI_CASES)
def test_planted_kernel_is_rejected_with_a_named_reason(runs, name):
    _, correctness, phrase = PLANTED_CASES[name]
    r = runs[f"planted:{name}"]
    run = r["run"]
    assert run["rc"] == 0, run["stderr"][-2000:]
    assert run["keys"]["correctness"] == correctness, run["stdout"]
    assert phrase in run["keys"]["reason"], run["stdout"]
    assert run["last_line"].startswith("verdict: REVERT"), run["stdout"]
    assert "Traceback" not in run["stdout"]
    # one non-PASS row, with the reason, in a file pandas reads with the schema's columns
    assert_schema(r["results"])
    assert len(r["results"]) == 1
    row = r["results"].iloc[0]
    assert (row["correctness"], row["status"]) == (correctness, "revert")
    assert phrase in row["reason"]
    assert row["description"] == f"planted {name}"
    assert row["device"] == "cpu-interpreter" and row["latency_us"] == ""
    # reverted: kernel.py is the committed one again, nothing else touched, no new commit
    assert r["kernel"] == r["committed_kernel"] == GOOD.read_text()
    assert r["status"] == ""
    assert r["commits"] == 1


def test_good_kernel_is_kept_with_one_commit(runs):
    r = runs["keep_then_revert"]
    run, after = r["first"], r["after_first"]
    assert run["rc"] == 0, run["stderr"][-2000:]
    keys = run["keys"]
    assert keys["correctness"] == "PASS" and keys["status"] == "keep", run["stdout"]
    for number, stage in enumerate(("smoke", "sweep", "stability", "determinism", "edge"), 1):
        assert keys[f"stage_{number}_{stage}"].startswith("PASS"), run["stdout"]
    assert run["last_line"].startswith("verdict: KEEP reduce"), run["stdout"]
    assert "timings not meaningful" in run["last_line"]
    assert after["commits"] == 2 and after["status"] == ""
    assert after["head_message"].startswith("bench: keep reduce exp 1:")
    assert after["committed_kernel"] == variant(GOOD.read_text(), 1)
    row = after["results"].iloc[0]
    assert_schema(after["results"])
    assert (row["correctness"], row["status"], row["tag"], row["kernel_type"]) == \
        ("PASS", "keep", "reduce", "reduce")
    assert row["commit"] == keys["commit"] and len(row["commit"]) >= 7
    assert (row["shape"], row["dtype"], row["experiment"]) == ("4x256", "fp16", 1)
    assert float(row["latency_us"]) > 0 and row["timing_valid"] in (False, "False")
    # tabs and newlines sanitized, quotes kept: the description survives the round trip
    assert row["description"] == 'faster "tiles" with a tab and a newline'


def test_slower_than_best_is_reverted(runs):
    r = runs["keep_then_revert"]
    run = r["second"]
    assert run["rc"] == 0, run["stderr"][-2000:]
    assert run["keys"]["correctness"] == "PASS" and run["keys"]["status"] == "revert"
    # "slower than the kept version", or on a loaded CPU "within the ... noise" of it
    assert "the kept version" in run["last_line"], run["stdout"]
    assert run["keys"]["kept_rounds_us"] and run["keys"]["best_kept_us"] != "n/a"
    assert r["commits"] == 2 and r["status"] == ""
    assert r["kernel"] == variant(GOOD.read_text(), 1)  # back to the kept version
    assert list(r["results"]["status"]) == ["keep", "revert"]
    assert list(r["results"]["experiment"]) == [1, 2]


def test_no_git_judges_without_touching_git(runs):
    r = runs["no_git"]
    run = r["run"]
    assert run["rc"] == 0, run["stderr"][-2000:]
    assert run["keys"]["status"] == "judged" and run["keys"]["correctness"] == "PASS"
    assert run["last_line"].startswith("verdict: JUDGED reduce")
    assert r["commits"] == 1
    assert r["status"].strip() == "M kernel.py"  # the edit is left for the user
    assert r["results"].iloc[0]["status"] == "judged"


def assert_one_line_refusal(run, *phrases):
    assert run["rc"] == 2, run["stdout"] + run["stderr"]
    message = run["stderr"].strip()
    assert "\n" not in message and message.startswith("bench.py: error:"), message
    for phrase in phrases:
        assert phrase in message


def test_modified_reference_makes_bench_refuse(runs):
    r = runs["dirty_reference"]
    assert_one_line_refusal(r["run"], "reference.py", "differs from HEAD")
    assert r["results"] is None  # no row
    assert r["kernel"] == (PLANTED / "wrong_dtype.py").read_text()  # nothing reverted
    assert r["commits"] == 1


def test_malformed_results_tsv_is_refused_and_left_untouched(runs):
    r = runs["malformed_results"]
    assert_one_line_refusal(r["run"], "results.tsv", "malformed")
    assert r["results_text"] == MALFORMED
    assert r["kernel"] == (PLANTED / "wrong_dtype.py").read_text()


def test_not_a_git_repo_suggests_no_git(runs):
    r = runs["not_a_repo"]
    assert_one_line_refusal(r["run"], "not a git repository", "--no-git")
    assert not r["results_exists"]


def test_a_run_on_kernel_py_needs_a_description(runs):
    r = runs["no_description"]
    assert_one_line_refusal(r["run"], 'pass -m "what this version tries"')
    assert r["results"] is None and r["commits"] == 1  # no row, no commit


# ---- in-process pieces (no subprocess) ------------------------------------------------------

IN_PROCESS = [n for n, (_, correctness, _) in PLANTED_CASES.items()
              if correctness == "FAIL" and n not in CLI_CASES]


@pytest.mark.parametrize("name", IN_PROCESS)
def test_planted_kernel_is_named_in_process(name):
    _, correctness, phrase = PLANTED_CASES[name]
    module = load_module(PLANTED / f"{name}.py")
    try:
        plan = check_module(module)
    except KernelFileError as e:
        assert phrase in str(e)
        return
    result = gate.check(Runner(module.kernel_fn), plan)
    assert result["correctness"] == correctness and phrase in result["reason"], result


def test_check_in_process_names_the_failing_stage():
    module = load_module(PLANTED / "wrong_non_pow2.py")
    result = gate.check(Runner(module.kernel_fn), check_module(module))
    assert result["correctness"] == "FAIL" and result["failed_stage"] == "sweep"
    assert result["stages"]["smoke"] == "PASS" and result["stages"]["edge"] == "skipped"
    assert result["reason"].startswith("sweep: wrong values at 16x1000")


def test_usage_errors_exit_2():
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "bench.py"), "--timeout", "-1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--timeout" in proc.stderr
    # An unknown flag: one line (cli.ArgumentParser), not argparse's usage block first.
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "bench.py"), "--bogus"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("bench.py: error: unrecognized arguments: --bogus")
    # A mistyped flag is named before a required one it leaves missing (export.py's --out).
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "export.py"), "--ot", "x"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unrecognized arguments: --ot x" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "kernelbench.py"), "score",
                           "--bogus"], capture_output=True, text=True)  # and a subcommand's
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr, proc.stderr
    # A mistyped --kernel that names some other file is refused before anything is judged or
    # recorded (the repo's README.md: no row, no lock).
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "bench.py"), "--no-git",
                           "--kernel", str(autokernel.ROOT / "README.md")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "is not a kernel file" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not proc.stdout


def test_a_closed_stdout_ends_a_script_quietly():
    """`script | head -1` (every script's main runs in cli.run_main) ends without a
    BrokenPipeError traceback, however much the script still had to print."""
    script = ("import sys; from autokernel.cli import run_main; "
              "sys.exit(run_main('x', lambda argv: [print('y' * 80) for _ in range(10 ** 5)]))")
    proc = subprocess.run(f"{sys.executable} -c \"{script}\" | head -1", shell=True,
                          capture_output=True, text=True, cwd=autokernel.ROOT)
    assert proc.stdout == "y" * 80 + "\n"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_read_results_rejects_ragged_rows(tmp_path):
    path = tmp_path / "results.tsv"
    path.write_text("\t".join(COLUMNS) + "\n" + "\t".join(["1"] * (len(COLUMNS) - 1)) + "\n")
    with pytest.raises(UsageError, match="line 2 has"):
        read_rows(path)


def test_a_sum_that_cancels_is_judged_at_its_terms_scale():
    # One fp32 row of 128256 unit values whose sum is ~0: fp32 accumulation errs by ~1e-4 there
    # (CI once failed a correct kernel on such a draw), while dropping its largest term errs by ~4.
    import torch
    ktype = autokernel.kernel_type("reduce")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((1, 128256), generator=gen, dtype=torch.float64)
    x = (x - x.mean()).float()
    inputs = {"x": x}
    want = ktype.reference(**inputs).double()
    assert abs(float(want)) < 1e-2
    floor = ktype.error_scale(inputs)
    assert 340 < floor < 380  # sqrt(128256) = 358
    rounding = want + 3e-4   # 1e-6 of the terms' scale: what fp32 summation order can give
    dropped = want - float(x[0].abs().max())
    assert bool(autokernel.mismatches(rounding, want, torch.float32)[0].any())  # the old rule
    assert not bool(autokernel.mismatches(rounding, want, torch.float32, floor)[0].any())
    assert bool(autokernel.mismatches(dropped, want, torch.float32, floor)[0].any())
    # Other types keep the plain rule; non-finite inputs fall back to it.
    assert autokernel.kernel_type("softmax").error_scale({"x": x}) == 1.0
    assert ktype.error_scale({"x": torch.full((1, 4), float("inf"))}) == 1.0


def test_a_right_answer_equal_to_an_earlier_one_is_not_called_a_cache():
    # A reduce's 1x16 bf16 output is one bf16 value: two draws' answers, each within tolerance,
    # can be the same bits while the exact sums differ, and CI once failed a correct kernel on
    # that as "a result cached from an earlier call".
    import torch
    ktype = autokernel.kernel_type("reduce")
    module = load_module(PLANTED / "good_reduce.py")
    plan = {"kernel_type": "reduce", "shape": [1, 16], "bench_shapes": [], "dtype": "bf16"}
    first = torch.tensor([[0.5, -1.25, 2.0, 0.75] * 4], dtype=torch.bfloat16)  # sums to 8
    second = first.clone()
    second[0, 0] = 0.5625  # sums to 8.0625, the next bf16 after 8
    sets = [{"x": first}, {"x": second}]
    assert not torch.equal(ktype.reference(**sets[0]), ktype.reference(**sets[1]))
    # 8.0 for both: exact for the first, 0.8% off (bf16 rtol 2%) for the second
    judge = gate.Judge(Runner(lambda x: module.kernel_fn(x=first)), plan, lambda *a: None)
    judge.judge("sweep", sets, "1x16 bf16")
    # The same bits for inputs they are wrong for: still a cache.
    far = {"x": -first}
    with pytest.raises(gate.CheckFailure, match="identical output for different inputs"):
        judge.judge("sweep", [sets[0], far], "1x16 bf16")


# ---- attacks from the kernel's own process --------------------------------------------------

ATTACK_CASES = {  # judged in a fresh repo, like the planted kernels
    "forged_report": ([], "FAIL", "wrong values"),
    "slowed_clocks": ([], "FAIL", "timing contradicted"),
    "lazy_when_timed": ([], "FAIL", "behaves differently when timed"),
    "caches_when_timed": ([], "FAIL", "behaves differently when timed"),
    "skips_timed_calls": ([], "FAIL", "behaves differently when timed"),
}
TAMPERING = ["wipes_results", "moves_branch", "edits_every_file", "plants_modules"]
# The kernel's sandbox refuses these writes (tests/test_sandbox.py); here it is off, so the
# judge's second line of defence, snapshot and restore, meets the tampering itself.
UNCONFINED = dict(GIT_ENV, AUTOKERNEL_SANDBOX="off")


def tampering_scenario(root):
    """A kept kernel, then each tampering attack in turn in the same repo, unconfined."""
    repo = make_repo(root / "tampering", source_check=False)
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 1))  # a keep of its own commit
    kept = run_bench(repo, "-m", "the kept version")
    before = {"head": git(repo, "rev-parse", "HEAD"), "branch": git(repo, "branch",
                                                                       "--show-current"),
              "results": (repo / "results.tsv").read_text()}
    attacks = {}
    for name in TAMPERING:
        shutil.copy(ATTACKS / f"{name}.py", repo / "kernel.py")
        run = run_bench(repo, "-m", f"attack {name}", env=UNCONFINED)
        attacks[name] = {"run": run, **snapshot(repo), "head": git(repo, "rev-parse", "HEAD"),
                         "branch": git(repo, "branch", "--show-current"),
                         "results_text": (repo / "results.tsv").read_text(),
                         "planted": planted_files(repo)}
    return {"kept": kept, "before": before, "attacks": attacks}


STARTER_REDUCE = ('KERNEL_TYPE = "reduce"\nBENCH_SHAPES = [(4, 256)]\n\n'
                  'from kernels.reduce import kernel_fn  # noqa: F401\n')


def kept_version_scenario(root):
    """The reduce starter kept; then a candidate twice as slow that rewrites any copy of the
    kept version it finds on disk (its own TMPDIR: no other test's); one twice as slow that loads
    the machine outside its own windows; then a candidate whose kept version's source is gone
    from git, with an unbeatable record (1 us)."""
    repo = make_repo(root / "kept_version", source_check=False)
    (repo / "kernel.py").write_text(STARTER_REDUCE)
    kept = run_bench(repo, "-m", "the kept version")
    head = git(repo, "rev-parse", "HEAD")
    shutil.copy(ATTACKS / "slows_kept_version.py", repo / "kernel.py")
    (root / "kept_version_tmp").mkdir()
    attack = run_bench(repo, "-m", "attack",
                       env=dict(GIT_ENV, TMPDIR=str(root / "kept_version_tmp")))
    shutil.copy(ATTACKS / "loads_the_machine.py", repo / "kernel.py")
    machine = run_bench(repo, "-m", "loads the machine outside its windows")
    table = pd.read_csv(repo / "results.tsv", sep="\t", keep_default_na=False, dtype=str)
    table.loc[table["status"] == "keep", ["commit", "latency_us"]] = ["0123456", "1.0"]
    table.to_csv(repo / "results.tsv", sep="\t", index=False)
    (repo / "kernel.py").write_text(variant(STARTER_REDUCE, 2))
    unpaired = run_bench(repo, "-m", "its kept version's source is gone")
    return {"kept": kept, "attack": attack, "machine": machine, "unpaired": unpaired,
            "head": head, "head_after": git(repo, "rev-parse", "HEAD"), **snapshot(repo)}


NIGHT_PLAN = {"model": "tiny", "created": "2026-01-01T00:00:00+00:00", "dtype": "fp16",
              "kernels": [{"name": "reduce_1", "kernel_type": "reduce", "rank": 1,
                           "file": "workspace/reduce_1.py", "share": 0.5, "shapes": [[4, 256]],
                           "bench_shapes": [[4, 256]], "dtype": "fp16"}]}


def night_scenario(root):
    """A night on reduce_1 (plan.json and orchestrate.py's visit to it, kernel.py installed and
    committed), then kernel.py without its KERNEL_NAME line, with other BENCH_SHAPES, and as
    installed with an edit."""
    import json
    repo = make_repo(root / "night")
    named = GOOD.read_text() + '\nKERNEL_NAME = "reduce_1"\n'
    (repo / "workspace").mkdir(exist_ok=True)
    (repo / "workspace" / "plan.json").write_text(json.dumps(NIGHT_PLAN))
    (repo / "workspace" / "orchestrate.json").write_text(json.dumps(
        {"version": 1, "plan_created": NIGHT_PLAN["created"],
         "visits": [{"kernel": "reduce_1", "start": NIGHT_PLAN["created"], "first_row": 0,
                     "left": None}]}))
    (repo / "workspace" / "reduce_1.py").write_text(named)
    (repo / "kernel.py").write_text(named)
    git(repo, "commit", "-q", "-am", "orchestrate: switch to reduce_1")
    unnamed = variant(GOOD.read_text(), 1)  # an edit, and the KERNEL_NAME line gone
    (repo / "kernel.py").write_text(unnamed)
    no_name = run_bench(repo, "-m", "renamed")
    after_no_name = snapshot(repo)
    (repo / "kernel.py").write_text(named.replace("[(4, 256)]", "[(4, 128)]"))
    other_shapes = run_bench(repo, "-m", "smaller shapes")
    (repo / "kernel.py").write_text(variant(named, 1))
    kept = run_bench(repo, "-m", "an edit of the night's kernel")
    return {"no_name": no_name, "after_no_name": after_no_name, "unnamed": unnamed,
            "other_shapes": other_shapes, "kept": kept, "named": named,
            "of_record": (repo / "workspace" / "reduce_1.py").read_text(), **snapshot(repo)}


def planted_files(repo):
    """plants_modules' files, if they survived: json.py and the forged .pyc."""
    pycs = (repo / "autokernel" / "__pycache__").glob("results.*.pyc")
    return [p.name for p in [repo / "json.py", *pycs]
            if p.exists() and (p.name == "json.py" or p.read_bytes() == b"forged")]


def orphan_scenario(root):
    repo = make_repo(root / "orphan", source_check=False)
    shutil.copy(ATTACKS / "leaves_a_process.py", repo / "kernel.py")
    run = run_bench(repo, "--no-git")
    log = (repo / "workspace" / "bench_child.log").read_text()  # the kernel prints its pid
    pid = int(log.split("leaves_a_process pid ")[1].split()[0])
    return {"run": run, "pid": pid, "alive": pid_alive(pid)}


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def concurrency_scenario(root):
    """A hanging run holds the lock; a second run is refused; SIGKILL of the first takes its
    child with it; the next run restores what the killed one left."""
    import signal
    import time
    repo = make_repo(root / "concurrency")
    shutil.copy(PLANTED / "infinite_loop.py", repo / "kernel.py")
    first = subprocess.Popen([sys.executable, "bench.py", "--timeout", "120", "-m", "hang"],
                             cwd=repo, env=GIT_ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline, kids = time.monotonic() + 120, []
    while time.monotonic() < deadline and not kids:
        time.sleep(0.5)
        kids = children_of(first.pid)
    second = run_bench(repo, "-m", "second")
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(2)
    left = [pid for pid in kids if pid_alive(pid)]
    third = run_bench(repo, "--timeout", "5", "-m", "third")
    unwritable = run_bench(repo, "--results", str(repo / "kernel.py" / "results.tsv"), "-m", "x")
    return {"kids": kids, "second": second, "left": left, "third": third,
            "unwritable": unwritable, **snapshot(repo)}


def test_attacks_from_the_kernels_process_never_keep_and_change_nothing(runs):
    r = runs["tampering"]
    assert r["kept"]["keys"]["status"] == "keep", r["kept"]["stdout"]
    before = r["before"]
    for number, name in enumerate(TAMPERING, start=2):
        a = r["attacks"][name]
        run = a["run"]
        assert run["rc"] == 0, (name, run["stderr"][-2000:])
        assert run["keys"]["correctness"] == "FAIL", (name, run["stdout"])
        assert "the kernel's process changed" in run["keys"]["reason"], (name, run["stdout"])
        assert run["keys"]["status"] == "revert"
        assert a["head"] == before["head"] and a["branch"] == before["branch"], name
        assert a["status"] == "", (name, a["status"])  # every tracked file as committed
        assert a["kernel"] == a["committed_kernel"] == variant(GOOD.read_text(), 1)
        assert a["results_text"].startswith(before["results"]), name  # history intact
        assert len(a["results"]) == number and a["results"].iloc[-1]["status"] == "revert"
        assert a["planted"] == [], name


def test_the_kept_version_runs_from_memory_and_unpaired_candidates_face_its_record(runs):
    """A candidate cannot slow the kept version down by rewriting a copy of it (there is none on
    disk) or by loading the machine while the kept version's windows run (its processes are
    stopped then); with no kept version to time beside it, a candidate is not kept as "the first
    correct version" but must beat the kept row's recorded latency. The machine's loaders
    outlive the kernel's child, which fails the run on its own."""
    r = runs["kept_version"]
    assert r["kept"]["keys"]["status"] == "keep", r["kept"]["stdout"]
    for name in ("attack", "machine", "unpaired"):
        run = r[name]
        assert run["rc"] == 0, run["stderr"][-2000:]
        assert run["keys"]["status"] == "revert", run["stdout"]
        assert run["keys"]["correctness"] == ("FAIL" if name == "machine" else "PASS"), \
            run["stdout"]
    assert "process(es) running after its child was stopped" in r["machine"]["keys"]["reason"]
    attack = r["attack"]["keys"]
    assert attack["kept_rounds_us"] and "slower than the kept version" in attack["keep_rule"]
    why = r["unpaired"]["keys"]["keep_rule"]
    assert "could not be timed (its source is not in git)" in why and "recorded 1.0 us" in why
    assert r["head_after"] == r["head"] and r["status"] == ""  # kernel.py back to the kept one


@pytest.mark.parametrize("name", list(ATTACK_CASES))
def test_attack_is_refused_with_a_named_reason(runs, name):
    _, correctness, phrase = ATTACK_CASES[name]
    r = runs[f"attack:{name}"]
    run = r["run"]
    assert run["rc"] == 0, run["stderr"][-2000:]
    assert run["keys"]["correctness"] == correctness and phrase in run["keys"]["reason"], \
        run["stdout"]
    assert r["commits"] == 1 and r["status"] == "" and r["kernel"] == GOOD.read_text()
    assert list(r["results"]["status"]) == ["revert"]


def test_during_a_night_kernel_py_must_name_the_night_s_kernel(runs):
    """The tag, shapes and file of record come from the night (orchestrate.py's current
    kernel): a kernel.py that dropped its KERNEL_NAME line, or changed its BENCH_SHAPES, is
    refused in one line before judging (no row, no new tag, the edit left in place)."""
    r = runs["night"]
    assert_one_line_refusal(r["no_name"], "no KERNEL_NAME line", "the night is on reduce_1",
                            "KERNEL_NAME = 'reduce_1'")
    after = r["after_no_name"]
    assert after["results"] is None and after["kernel"] == r["unnamed"]  # nothing lost
    assert_one_line_refusal(r["other_shapes"], "BENCH_SHAPES = [(4, 128)]", "[(4, 256)]")
    keys = r["kept"]["keys"]
    assert (keys["tag"], keys["correctness"], keys["status"]) == ("reduce_1", "PASS", "keep"), \
        r["kept"]["stdout"]
    assert keys["file_of_record"] == "workspace/reduce_1.py"
    assert r["of_record"] == variant(r["named"], 1)
    assert list(r["results"]["tag"]) == ["reduce_1"] and r["status"] == ""


def test_no_process_outlives_the_verdict(runs):
    r = runs["orphan"]
    assert r["run"]["rc"] == 0, r["run"]["stderr"][-2000:]
    assert not r["alive"], f"pid {r['pid']} (started in its own session) still runs"
    # and a kernel whose process outlives its child is no kernel to keep, correct or not
    keys = r["run"]["keys"]
    assert keys["correctness"] == "FAIL", r["run"]["stdout"]
    assert "left 1 process(es) running" in keys["reason"] and "sleep 600" in keys["reason"]


def test_one_bench_at_a_time_and_a_killed_one_takes_its_child_along(runs):
    r = runs["concurrency"]
    assert r["kids"], "the first bench.py never started its child"
    assert_one_line_refusal(r["second"], "another bench.py is judging")
    assert r["left"] == [], "the child outlived its killed bench.py"
    third = r["third"]
    assert third["keys"]["correctness"] == "TIMEOUT", third["stdout"]
    assert "exceeded the 5 s" in third["keys"]["reason"]
    assert r["status"] == "" and r["commits"] == 1


def test_an_unwritable_results_file_is_refused_before_judging(runs):
    r = runs["concurrency"]
    assert_one_line_refusal(r["unwritable"], "not writable")
    assert r["commits"] == 1


def test_a_kept_version_slowed_past_its_record_hands_the_verdict_to_the_record():
    """A gain over a kept version that read well above its own record (its windows disturbed,
    say by GPU work a candidate's process left running) must also beat that record."""
    from autokernel.results import keep_rule_checked
    assert keep_rule_checked([9.0] * 5, [10.0] * 5, 9.8)[0]  # 2% above its record: paired rule
    keep, gain, _, why = keep_rule_checked([9.0] * 5, [14.0] * 5, 10.0)
    assert keep and abs(gain - 0.1) < 1e-9 and "40% above its record" in why \
        and "against its recorded 10.0 us" in why
    keep, _, _, why = keep_rule_checked([12.0] * 5, [14.0] * 5, 10.0)  # beats only the slowed one
    assert not keep and "not beyond 5%" in why
    assert not keep_rule_checked([11.0] * 5, [10.0] * 5, 5.0)[0]  # a loss stays a loss
    assert keep_rule_checked([9.0] * 5, [14.0] * 5, None)[0]  # no record (CPU): paired rule


def test_the_keep_rule_weighs_gain_against_the_paired_rounds_noise():
    from autokernel.results import keep_rule
    assert keep_rule([10.0] * 5, None)[0]  # the first correct version of a setting
    keep, gain, noise, why = keep_rule([9.0, 9.1, 8.9, 9.0, 9.05], [10.0, 10.1, 9.9, 10.0, 10.0])
    assert keep and gain == pytest.approx(0.1, abs=0.01) and "faster" in why
    # the same kernel twice: the ratios straddle 1 and the median gain is inside their spread
    keep, _, _, why = keep_rule([10.2, 9.7, 10.1, 9.9, 10.0], [10.0, 10.0, 9.8, 10.1, 10.0])
    assert not keep and "within" in why
    keep, _, _, why = keep_rule([14.0, 14.2, 13.9, 14.1, 14.0], [10.0, 10.1, 9.9, 10.0, 10.0])
    assert not keep and "slower" in why
    # one noisy round widens the noise: a 3% gain then is not enough
    keep, _, _, why = keep_rule([9.7, 9.7, 9.7, 9.7, 11.0], [10.0] * 5)
    assert not keep and "within" in why
    # no kept version timed beside it: the kept row's record, with a wider margin
    from autokernel.results import keep_rule_against_record as against
    why_not = "could not be timed (it does not import)"
    assert not against([9.7] * 5, 10.0, why_not)[0]  # 3%: not beyond 5%
    keep, gain, _, why = against([9.0] * 5, 10.0, why_not)
    assert keep and gain == pytest.approx(0.1) and "recorded 10.0 us" in why


def test_the_wall_clock_limit_counts_the_judges_own_work():
    """The limit bounds the whole judgement: once the judge's own work (inputs, the oracle)
    has spent it, the next request is a TIMEOUT even though the child answers at once."""
    import time
    from autokernel import judge
    runner = judge.ChildRunner(autokernel.ROOT / "kernels" / "reduce.py",
                               time.monotonic() + 300, 300)
    try:
        assert runner.start()["status"] != "import_failed"
        runner.ping()  # within the limit: answered
        runner.deadline = time.monotonic() - 1  # as if the oracle had taken the rest
        runner.at("stage 2 (the oracle's inputs)")
        with pytest.raises(judge.ChildGone) as gone:
            runner.ping()
        assert gone.value.correctness == "TIMEOUT"
        assert "exceeded the 300 s wall-clock limit during stage 2" in gone.value.why
    finally:
        runner.stop()
        judge.ChildRunner.started.remove(runner)


class FakeClock:
    """The judge's clock for tests: it moves only when a FakeRunner's window says so, so the
    arithmetic of paired_rounds is checked exactly, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class FakeRunner:
    """An in-process runner for timing.paired_rounds: correct outputs, a window that takes
    `sleep_s` on the fake clock (`clock`, a FakeClock patched into timing), every window logged by
    name; fail_at: the window number that raises."""
    clock = None

    def __init__(self, name, log, case, sleep_s, fail_at=None):
        self.name, self.log, self.case, self.sleep_s, self.fail_at = name, log, case, sleep_s, \
            fail_at
        self.windows, self.stopped = 0, False

    def time(self, inputs, buffer):
        buffer.copy_(self.case.reference(inputs))
        return {"status": "timed", "median_us": 1.0}

    def arm(self, sets, slots):
        self.sets, self.slots = sets, slots
        return {"status": "armed", "graph": False}

    def window(self):
        self.windows += 1
        self.log.append(self.name)
        if self.windows == self.fail_at:
            return {"status": "raised", "error": "RuntimeError: planted"}
        self.clock.now += self.sleep_s
        for inputs, slot in zip(self.sets, self.slots):
            slot.copy_(self.case.reference(inputs))
        return {"status": "windowed"}

    def stop(self):
        self.stopped = True


def test_the_floor_is_the_idle_kernels_median_window_in_the_same_rounds(monkeypatch):
    """The idle kernel's windows are taken in the rounds themselves: one untimed right after each
    rewrite of the sets, then one in turn with the kernels' (every position in turn); their
    median leaves every window's clock. An idle kernel that fails leaves nothing subtracted and
    the round is taken again; without an idle runner nothing is subtracted either."""
    import torch
    from autokernel import KERNEL_TYPES, timing
    case = timing.kernel_case(KERNEL_TYPES["reduce"], (4, 64), torch.float32)
    monkeypatch.setattr(timing, "ROUNDS", 3)
    monkeypatch.setattr(timing, "WARMUP_ROUNDS", 0)
    monkeypatch.setattr(timing, "WINDOWS_PER_ROUND", 1)
    monkeypatch.setattr(FakeRunner, "clock", FakeClock())
    monkeypatch.setattr(timing, "time", FakeRunner.clock)
    log = []
    cand = FakeRunner("candidate", log, case, 0.030)
    kept = FakeRunner("kept", log, case, 0.045)
    idle = FakeRunner("idle", log, timing.idle_case(), 0.010)
    got = timing.paired_rounds(cand, kept, case, lambda: idle)
    # per rewrite: the settling idle window, then all three in an order that turns
    assert log == ["idle", "candidate", "kept", "idle", "idle", "kept", "idle", "candidate",
                   "idle", "idle", "candidate", "kept"]
    assert idle.stopped and got["floor_why"] == "" and got["floor_us"] == pytest.approx(10_000)
    n = got["sets"]
    for name, window_s in (("candidate", 0.030), ("kept", 0.045)):
        for us in got[name]:  # (window - floor) / calls
            assert us == pytest.approx((window_s - 0.010) * 1e6 / n)

    log.clear()
    dies = FakeRunner("idle", log, timing.idle_case(), 0.010, fail_at=3)
    got = timing.paired_rounds(cand, None, case, lambda: dies)
    assert got["floor_us"] == 0 and "the idle kernel failed" in got["floor_why"] and dies.stopped
    assert got["candidate"] == pytest.approx([0.030 * 1e6 / got["sets"]] * 3)
    assert timing.paired_rounds(cand, None, case, None)["floor_why"] == "no idle kernel"


STOPPED_CHILD = ("import subprocess\n"
                 "_p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
                 "print('grandchild', _p.pid, flush=True)  # to the child log\n"
                 "def kernel_fn(x):\n    return x.clone()\n")


def test_a_window_runs_with_every_other_process_below_the_judge_stopped(tmp_path):
    """While one child's window is timed (runner.alone()), every other process below the judge
    is stopped, one started in a session of its own included; all go on afterwards."""
    import time
    from autokernel import judge
    from autokernel.state import process_state as state

    def resumed(pid):  # SIGCONT is delivered asynchronously too
        deadline = time.monotonic() + 5
        while state(pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.001)
        return state(pid) != "T"
    grandchild = None
    timed = judge.ChildRunner(judge.IDLE_KERNEL, time.monotonic() + 300, 300)
    other = judge.ChildRunner(tmp_path / "escapes.py", time.monotonic() + 300, 300,
                              source=STOPPED_CHILD)
    try:
        assert timed.start()["status"] == "loaded" and other.start()["status"] == "loaded"
        grandchild = int(judge.CHILD_LOG.read_text().split("grandchild ")[1].split()[0])
        with timed.alone():
            assert state(other.proc.pid) == "T" and state(grandchild) == "T"
            assert state(timed.proc.pid) != "T"
            assert timed.ping()["status"] == "pong"  # the timed child still answers
        assert resumed(other.proc.pid) and resumed(grandchild)
        assert other.ping()["status"] == "pong"
    finally:
        for runner in (timed, other):
            runner.stop()
            judge.ChildRunner.started.remove(runner)
        if grandchild:
            os.kill(grandchild, 9)


# ---- the judge's reading of a child's output descriptions -----------------------------------

def description(tmp_path, monkeypatch, **change):
    """An output description as a child sends it, its reference-counter file made here."""
    import base64
    from autokernel import timing
    monkeypatch.setattr(timing, "SHM", str(tmp_path))
    (tmp_path / "torch_1_2_3").write_bytes(bytes(8 * 10))
    good = {"dtype": "float16", "shape": [4, 8], "stride": [8, 1], "offset": 0, "device": 0,
            "handle": "", "size": 64, "storage_offset": 0,
            "ref_counter": base64.b64encode(b"/torch_1_2_3").decode(), "ref_counter_offset": 9}
    return dict(good, **{k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
                         for k, v in change.items()})


@pytest.mark.parametrize("change", [
    {"dtype": "float32"}, {"shape": [4, 9]}, {"stride": [8, -1]}, {"stride": [16, 1]},
    {"offset": 1}, {"offset": -1}, {"size": 62}, {"ref_counter": b"/etc/passwd"},
    {"ref_counter": b"/torch_1_2_3/../../x"}, {"ref_counter": b"/torch_9_9_9"},
    {"ref_counter_offset": 10}, {"ref_counter_offset": -1}, {"shape": "x"}])
def test_a_childs_output_description_is_checked_before_it_is_opened(tmp_path, monkeypatch,
                                                                    change):
    """The judge opens a child's outputs from descriptions the child wrote: any field that would
    make it read outside them, or write a counter outside a torch file, is refused first."""
    import torch
    from autokernel import timing
    case = timing.Case(make=None, reference=None, wrong=None, out_shape=(4, 8),
                       out_dtype=torch.float16)
    assert timing.described_view(description(tmp_path, monkeypatch), case)[0] == [4, 8]
    with pytest.raises(ValueError):
        timing.described_view(description(tmp_path, monkeypatch, **change), case)
    with pytest.raises(timing.TimingError, match="unreadable"):
        timing.opened([description(tmp_path, monkeypatch, **change)], case, 1)
