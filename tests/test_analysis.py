"""analysis.py on synthetic results.tsv files: the plot, the summary, the projection, bad input."""
import json
import math

import matplotlib.image
import pytest
import torch

import analysis
import autokernel as ak
from autokernel import results
from autokernel.cli import run_main
from test_orchestrate import PLAN, row, write_tsv


def run(capsys, *argv, code=0):
    assert run_main("analysis.py", analysis.main, list(argv)) == code
    return capsys.readouterr()


def night():
    """Two kernels on an H100-like night: keeps, slower reverts, failures of every kind."""
    rows, n = [], 0
    for tag, lats in [("reduce_1", [100, 80, None, 90, 60, None, 70]),
                      ("softmax_1", [200, None, 150, 160, 100])]:
        for i, lat in enumerate(lats):
            n += 1
            if lat is None:
                rows.append(row(n, tag, "revert", correctness=["FAIL", "TIMEOUT", "CRASH"][n % 3]))
            else:
                best = min([x for x in lats[:i] if x] or [math.inf])
                rows.append(row(n, tag, "keep" if lat < best else "revert", lat,
                                speedup=120.0 / lat, pct=30.0 * 100 / lat))
    return rows


def test_plot_summary_and_projection(tmp_path, capsys):
    write_tsv(tmp_path / "results.tsv", night())
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    out = run(capsys, "--results", str(tmp_path / "results.tsv"), "--plan",
              str(tmp_path / "plan.json"), "--out", str(tmp_path / "progress.png")).out
    image = matplotlib.image.imread(tmp_path / "progress.png")
    assert image.shape[0] > 200 and image.shape[1] > 800  # two panels side by side
    table = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert "2.00x eager" in table["reduce_1"] and "1.20x eager" in table["softmax_1"]
    assert " 7 " in table["reduce_1"] and "60.0" in table["reduce_1"]
    # GB/s from the latency and reduce's byte count at 64x1024 fp16 (not the rounded column)
    gb_s = ak.KERNEL_TYPES["reduce"].bytes((64, 1024), torch.float16) / 1e3 / 60.0
    assert f"{gb_s:.4g} GB/s" in table["reduce_1"]
    # Amdahl: 1 / (1 - 0.5 + 0.3/2 + 0.2/1.2)
    assert f"projected model speedup: {1 / (0.5 + 0.15 + 0.2 / 1.2):.3f}x" in out


def test_without_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ak, "PLAN_JSON", tmp_path / "no-plan.json")
    path = tmp_path / "results.tsv"
    write_tsv(path, night())
    out = run(capsys, "--results", str(path), "--out", str(tmp_path / "p.png")).out
    assert "n/a" in out and (tmp_path / "p.png").stat().st_size > 10_000
    assert "2.00x eager" in out


def test_last_rows_as_a_table(tmp_path, capsys):
    path = tmp_path / "results.tsv"
    write_tsv(path, night())
    out = run(capsys, "--results", str(path), "--last", "3", "--out", str(tmp_path / "p.png")).out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["exp", "tag", "latency_us"] and len(lines) == 4
    assert [line.split()[0] for line in lines[1:]] == ["10", "11", "12"]
    assert "exp 12" in lines[-1] and "softmax_1" in lines[-1] and "keep" in lines[-1]
    assert not (tmp_path / "p.png").exists()  # --last only prints


@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    ("", "empty"),
    ("\t".join(results.COLUMNS) + "\n", "no experiments yet"),
    ("\t".join(results.SEED_COLUMNS) + "\n", "malformed"),
    ("a\tb\n1\t2\t3\t4\n", "malformed"),
])
def test_bad_results_one_line_error(tmp_path, capsys, content, message):
    path = tmp_path / "results.tsv"
    if content is not None:
        path.write_text(content)
    err = run(capsys, "--results", str(path), "--out", str(tmp_path / "p.png"), code=2).err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "p.png").exists()


def test_missing_plan_named_explicitly(tmp_path, capsys):
    write_tsv(tmp_path / "results.tsv", night())
    err = run(capsys, "--results", str(tmp_path / "results.tsv"), "--plan",
              str(tmp_path / "nope.json"), code=2).err
    assert err.count("\n") == 1 and "not found" in err


def test_a_kept_row_that_git_does_not_back_is_marked(tmp_path, capsys):
    """A forged or rewritten history: the row says keep, but no commit of this repo holds it."""
    from autokernel.results import COLUMNS, append_row
    path = tmp_path / "results.tsv"
    append_row(dict.fromkeys(COLUMNS, "") | {
        "experiment": 1, "tag": "softmax_1", "kernel_type": "softmax", "latency_us": "1.0",
        "correctness": "PASS", "status": "keep", "commit": "0000000", "timing_valid": "False",
        "kernel_sha256": "0" * 64}, path)
    assert analysis.main(["--results", str(path), "--last", "1"]) in (None, 0)
    out = capsys.readouterr()
    assert "keep!" in out.out and "experiment 1 is marked kept but its commit 0000000" in out.err


@pytest.mark.parametrize("n", ["0", "-3"])
def test_last_needs_a_positive_count(tmp_path, capsys, n):
    write_tsv(tmp_path / "results.tsv", night())
    err = run(capsys, "--results", str(tmp_path / "results.tsv"), "--last", n, code=2).err
    assert err.count("\n") == 1 and "1 or more" in err
