"""orchestrate.py on synthetic results.tsv files: the move-on rules, the choice of the next
kernel, Amdahl's projection, one-line errors on bad input, and the git switch in a temp repo."""
import json
import math
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

import autokernel as ak
import orchestrate as orc
from autokernel import night, results, workspace
from autokernel.cli import UsageError, run_main

T0 = datetime(2025, 1, 1, 22, 0, tzinfo=timezone.utc)


def cell(value):
    """A results.tsv cell as bench.py writes it: empty for a missing number."""
    return "" if isinstance(value, float) and math.isnan(value) else str(value)


def row(experiment, tag, status="keep", latency=100.0, correctness="PASS", minutes=0,
        speedup=math.nan, pct=math.nan, timing_valid=True, kernel_type=None, commit=""):
    """One results.tsv row as read back (strings; only what orchestrate reads matters)."""
    kernel_type = kernel_type or tag.split("_")[0]
    ok = correctness == "PASS"
    values = {"experiment": experiment, "tag": tag, "kernel_type": kernel_type,
              "throughput_tflops": 1.0 / latency if ok else math.nan,
              "latency_us": latency if ok else math.nan, "pct_peak": pct if ok else math.nan,
              "speedup_vs_pytorch": speedup if ok else math.nan, "correctness": correctness,
              "peak_vram_mb": 1.0, "description": f"exp {experiment}",
              "bandwidth_gb_s": 1000.0 / latency if ok else math.nan,
              "status": status, "commit": commit,
              "timestamp": (T0 + timedelta(minutes=minutes)).isoformat(),
              "shape": "64x1024", "dtype": "fp16", "device": "cpu-interpreter",
              "timing_valid": str(timing_valid).lower(), "reason": "" if ok else "planted"}
    return {c: cell(values.get(c, "")) for c in results.COLUMNS}


def write_tsv(path, rows):
    """A fresh results.tsv holding rows, written by results.tsv's own writer."""
    path.unlink(missing_ok=True)
    for r in rows:
        results.append_row(r, path)


PLAN = {"model": "test", "created": "2025-01-01T21:00:00+00:00", "kernels": [
    {"name": "reduce_1", "kernel_type": "reduce", "file": "workspace/reduce_1.py",
     "shapes": [[64, 1024]], "dtype": "fp16", "share": 0.3, "time_us": 30.0,
     "amdahl_ceiling": 1 / 0.7, "bound": "memory"},
    {"name": "softmax_1", "kernel_type": "softmax", "file": "workspace/softmax_1.py",
     "shapes": [[64, 1024]], "dtype": "fp16", "share": 0.2, "time_us": 20.0,
     "amdahl_ceiling": 1 / 0.8, "bound": "memory"},
]}


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------

def test_amdahl():
    assert night.amdahl([(0.5, 2.0)]) == pytest.approx(1 / 0.75)
    assert night.amdahl([(0.3, 3.0), (0.2, 1.0)]) == pytest.approx(1 / (0.5 + 0.1 + 0.2))
    assert night.amdahl([(0.3, math.inf)]) == pytest.approx(1 / 0.7)
    assert night.amdahl([]) == 1.0


def test_speedup_against_eager_when_valid_else_starter():
    rows = [row(1, "softmax_1", latency=100, speedup=1.5),
            row(2, "softmax_1", latency=50, speedup=3.0)]
    s = night.kernel_stats(rows)
    assert (s["speedup_basis"], s["speedup"], s["best_us"]) == ("eager", pytest.approx(3.0), 50)
    cpu = [row(1, "softmax_1", latency=100, speedup=0.01, timing_valid=False),
           row(2, "softmax_1", "revert", latency=120, timing_valid=False),
           row(3, "softmax_1", "revert", correctness="FAIL", timing_valid=False),
           row(4, "softmax_1", latency=40, speedup=0.03, timing_valid=False)]
    s = night.kernel_stats(cpu)
    assert (s["speedup_basis"], s["speedup"]) == ("starter", pytest.approx(2.5))
    assert (s["runs"], s["kept"], s["failed"]) == (4, 2, 1)


def test_best_is_compared_within_the_latest_shape():
    rows = [row(1, "reduce_1", latency=10), row(2, "reduce_1", latency=100),
            row(3, "reduce_1", latency=80)]
    rows[0]["shape"] = "8x8"  # an earlier, smaller benchmark shape: not comparable
    s = night.kernel_stats(rows)
    assert (s["best_us"], s["baseline_us"]) == (80, 100)
    # a kernel file that did not even parse gets a row without a shape: it changes nothing
    broken = dict(row(4, "reduce_1", "revert", correctness="FAIL"), shape="", dtype="")
    s = night.kernel_stats(rows + [broken])
    assert (s["best_us"], s["baseline_us"], s["failed"]) == (80, 100, 1)


