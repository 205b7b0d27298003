"""
The kernel's sandbox (autokernel/sandbox.py) and the judge's crash record (autokernel/state.py),
judged through the real `python bench.py` on the CPU interpreter, in repos of their own.

In the sandbox a kernel can write only its scratch directory and /dev, cannot read the judge's
crash record and cannot signal the judge: each attack of tests/attacks/ that writes outside, reads
the record or kills the judge is refused at import (FAIL, named) and changes nothing. Without it
(AUTOKERNEL_SANDBOX=off, as where Landlock is missing) a killed judge is an experiment that
failed: the next bench.py records it as a CRASH, restores the night but never the candidate, and
refuses a crash record the kernel forged.
The source check (autokernel/source_check.py) refuses these attacks before they run; the repos
here are built without it, so the sandbox and the crash record meet them.

    uv run pytest tests/test_sandbox.py
"""
import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel import sandbox
from autokernel.state import KILLED
from test_bench import (ATTACKS, GIT_ENV, GOOD, TAMPERING, UNCONFINED, git, make_repo, run_bench,
                        snapshot, variant)

LANDLOCK = sandbox.landlock_abi()
needs_landlock = pytest.mark.skipif(LANDLOCK[0] is None, reason=f"no Landlock: {LANDLOCK[1]}")
REFUSED = "the sandbox refused it"


# ---- scenarios (each in its own repo; run two at a time by the fixture) ---------------------

def forged_record_scenario(root):
    """Unconfined, a kernel forges the crash record (a kept row of 0.5 us) and kills the judge;
    then the agent's next, honest kernel.py is judged."""
    repo = make_repo(root / "forged_record", source_check=False)
    shutil.copy(ATTACKS / "forges_crash_record.py", repo / "kernel.py")
    killed = run_bench(repo, "-m", "forges the crash record", env=UNCONFINED)
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 1))
    honest = run_bench(repo, "-m", "honest")
    return {"killed": killed, "honest": honest, **snapshot(repo),
            "results_text": (repo / "results.tsv").read_text()}


def kept_repo(root):
    """A repo (no source check) whose kernel.py is kept: the scenarios below start from copies of
    it, one bench.py run for all of them. Returns (the repo, that run)."""
    repo = make_repo(root / "kept", source_check=False)
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 1))
    return repo, run_bench(repo, "-m", "the kept version")


def copy_of(kept, name):
    repo, run = kept
    return shutil.copytree(repo, repo.parent / name, symlinks=True), run


def killed_judge_scenario(root, kept):
    """A kept version; unconfined, a kernel kills the judge; then the agent's next kernel.py."""
    repo, kept = copy_of(kept, "killed_judge")
    before = {"head": git(repo, "rev-parse", "HEAD"),
              "results": (repo / "results.tsv").read_text()}
    shutil.copy(ATTACKS / "kills_the_judge.py", repo / "kernel.py")
    killed = run_bench(repo, "-m", "kills the judge", env=UNCONFINED)
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 2))
    honest = run_bench(repo, "-m", "honest")
    return {"kept": kept, "before": before, "killed": killed, "honest": honest,
            **snapshot(repo), "results_text": (repo / "results.tsv").read_text(),
            "branch": git(repo, "rev-list", "HEAD").split()}


def confined_attacks_scenario(root, kept, names):
    """A kept version, then each attack in turn in the same repo, in the sandbox; $HOME and the
    stand-in for site-packages are folders of this test."""
    repo, kept = copy_of(kept, f"confined_{names[0]}")
    home, site = root / f"home_{names[0]}", root / f"site_{names[0]}"
    home.mkdir()
    site.mkdir()
    env = dict(GIT_ENV, HOME=str(home), AUTOKERNEL_TEST_SITE=str(site))
    before = {"head": git(repo, "rev-parse", "HEAD"),
              "results": (repo / "results.tsv").read_text()}
    attacks = {}
    for name in names:
        shutil.copy(ATTACKS / f"{name}.py", repo / "kernel.py")
        run = run_bench(repo, "-m", f"attack {name}", env=env)
        attacks[name] = {"run": run, **snapshot(repo), "head": git(repo, "rev-parse", "HEAD"),
                         "results_text": (repo / "results.tsv").read_text(),
                         "outside": sorted(str(p.relative_to(root))
                                           for p in [*home.rglob("*"), *site.rglob("*")]
                                           if p.is_file()),
                         "planted": (repo / "json.py").exists()}
    return {"kept": kept, "before": before, "attacks": attacks}


