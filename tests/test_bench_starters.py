"""bench_starters.py on a CPU: a correct, a wrong, a missing and a crashing starter each become
the row they should; a dead child costs one row, not the run; goals are judged from the numbers."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autokernel
import bench_starters

ROOT = Path(__file__).resolve().parent.parent

SOFTMAX_OK = '''
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"


@triton.jit
def _softmax_rows(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * N + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty),
             mask=cols < N)


def kernel_fn(x):
    y = torch.empty_like(x)
    _softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''

REDUCE_WRONG = '''
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"


@triton.jit
def _row_max(x_ptr, y_ptr, N, BLOCK: tl.constexpr):  # a max, where a sum is asked for
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    tl.store(y_ptr + row, tl.max(x, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x, dim=-1):
    y = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    _row_max[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''

RMSNORM_CRASHES_ON_3_ROWS = '''
import os
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"


@triton.jit
def _rmsnorm_rows(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def kernel_fn(x, weight, eps=1e-6):
    if x.shape[0] == 3:
        os._exit(3)  # like a segfault: the process is gone, nothing is raised
    y = torch.empty_like(x)
    _rmsnorm_rows[(x.shape[0],)](x, weight, y, x.shape[1], eps,
                                 BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
'''


@pytest.fixture
def kernels_dir(tmp_path):
    path = tmp_path / "kernels"
    path.mkdir()
    for name, source in [("softmax", SOFTMAX_OK), ("reduce", REDUCE_WRONG),
                         ("rmsnorm", RMSNORM_CRASHES_ON_3_ROWS)]:
        (path / f"{name}.py").write_text(textwrap.dedent(source))
    return path  # no layernorm.py: the missing starter


def test_cli_rows_and_outputs(tmp_path, kernels_dir):
    out = tmp_path / "report" / "starters.md"
    result = subprocess.run(
        [sys.executable, "bench_starters.py", "--types", "softmax,reduce,layernorm",
         "--kernels-dir", str(kernels_dir), "--out", str(out)], cwd=ROOT,
        env=dict(os.environ, AUTOKERNEL_WORKSPACE=str(autokernel.WORKSPACE)),  # the session's
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]  # not every row passed
    assert "[softmax 64x1024 fp16] check PASS" in result.stdout  # progress lines
    rows = {row["kernel"]: row for row in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert list(rows) == ["softmax", "reduce", "layernorm"]

    softmax = rows["softmax"]
    assert softmax["status"] == "PASS" and softmax["starter_us"] > 0 and softmax["eager_us"] > 0
    assert softmax["shape"] == list(autokernel.KERNEL_TYPES["softmax"].cpu_shapes["primary"])
    assert softmax["goal"] == "n/a (CPU timings)" and softmax["x_eager"] > 0

    reduce = rows["reduce"]  # wrong: no speed number, the baselines still measured
    assert reduce["status"] == "FAIL" and reduce["starter_us"] is None
    assert "elements off" in reduce["reason"] and reduce["eager_us"] > 0

    layernorm = rows["layernorm"]
    assert layernorm["status"] == "MISSING" and "layernorm.py" in layernorm["reason"]
    assert layernorm["eager_us"] > 0

    table = out.with_suffix(".md").read_text()
    assert "NOT meaningful" in table and "| kernel | shape | dtype | starter us |" in table
    assert "| reduce | 64x1024 | fp16 | FAIL |" in table
    assert "| layernorm | 64x1024 | fp16 | MISSING |" in table
    assert table in result.stdout


def test_bad_types_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_starters.main(["--types", "softmx"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "softmx" in err and err.strip().count("\n") == 0


def test_a_crashed_row_does_not_take_the_rest(tmp_path, kernels_dir, monkeypatch):
    # Two rows: the child dies on the first (3 rows), a fresh child runs the second.
    monkeypatch.setattr(bench_starters, "bench_cases",
                        lambda ktype: [((3, 64), "fp16"), ((2, 64), "fp16")])
    rows = bench_starters.bench_type(autokernel.KERNEL_TYPES["rmsnorm"], kernels_dir, None, 120,
                                     tmp_path)
    assert rows[0]["status"] == "CRASH" and "exit code 3" in rows[0]["reason"]
    assert "during check" in rows[0]["reason"]
    assert rows[1]["status"] == "PASS" and rows[1]["starter_us"] > 0
    assert rows[1]["library_us"] > 0 and rows[1]["library"] == "F.rms_norm"


def test_timeout_kills_the_child(tmp_path):
    """The child is killed at the limit, not waited for: it is gone when run_child returns."""
    pidfile = tmp_path / "pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    status, why = bench_starters.run_child([sys.executable, "-c", code], 5.0, tmp_path / "err")
    assert status == "TIMEOUT" and "5 s" in why
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_failed_compile_is_a_note_not_a_crash(kernels_dir, monkeypatch):
    import torch

    def broken_compile(*args, **kwargs):
        raise RuntimeError("inductor exploded\ntraceback...")
    monkeypatch.setattr(torch, "compile", broken_compile)
    ktype = autokernel.KERNEL_TYPES["softmax"]
    module, why_not = bench_starters.load_starter(ktype, kernels_dir / "softmax.py")
    row = bench_starters.new_row(ktype, (2, 32), "fp16", kernels_dir / "softmax.py")
    bench_starters.measure_row(ktype, module, why_not, row, "max-autotune-no-cudagraphs",
                               lambda: None)
    assert row["status"] == "PASS" and row["phase"] == "done" and row["starter_us"] > 0
    assert row["compile_us"] is None
    assert row["compile_error"] == "RuntimeError: inductor exploded ... traceback..."  # one line


def _timed_row(kernel, shape, dtype="fp16", **times):
    row = bench_starters.new_row(autokernel.KERNEL_TYPES[kernel], shape, dtype, "k.py")
    row.update({"status": "PASS", **times})
    return row


def test_goals(monkeypatch):
    monkeypatch.setattr(autokernel, "TIMING_MEANINGFUL", True)
    ceilings = {"bandwidth_gb_s": 3000.0, "tflops": {"fp16": 700.0, "bf16": 700.0},
                "spec": {"name": "H100 SXM", "fp16_tflops": 989.4, "bandwidth_gb_s": 3350.0}}
    judge = lambda kernel, row: bench_starters.judge(autokernel.KERNEL_TYPES[kernel], row, ceilings)

    # softmax 8192x8192 fp16 moves 256 MiB: 100 us is 2684 GB/s = 89% of 3000 GB/s.
    slow = judge("softmax", _timed_row("softmax", (8192, 8192), starter_us=100.0,
                                       eager_us=271.0, compile_us=126.0))
    assert slow["goal_met"] is False and slow["goal"].startswith("NOT met: 89% of copy")
    fast = judge("softmax", _timed_row("softmax", (8192, 8192), starter_us=95.0, eager_us=271.0,
                                       compile_us=126.0))
    assert fast["goal_met"] is True and fast["pct_ceiling"] == pytest.approx(94.2, abs=0.1)
    assert fast["x_compile"] == pytest.approx(126 / 95) and fast["pct_same_copy"] is None
    # a copy of the same 256 MiB took 90 us: the starter runs at 90/95 of that copy's speed
    same = judge("softmax", _timed_row("softmax", (8192, 8192), starter_us=95.0, copy_us=90.0))
    assert same["pct_same_copy"] == pytest.approx(100 * 90 / 95)
    no_compile = judge("softmax", _timed_row("softmax", (8192, 8192), starter_us=95.0))
    assert no_compile["goal_met"] is None and "compile" in no_compile["goal"]

    matmul = judge("matmul", _timed_row("matmul", (4096, 4096, 4096), starter_us=210.0,
                                        library_us=190.0, library="cuBLAS"))
    assert matmul["goal_met"] is True and "0.90x library" in matmul["goal"]
    assert matmul["tflops"] == pytest.approx(2 * 4096 ** 3 / 210e-6 / 1e12)
    assert matmul["pct_ceiling"] == pytest.approx(93.5, abs=0.1) and not matmul["above_ceiling"]
    # 180 us is 764 TFLOP/s, above the measured 700: capped at 100%, flagged, never 109%
    beats = judge("matmul", _timed_row("matmul", (4096, 4096, 4096), starter_us=180.0,
                                       library_us=190.0, library="cuBLAS"))
    assert beats["pct_ceiling"] == 100.0 and beats["above_ceiling"]
    mlp = judge("fused_mlp", _timed_row("fused_mlp", (2048, 4096, 11008), starter_us=1000.0,
                                        eager_us=920.0))
    assert mlp["goal_met"] is False and mlp["goal"].startswith("NOT met: 0.92x eager")
    wrong = judge("matmul", _timed_row("matmul", (64, 64, 64), status="FAIL", library_us=5.0))
    assert wrong["goal_met"] is False and "FAIL" in wrong["goal"]


def test_extra_cases_are_design_rows():
    for name, cases in bench_starters.EXTRA_CASES.items():
        ktype = autokernel.KERNEL_TYPES[name]
        for shape, dtype in cases:
            assert len(shape) == len(ktype.shape_names) and dtype in autokernel.DTYPES
    assert set(bench_starters.GOALS) <= set(autokernel.KERNEL_TYPES)
    assert all(autokernel.KERNEL_TYPES[name].bound == "compute" for name in bench_starters.GOALS)


def test_markdown_for_gpu_rows(monkeypatch):
    monkeypatch.setattr(autokernel, "TIMING_MEANINGFUL", True)
    ceilings = {"bandwidth_gb_s": 3000.0, "tflops": {"fp16": 700.0},
                "spec": {"name": "H100 SXM", "fp16_tflops": 989.4, "bandwidth_gb_s": 3350.0}}
    judge = bench_starters.judge
    rows = [judge(autokernel.KERNEL_TYPES[kernel], row, ceilings) for kernel, row in [
        ("softmax", _timed_row("softmax", (8192, 8192), starter_us=95.0, eager_us=271.0,
                               compile_us=126.0, copy_us=93.1)),
        ("flash_attention", _timed_row("flash_attention", (2, 32, 2048, 128), starter_us=200.0,
                                       eager_us=2703.0, library_us=151.0, library="SDPA",
                                       compile_error="RuntimeError: boom")),
        ("matmul", _timed_row("matmul", (64, 64, 64), status="CRASH",
                              reason="CRASH: child killed by SIGSEGV (during check)"))]]
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": "3.6.0",
            "compile_mode": "max-autotune-no-cudagraphs", "timing_meaningful": True,
            "ceilings": ceilings, "seconds": 412.0}
    table = bench_starters.markdown(rows, meta)
    assert "mode=max-autotune-no-cudagraphs" in table and "do_bench medians" in table
    assert ("| softmax | 8192x8192 | fp16 | 95.0 | 271.0 | 126.0 | - | 2,826 GB/s | 94% | "
            "98% (93.1 us) | 2.85x "
            "| 1.33x | - | met: 94% of copy (>= 90), 1.33x compile (> 1) |") in table
    assert "| 151.0 (SDPA) |" in table and "NOT met: 0.76x library (>= 1.0)" in table
    assert "| matmul | 64x64x64 | fp16 | CRASH |" in table
    assert "- flash_attention 2x32x2048x128 fp16: compile: RuntimeError: boom" in table
    assert "SIGSEGV (during check)" in table and "NOT meaningful" not in table