def visit(kernel="reduce_1", first_row=0, minutes=0):
    return {"kernel": kernel, "start": (T0 + timedelta(minutes=minutes)).isoformat(),
            "first_row": first_row, "left": None}


def reasons(rows, v, minutes, limits=orc.Limits()):
    p = orc.visit_progress(rows, v, T0 + timedelta(minutes=minutes))
    return orc.move_on_reasons(p, limits)


def test_move_on_rules():
    base = [row(1, "reduce_1", latency=100)]
    reverts = [row(i, "reduce_1", "revert", latency=120) for i in range(2, 6)]
    assert reasons(base + reverts, visit(), 30) == []  # 4 reverts: not yet
    fired = reasons(base + reverts + [row(6, "reduce_1", "revert", correctness="TIMEOUT")],
                    visit(), 30)
    assert len(fired) == 1 and "5 consecutive reverts" in fired[0]
    # a keep resets the streak; judged (--no-git) rows do not count either way
    later = base + reverts + [row(6, "reduce_1", latency=90),
                              row(7, "reduce_1", "judged", latency=95)]
    assert reasons(later, visit(), 30) == []
    assert "h on it" in reasons(base, visit(), 121)[0]
    assert "of attainable peak" in reasons([row(1, "reduce_1", pct=91.0)], visit(), 5)[0]
    assert "2.00x this visit" in reasons([row(1, "reduce_1", latency=100),
                                          row(2, "reduce_1", latency=50)], visit(), 5)[0]
    loose = orc.Limits(max_reverts=10, max_hours=5)
    assert reasons(base + reverts + [row(6, "reduce_1", "revert")], visit(), 200, loose) == []


def test_revisit_measures_speedup_from_where_the_visit_began():
    first = [row(1, "reduce_1", latency=100), row(2, "reduce_1", latency=40)]  # 2.5x: left
    other = [row(3, "softmax_1", latency=100)]
    again = [row(4, "reduce_1", latency=30)]  # 1.33x over 40 us: stay
    v = visit(first_row=3, minutes=60)
    assert reasons(first + other + again, v, 70) == []
    assert "2.00x this visit" in reasons(first + other + again + [row(5, "reduce_1", latency=20)],
                                         v, 70)[0]


def test_choose_next():
    state = {"visits": [visit("reduce_1")]}
    rows = [row(1, "reduce_1")]
    assert orc.choose_next(PLAN, rows, state, "reduce_1", orc.Limits())[0] == "softmax_1"
    # all visited: the one still taking the most model time (share / speedup), not the one left
    state = {"visits": [visit("reduce_1"), visit("softmax_1", 2)]}
    rows = [row(1, "reduce_1", latency=100), row(2, "reduce_1", latency=10),
            row(3, "softmax_1", latency=100)]  # reduce 0.3/10 = 0.03, softmax 0.2/1
    assert orc.choose_next(PLAN, rows, state, "reduce_1", orc.Limits())[0] == "softmax_1"
    name, why = orc.choose_next(PLAN, rows, state, "softmax_1", orc.Limits())
    assert name == "reduce_1" and "revisit" in why
    peaked = [row(1, "reduce_1", pct=95.0), row(2, "softmax_1", pct=92.0)]
    assert orc.choose_next(PLAN, peaked, state, "softmax_1", orc.Limits())[0] is None


# ---------------------------------------------------------------------------------------------
# Bad input: one-line errors
# ---------------------------------------------------------------------------------------------

def one_line_error(fn, *args, **kwargs):
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message
    return message


def test_bad_plans(tmp_path):
    path = tmp_path / "plan.json"
    assert "extract.py" in one_line_error(workspace.read_plan, path)
    path.write_text("{not json")
    assert "not valid JSON" in one_line_error(workspace.read_plan, path)
    path.write_text(json.dumps({"kernels": []}))
    assert "no kernels" in one_line_error(workspace.read_plan, path)
    bad = json.loads(json.dumps(PLAN))
    bad["kernels"][0]["kernel_type"] = "conv9d"
    path.write_text(json.dumps(bad))
    assert "unknown type" in one_line_error(workspace.read_plan, path)
    bad = json.loads(json.dumps(PLAN))
    bad["kernels"][1]["share"] = 0.9
    path.write_text(json.dumps(bad))
    assert "more than 1" in one_line_error(workspace.read_plan, path)