def concurrent_edits_scenario(root, kept):
    """While a confined kernel is judged, someone else edits a tracked file, saves a new one and
    appends a line to results.tsv (the judge's own record)."""
    repo, _ = copy_of(kept, "concurrent_edits")
    (repo / "kernel.py").write_text(variant(GOOD.read_text(), 3))
    proc = subprocess.Popen([sys.executable, "bench.py", "-m", "judged while the user works"],
                            cwd=repo, env=GIT_ENV, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines = []
    while not (lines and lines[-1].startswith("stage_1_smoke")):  # the child runs by now
        lines.append(proc.stdout.readline())
        assert lines[-1] or proc.poll() is None, "".join(lines)
    with open(repo / ".gitignore", "a") as f:
        f.write("# the user's edit\n")
    (repo / "notes.md").write_text("the user's new file\n")
    with open(repo / "results.tsv", "a") as f:
        f.write("a line someone else wrote\n")
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    return {"rc": proc.returncode, "out": out, **snapshot(repo),
            "gitignore": (repo / ".gitignore").read_text(),
            "notes": (repo / "notes.md").read_text() if (repo / "notes.md").exists() else None,
            "results_text": (repo / "results.tsv").read_text()}


CONFINED = (["kills_the_judge", "forges_crash_record", "writes_outside_the_repo"], TAMPERING)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        forged = pool.submit(forged_record_scenario, root)  # beside the kept repo's run
        kept = kept_repo(root)
        jobs = {"killed_judge": (killed_judge_scenario, root, kept)}
        if LANDLOCK[0] is not None:
            for names in CONFINED:
                jobs[f"confined:{names[0]}"] = (confined_attacks_scenario, root, kept, names)
            jobs["concurrent_edits"] = (concurrent_edits_scenario, root, kept)
        futures = {name: pool.submit(job[0], *job[1:]) for name, job in jobs.items()}
        return {"forged_record": forged.result(),
                **{name: future.result() for name, future in futures.items()}}


# ---- the sandbox ----------------------------------------------------------------------------

@needs_landlock
def test_what_another_process_changes_during_a_confined_run_is_left_but_the_nights_record(runs):
    """The kernel's process could not write the repo, so the edits are the user's: the tracked
    file keeps its edit and the new file stays (named on a note line), while results.tsv, which
    only the judge writes, is put back and the run is not kept."""
    run = runs["concurrent_edits"]
    assert run["rc"] == 1 and "Traceback" not in run["out"], run["out"]  # 1: a FAIL verdict
    assert run["gitignore"].endswith("# the user's edit\n")
    assert run["notes"] == "the user's new file\n"
    note = next(line for line in run["out"].splitlines() if "another process" in line)
    assert note.startswith("note: ") and ".gitignore" in note and "notes.md" in note, note
    assert "results.tsv" not in note
    assert "a line someone else wrote" not in run["results_text"]
    row = run["results"].iloc[-1]
    assert row["status"] == "revert" and row["correctness"] == "FAIL", row
    assert row["reason"].startswith("results.tsv changed during the run, not by the kernel's"), \
        row["reason"]
    assert run["commits"] == 2 and run["kernel"] == run["committed_kernel"]  # reverted


@needs_landlock
def test_a_confined_process_writes_only_its_scratch_and_dev(tmp_path):
    """The rules themselves, in a process of their own: writes outside the scratch directory,
    reading the judge's private directory and signalling the parent are refused."""
    private, scratch = tmp_path / "judge", tmp_path / "scratch"
    private.mkdir()
    scratch.mkdir()
    (private / "record").write_text("the judge's")
    probe = f"""
import os, sys
from autokernel import sandbox
sandbox.confine({{"abi": {LANDLOCK[0]}, "scratch": {str(scratch)!r}, "private": {str(private)!r}}})
def tried(what, fn):
    try:
        fn()
        print(what, "allowed")
    except OSError as e:
        print(what, "refused", e.errno)
tried("scratch", lambda: open({str(scratch / "ok")!r}, "w").close())
tried("devnull", lambda: open("/dev/null", "w").write("x"))
tried("beside", lambda: open({str(tmp_path / "beside")!r}, "w").close())
tried("record", lambda: open({str(private / "record")!r}).read())
tried("repo", lambda: open({str(Path(sandbox.__file__))!r}).read())
tried("parent", lambda: os.kill(os.getppid(), 0))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=Path(sandbox.__file__).parent.parent, timeout=60)
    said = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert said == {"scratch": "allowed", "devnull": "allowed", "beside": "refused 13",
                    "record": "refused 13", "repo": "allowed",
                    "parent": "refused 1" if LANDLOCK[0] >= 6 else "allowed"}, out.stderr
    assert not (tmp_path / "beside").exists()


def test_only_an_abi_that_handles_truncate_seals_the_repo():
    """Before Landlock ABI 3 a confined process could still truncate(2) a path: there the judge
    keeps putting the whole checkout back after a run (autokernel/experiment.py)."""
    assert [sandbox.seals_the_repo({"abi": abi}) for abi in (None, 1, 2, 3, 7)] == \
        [False, False, False, True, True]


def test_rights_the_running_abi_does_not_know_are_dropped():
    assert sandbox.rights_of(1) == (1 << 13) - 1
    assert sandbox.rights_of(2) & sandbox.REFER and not sandbox.rights_of(2) & sandbox.TRUNCATE
    assert sandbox.rights_of(4) & sandbox.TRUNCATE and not sandbox.rights_of(4) & sandbox.IOCTL_DEV
    assert sandbox.rights_of(7) == (1 << 16) - 1


def test_every_entry_beside_the_way_to_the_private_directory_is_readable(tmp_path):
    (tmp_path / "repo" / "workspace" / "judge").mkdir(parents=True)
    (tmp_path / "repo" / "kernel.py").write_text("")
    (tmp_path / "repo" / "workspace" / "plan.json").write_text("")
    (tmp_path / "repo" / "back_onto_the_way").symlink_to(tmp_path / "repo")
    granted = dict(sandbox.rules(tmp_path / "repo" / "workspace" / "judge", tmp_path / "s"))
    assert granted["/"] == sandbox.READ_DIR  # listing only: Python's imports list folders
    assert granted[str(tmp_path / "repo" / "kernel.py")] == sandbox.READ
    assert granted[str(tmp_path / "repo" / "workspace" / "plan.json")] == sandbox.READ
    assert granted[str(tmp_path / "s")] == granted["/dev"] == sandbox.WRITE
    on_the_way = [tmp_path, tmp_path / "repo", tmp_path / "repo" / "workspace"]
    assert not any(str(p) in granted for p in on_the_way)
    assert str(tmp_path / "repo" / "workspace" / "judge") not in granted
    assert str(tmp_path / "repo" / "back_onto_the_way") not in granted


@needs_landlock
def test_a_kernel_cannot_write_outside_its_sandbox(runs):
    """$HOME, the user's site-packages and the venv's (a stand-in): refused, nothing written."""
    a = runs["confined:kills_the_judge"]["attacks"]["writes_outside_the_repo"]
    assert a["run"]["keys"]["correctness"] == "FAIL", a["run"]["stdout"]
    assert REFUSED in a["run"]["keys"]["reason"] and "Permission denied" in \
        a["run"]["keys"]["reason"]
    assert a["outside"] == [], a["outside"]


@needs_landlock
def test_a_kernel_can_neither_kill_the_judge_nor_read_its_crash_record(runs):
    r = runs["confined:kills_the_judge"]
    assert r["kept"]["keys"]["status"] == "keep", r["kept"]["stdout"]
    for name, errno_text in (("kills_the_judge", "Operation not permitted"),
                             ("forges_crash_record", "Permission denied")):
        a = r["attacks"][name]
        run = a["run"]
        assert run["rc"] == 0, (name, run["stderr"][-2000:])
        assert run["keys"]["correctness"] == "FAIL" and run["keys"]["status"] == "revert"
        assert REFUSED in run["keys"]["reason"] and errno_text in run["keys"]["reason"], name
        assert run["keys"]["sandbox"].startswith("landlock ABI"), run["stdout"]
        assert a["head"] == r["before"]["head"] and a["status"] == "", name
        assert a["results_text"].startswith(r["before"]["results"]), name
        assert "forged" not in a["results_text"] and "CRASH" not in a["results_text"], name


@needs_landlock
def test_tampering_attacks_are_refused_by_the_sandbox_and_change_nothing(runs):
    r = runs[f"confined:{TAMPERING[0]}"]
    before = r["before"]
    for name in TAMPERING:
        a = r["attacks"][name]
        run = a["run"]
        assert run["rc"] == 0, (name, run["stderr"][-2000:])
        assert run["keys"]["correctness"] == "FAIL" and run["keys"]["status"] == "revert", \
            (name, run["stdout"])
        if name != "moves_branch":  # git's own refusal is its exit status
            assert REFUSED in run["keys"]["reason"], (name, run["stdout"])
        assert "the kernel's process changed" not in run["keys"]["reason"], name  # prevented
        assert a["head"] == before["head"] and a["status"] == "" and not a["planted"], name
        assert a["results_text"].startswith(before["results"]), name


# ---- a killed judge, unconfined -------------------------------------------------------------

def test_a_forged_crash_record_is_refused_and_the_killed_run_is_a_crash(runs):
    r = runs["forged_record"]
    assert r["killed"]["rc"] == -9, r["killed"]["stdout"]  # the judge died without a verdict
    honest = r["honest"]
    assert honest["rc"] == 0, honest["stderr"][-2000:]
    assert "the crash record of a killed bench.py is refused and not applied: it holds rows " \
           "results.tsv does not have" in honest["stdout"], honest["stdout"]
    assert "forged" not in r["results_text"] and "0.5" not in list(r["results"]["latency_us"])
    rows = r["results"]
    assert list(rows["correctness"]) == ["CRASH", "PASS"], r["results_text"]
    assert rows.iloc[0]["reason"] == KILLED and rows.iloc[0]["status"] == "revert"
    assert rows.iloc[0]["description"] == "forges the crash record"
    assert list(rows["experiment"]) == [1, 2]
    assert honest["keys"]["correctness"] == "PASS" and honest["keys"]["status"] == "keep"
    assert r["committed_kernel"] == variant(GOOD.read_text(), 1) and r["status"] == ""


def test_a_killed_judge_is_recorded_as_a_crash_and_its_candidate_never_judged_again(runs):
    r = runs["killed_judge"]
    assert r["kept"]["keys"]["status"] == "keep", r["kept"]["stdout"]
    assert r["killed"]["rc"] == -9, r["killed"]["stdout"]
    honest = r["honest"]
    assert honest["rc"] == 0, honest["stderr"][-2000:]
    assert "note: a bench.py killed mid-run left changes; restored:" in honest["stdout"]
    assert f"experiment 2 recorded as CRASH: {KILLED}" in honest["stdout"]
    # the agent's kernel.py was judged, not the candidate of the killed run
    assert honest["keys"]["correctness"] == "PASS", honest["stdout"]
    assert r["results_text"].startswith(r["before"]["results"])
    rows = r["results"]
    assert list(rows["correctness"]) == ["PASS", "CRASH", "PASS"]
    assert (rows.iloc[1]["reason"], rows.iloc[1]["status"]) == (KILLED, "revert")
    assert rows.iloc[1]["tag"] == "reduce" and rows.iloc[1]["latency_us"] == ""
    # the kept commit is still on the branch (the honest run may add a keep of its own)
    assert r["before"]["head"].strip() in r["branch"] and r["status"] == ""
    assert r["kernel"] in (variant(GOOD.read_text(), 1), variant(GOOD.read_text(), 2))


def test_the_scratch_directories_are_pruned_to_the_most_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "SCRATCH_ROOT", tmp_path)
    for i in range(5):
        (tmp_path / f"d{i}").mkdir()
        os.utime(tmp_path / f"d{i}", (i, i))
    sandbox.prune(keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d3", "d4"]