# ---------------------------------------------------------------------------------------------
# The git flow in a temp repo (in-process: ak's paths point at the repo)
# ---------------------------------------------------------------------------------------------

def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def kernel_source(kernel_type, name, note=""):
    return f'KERNEL_TYPE = "{kernel_type}"\n{note}\nKERNEL_NAME = "{name}"\n'


def cuda_starter(kernel_type):
    return (f'"""The {kernel_type} CUDA starter."""\nKERNEL_TYPE = "{kernel_type}"\n'
            f'BACKEND = "cuda"\n')


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for attr, rel_path in [("ROOT", "."), ("KERNEL_PY", "kernel.py"), ("WORKSPACE", "workspace"),
                           ("RESULTS_TSV", "results.tsv"), ("PLAN_JSON", "workspace/plan.json"),
                           ("ORCHESTRATE_JSON", "workspace/orchestrate.json"),
                           ("KERNELS_DIR", "kernels")]:
        monkeypatch.setattr(ak, attr, (tmp_path / rel_path).resolve())
    monkeypatch.delenv("AUTOKERNEL_NOW", raising=False)
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "test@example.com")
    git(tmp_path, "config", "user.name", "test")
    (tmp_path / ".gitignore").write_text("workspace/\nresults.tsv\n")
    (tmp_path / "kernel.py").write_text('KERNEL_TYPE = "softmax"\n')
    (tmp_path / "kernels/cuda").mkdir(parents=True)
    for k in PLAN["kernels"]:
        (tmp_path / f"kernels/cuda/{k['kernel_type']}.py").write_text(
            cuda_starter(k["kernel_type"]))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "init")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace/plan.json").write_text(json.dumps(PLAN))
    for k in PLAN["kernels"]:
        (tmp_path / k["file"]).write_text(kernel_source(k["kernel_type"], k["name"]))
    return tmp_path


def run_cli(capsys, *argv, code=0):
    assert run_main("orchestrate.py", orc.main, list(argv)) == code
    out, err = capsys.readouterr()
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line), out, err


def bench(repo, rows, tag, status, latency=100.0, correctness="PASS", minutes=0):
    """What bench.py does: append a row; on keep, commit kernel.py (edited) as 'bench: keep'
    and name that commit in the row."""
    n, commit = len(rows) + 1, ""
    if status == "keep":
        with open(repo / "kernel.py", "a") as f:
            f.write(f"# kept experiment {n}\n")
        git(repo, "commit", "-q", "-am", f"bench: keep {tag} exp {n}")
        commit = git(repo, "rev-parse", "--short", "HEAD").strip()
    rows.append(row(n, tag, status, latency, correctness, minutes, timing_valid=False,
                    commit=commit))
    write_tsv(repo / "results.tsv", rows)


def test_next_installs_stays_and_moves_on(repo, capsys):
    now = ["--now", T0.isoformat()]
    out, _, _ = run_cli(capsys, "next", *now)
    assert (out["action"], out["kernel"]) == ("switch", "reduce_1")
    assert (repo / "kernel.py").read_text() == (repo / "workspace/reduce_1.py").read_text()
    assert "orchestrate: switch to reduce_1" in git(repo, "log", "--format=%s")
    rows = []
    bench(repo, rows, "reduce_1", "keep", 100)
    bench(repo, rows, "reduce_1", "keep", 80)
    for i in range(4):
        bench(repo, rows, "reduce_1", "revert", 120)
        out, _, _ = run_cli(capsys, "next", *now)
        assert out["action"] == "stay" and f"{i + 1} of 5 consecutive reverts" in out["reason"]
    # an edit only `bench.py --quick` has seen: stay (a switch would lose it), exit 0
    (repo / "kernel.py").write_text("edited but not benched\n")
    out, _, _ = run_cli(capsys, "next", *now)
    assert (out["action"], out["kernel"]) == ("stay", "reduce_1")
    assert "no full bench.py run has judged" in out["reason"] and "uv run bench.py" in \
        out["reason"]
    assert (repo / "kernel.py").read_text() == "edited but not benched\n"
    git(repo, "checkout", "-q", "--", "kernel.py")  # what bench.py's revert would do
    best = git(repo, "show", "HEAD:kernel.py")
    bench(repo, rows, "reduce_1", "revert", correctness="CRASH")
    out, text, _ = run_cli(capsys, "next", *now)
    assert (out["action"], out["kernel"]) == ("switch", "softmax_1")
    assert "5 consecutive reverts" in out["reason"]
    assert (repo / "workspace/reduce_1.py").read_text() == best  # the best kept version saved
    assert "kept experiment 2" in best
    assert (repo / "kernel.py").read_text() == (repo / "workspace/softmax_1.py").read_text()
    assert git(repo, "status", "--porcelain") == ""
    log = git(repo, "log", "--format=%s").splitlines()
    assert log[0] == "orchestrate: switch to softmax_1"
    # the 2-hour rule, with the clock injected through the environment
    bench(repo, rows, "softmax_1", "keep", 100, minutes=10)
    out, _, _ = run_cli(capsys, "next", *now)
    assert out["action"] == "stay"
    later = (T0 + timedelta(hours=2, minutes=1)).isoformat()
    out, _, _ = run_cli(capsys, "next", "--now", later)
    assert out["action"] == "switch" and "h on it" in out["reason"]
    # all visited: revisit reduce_1 (0.3 share / 1.25x) over softmax_1 (just left anyway)
    assert out["kernel"] == "reduce_1" and "revisit" in out["next"]
    assert "kept experiment 2" in (repo / "kernel.py").read_text()  # resumes from its best
    state = json.loads((repo / "workspace/orchestrate.json").read_text())
    assert [v["kernel"] for v in state["visits"]] == ["reduce_1", "softmax_1", "reduce_1"]
    assert [v["first_row"] for v in state["visits"]] == [0, 7, 8]


def test_state_is_rebuilt_when_missing_corrupt_or_stale(repo, capsys):
    now = ["--now", T0.isoformat()]
    run_cli(capsys, "next", *now)
    rows = []
    for status in ["keep", "revert", "revert", "revert", "revert", "revert"]:
        bench(repo, rows, "reduce_1", status)
    run_cli(capsys, "next", *now)  # -> softmax_1
    bench(repo, rows, "softmax_1", "keep", minutes=30)
    state_path = repo / "workspace/orchestrate.json"
    good = json.loads(state_path.read_text())
    for damage in ["delete", "{ half a json", json.dumps({"version": 1, "visits": "x"})]:
        if damage == "delete":
            state_path.unlink()
        else:
            state_path.write_text(damage)
        out, text, err = run_cli(capsys, "status", *now)
        assert "rebuilt" in err and err.count("\n") == 1
        assert "current: softmax_1" in text
        rebuilt = json.loads(state_path.read_text())
        assert [(v["kernel"], v["first_row"]) for v in rebuilt["visits"]] == \
            [(v["kernel"], v["first_row"]) for v in good["visits"]]
    # stale: someone installed a kernel by hand; kernel.py (HEAD) is the truth
    (repo / "kernel.py").write_text((repo / "workspace/reduce_1.py").read_text())
    git(repo, "commit", "-qam", "by hand")
    _, text, err = run_cli(capsys, "status", *now)
    assert "stale" in err and "current: reduce_1" in text
    # a new plan.json (extract.py ran again) is a new night, not a corrupt file
    plan = dict(PLAN, created="2025-01-02T21:00:00+00:00")
    (repo / "workspace/plan.json").write_text(json.dumps(plan))
    _, text, err = run_cli(capsys, "status", *now)
    assert "corrupt" not in err and "plan.json was rewritten" in err
    assert json.loads(state_path.read_text())["plan_created"] == plan["created"]
    # `install` refuses unknown names, in one line
    _, _, err = run_cli(capsys, "install", "nope", *now, code=2)
    assert "no kernel 'nope'" in err and err.count("\n") == 1


def test_the_night_kernel_is_orchestrates_current_one(repo, capsys):
    """bench.py's night (workspace.night_kernel): the plan entry of the last visit, only while
    orchestrate.json was written for this plan.json; kernel.py must agree with its names."""
    from autokernel import contract
    plan = ak.PLAN_JSON.read_text()
    ak.PLAN_JSON.unlink()
    assert workspace.night_kernel() is None  # no plan: no night
    ak.PLAN_JSON.write_text(plan)
    assert workspace.night_kernel() is None  # a plan, no visit yet
    run_cli(capsys, "next", "--now", T0.isoformat())
    entry = workspace.night_kernel()
    assert entry["name"] == "reduce_1"
    attrs = {"KERNEL_TYPE": "reduce", "KERNEL_NAME": "reduce_1"}
    assert contract.night_disagreement(attrs, entry) is None
    assert "no KERNEL_NAME line" in contract.night_disagreement({"KERNEL_TYPE": "reduce"}, entry)
    assert "KERNEL_NAME = 'reduce'" in contract.night_disagreement(
        dict(attrs, KERNEL_NAME="reduce"), entry)
    assert contract.night_attrs(entry)["KERNEL_NAME"] == "reduce_1"
    ak.PLAN_JSON.write_text(json.dumps(dict(json.loads(plan), created="2026-02-02T00:00:00")))
    assert workspace.night_kernel() is None  # a new plan: a new night, not yet begun


def test_status_projection(repo, capsys):
    run_cli(capsys, "next", "--now", T0.isoformat())
    rows = []
    bench(repo, rows, "reduce_1", "keep", 100)
    bench(repo, rows, "reduce_1", "keep", 50)  # 2x vs the starter (CPU rows: no eager basis)
    _, text, _ = run_cli(capsys, "status", "--now", T0.isoformat())
    # 1 / (1 - 0.5 + 0.3/2 + 0.2/1) = 1.1765
    assert "projected model speedup: 1.176x" in text
    assert "2.00x starter" in text and "not meaningful" in text


def test_results_in_another_format_are_refused_in_one_line(repo, capsys):
    (repo / "results.tsv").write_text("\t".join(results.SEED_COLUMNS) + "\n"
                                      + "\t".join(["1", "reduce_1"] + ["x"] * 8) + "\n")
    _, _, err = run_cli(capsys, "status", "--now", T0.isoformat(), code=2)
    assert err.count("\n") == 1 and "results.tsv is malformed" in err
    write_tsv(repo / "results.tsv", [dict(row(1, "reduce_1"), correctness="MAYBE")])
    _, _, err = run_cli(capsys, "next", "--now", T0.isoformat(), code=2)
    assert err.count("\n") == 1 and "'MAYBE'" in err


def test_cli_errors_are_one_line(tmp_path):
    """The real CLI, as the agent runs it, from a copy without plan.json."""
    (tmp_path / "orchestrate.py").write_text((ak.ROOT / "orchestrate.py").read_text())
    shutil.copytree(ak.ROOT / "autokernel", tmp_path / "autokernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "orchestrate.py", "next"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "plan.json not found" in proc.stderr


def test_a_fresh_plan_and_the_first_next_print_no_note(repo, capsys):
    """extract.py run twice before the first `next` (or after an earlier night's visits with no
    rows): the state is simply started over, without a note."""
    (repo / "workspace/orchestrate.json").write_text(json.dumps(
        {"version": 1, "plan_created": "2024-12-31T21:00:00+00:00",
         "visits": [{"kernel": "reduce_1", "start": T0.isoformat(), "first_row": 0,
                     "left": None}]}))
    out, _, err = run_cli(capsys, "next", "--now", T0.isoformat())
    assert err == "" and (out["action"], out["kernel"]) == ("switch", "reduce_1")


def test_first_next_refuses_to_overwrite_an_edit(repo, capsys):
    (repo / "kernel.py").write_text("someone's edit\n")
    _, _, err = run_cli(capsys, "next", "--now", T0.isoformat(), code=2)
    assert err.count("\n") == 1 and "kernel.py has uncommitted edits" in err
    assert (repo / "kernel.py").read_text() == "someone's edit\n"


# ---------------------------------------------------------------------------------------------
# A CUDA C++ rewrite: a visit of its own, with its own revert budget
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def gpu(monkeypatch):
    """`rewrite` refuses without an NVIDIA GPU; the rest of it needs none."""
    monkeypatch.setattr(ak, "CUDA", True)


def rewrite_after_plateau(repo, capsys, rows, now):
    """reduce_1 installed, kept twice, then 4 reverts (one short of the move-on rule), then
    rewritten in CUDA C++. Returns the Triton best."""
    run_cli(capsys, "next", *now)
    bench(repo, rows, "reduce_1", "keep", 100)
    bench(repo, rows, "reduce_1", "keep", 80)
    for _ in range(4):
        bench(repo, rows, "reduce_1", "revert", 120)
    best = git(repo, "show", "HEAD:kernel.py")
    out, _, _ = run_cli(capsys, "rewrite", *now)
    assert (out["action"], out["kernel"]) == ("rewrite", "reduce_1")
    assert "10 consecutive reverts" in out["reason"]
    return best


def test_a_rewrite_gets_ten_reverts_before_next_moves_on(repo, capsys, gpu):
    now, rows = ["--now", T0.isoformat()], []
    triton_best = rewrite_after_plateau(repo, capsys, rows, now)
    source = (repo / "kernel.py").read_text()
    assert source.startswith(cuda_starter("reduce")) and "KERNEL_NAME = 'reduce_1'" in source
    assert "BENCH_SHAPES = [\n    (64, 1024),\n]" in source and "BENCH_DTYPE = 'fp16'" in source
    assert git(repo, "log", "-1", "--format=%s").strip() == \
        "orchestrate: rewrite reduce_1 in CUDA C++ (from results.tsv row 6)"
    assert git(repo, "status", "--porcelain") == ""
    for i in range(9):  # the CUDA starter and eight edits, each slower than the Triton best
        bench(repo, rows, "reduce_1", "revert", 120)
        out, _, _ = run_cli(capsys, "next", *now)
        assert out["action"] == "stay", out
        assert f"{i + 1} of 10 consecutive reverts (a CUDA rewrite)" in out["reason"]
    bench(repo, rows, "reduce_1", "revert", 120)
    out, _, _ = run_cli(capsys, "next", *now)
    assert (out["action"], out["kernel"]) == ("switch", "softmax_1")
    assert "10 consecutive reverts (limit 10, a CUDA rewrite)" in out["reason"]
    # the rewrite never beat the Triton version: that stays the file of record, not the starter
    assert (repo / "workspace/reduce_1.py").read_text() == triton_best
    state = json.loads((repo / "workspace/orchestrate.json").read_text())
    assert [(v["kernel"], v["first_row"], v.get("rewrite")) for v in state["visits"]] == \
        [("reduce_1", 0, None), ("reduce_1", 6, "cuda"), ("softmax_1", 16, None)]


def test_a_kept_cuda_version_is_the_one_saved(repo, capsys, gpu):
    now, rows = ["--now", T0.isoformat()], []
    rewrite_after_plateau(repo, capsys, rows, now)
    bench(repo, rows, "reduce_1", "keep", 60)  # the CUDA version beat the Triton one
    kept = git(repo, "show", "HEAD:kernel.py")
    out, _, _ = run_cli(capsys, "install", "softmax_1", *now)
    assert (repo / "workspace/reduce_1.py").read_text() == kept and "BACKEND = \"cuda\"" in kept


def test_a_rewrite_visit_survives_a_rebuilt_state(repo, capsys, gpu):
    now, rows = ["--now", T0.isoformat()], []
    rewrite_after_plateau(repo, capsys, rows, now)
    for _ in range(6):
        bench(repo, rows, "reduce_1", "revert", 120, minutes=30)
    (repo / "workspace/orchestrate.json").unlink()
    _, text, err = run_cli(capsys, "status", *now)
    assert "rebuilt" in err
    assert "current: reduce_1: 6 of 10 consecutive reverts (a CUDA rewrite)" in text
    state = json.loads((repo / "workspace/orchestrate.json").read_text())
    assert [(v["first_row"], v.get("rewrite")) for v in state["visits"]] == [(0, None), (6, "cuda")]
    # the budget is a flag, like the other limits
    out, _, _ = run_cli(capsys, "next", "--rewrite-reverts", "6", *now)
    assert out["action"] == "switch" and "limit 6, a CUDA rewrite" in out["reason"]


def test_rewrite_refusals_are_one_line(repo, capsys, monkeypatch):
    now = ["--now", T0.isoformat()]
    _, _, err = run_cli(capsys, "rewrite", *now, code=2)
    assert err.count("\n") == 1 and "run `uv run orchestrate.py next` first" in err
    run_cli(capsys, "next", *now)
    _, _, err = run_cli(capsys, "rewrite", *now, code=2)  # this machine has no GPU
    assert err.count("\n") == 1 and "need an NVIDIA GPU" in err
    assert (repo / "kernel.py").read_text() == (repo / "workspace/reduce_1.py").read_text()
    monkeypatch.setattr(ak, "CUDA", True)
    (repo / "kernel.py").write_text("an edit\n")
    _, _, err = run_cli(capsys, "rewrite", *now, code=2)
    assert err.count("\n") == 1 and "uncommitted edits" in err
    git(repo, "checkout", "-q", "--", "kernel.py")
    run_cli(capsys, "rewrite", *now)
    _, _, err = run_cli(capsys, "rewrite", *now, code=2)
    assert err.count("\n") == 1 and "CUDA C++ already" in err
