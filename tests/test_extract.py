"""extract.py: merging by kernel type, BENCH_SHAPES in loadable kernel files (the model's real
shapes on a GPU, scaled down with their traits kept in CPU mode), plan.json in priority order,
skips with reasons, one-line errors; and the README's main job end to end in a copy of the repo
(`profile.py` with no arguments, then `extract.py --top 5`) on a CPU."""
import json
import shutil
import subprocess
import sys

import pytest

import autokernel
from autokernel.cli import run_main
from autokernel.contract import load_module

extract = load_module(autokernel.ROOT / "extract.py", "extract_under_test")


def run(argv):
    """extract.py's exit code, as `uv run extract.py ARGV` would return it."""
    return run_main("extract.py", extract.main, argv)

PROFILE = {
    "model": "tiny test model", "dtype": "fp16", "device": "cuda", "input_shapes": [[2, 8]],
    "total_op_us": 100.0,
    "entries": [
        {"name": "aten::linear", "group": "matmul", "kernel_type": "matmul", "time_us": 40.0,
         "share": 0.4, "bound": "compute", "note": "",
         "shape_detail": [{"shape": [16, 64, 32], "time_us": 10.0, "calls": 2},
                          {"shape": [16, 101, 32], "time_us": 30.0, "calls": 1}]},
        {"name": "SwiGLU", "group": "fused_mlp", "kernel_type": "fused_mlp", "time_us": 30.0,
         "share": 0.3, "bound": "compute", "note": "",
         "shape_detail": [{"shape": [16, 32, 48], "time_us": 30.0, "calls": 2}]},
        {"name": "aten::add", "group": "elementwise", "kernel_type": None, "time_us": 10.0,
         "share": 0.1, "bound": "memory", "note": "", "shape_detail": []},
        {"name": "aten::matmul", "group": "matmul", "kernel_type": "matmul", "time_us": 8.0,
         "share": 0.08, "bound": "compute", "note": "",
         "shape_detail": [{"shape": [16, 64, 32], "time_us": 8.0, "calls": 1}]},
        {"name": "aten::scaled_dot_product_attention", "group": "flash_attention",
         "kernel_type": "flash_attention", "time_us": 7.0, "share": 0.07, "bound": "n/a",
         "note": "attention with an explicit mask", "shape_detail": []},
        {"name": "aten::softmax", "group": "softmax", "kernel_type": "softmax", "time_us": 5.0,
         "share": 0.05, "bound": "memory", "note": "",
         "shape_detail": [{"shape": [64, 8], "time_us": 5.0, "calls": 1}]},
    ],
}


def starter(ktype):
    return (f'"""test starter"""\nKERNEL_TYPE = "{ktype}"\nBACKEND = "triton"\n\n\n'
            "def kernel_fn(*args, **kwargs):\n    raise NotImplementedError('test starter')\n")


@pytest.fixture
def setup(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for ktype in ("matmul", "fused_mlp", "softmax"):
        (kernels / f"{ktype}.py").write_text(starter(ktype))
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    ws = tmp_path / "ws"
    return tmp_path, ["--profile", str(prof), "--workspace", str(ws), "--kernels-dir",
                      str(kernels)], ws


def test_writes_kernels_and_plan_in_priority_order(setup, capsys):
    tmp_path, args, ws = setup
    assert run(["--top", "5"] + args) == 0
    out = capsys.readouterr().out
    assert "skipped aten::scaled_dot_product_attention (flash_attention): attention with an " \
           "explicit mask" in out
    plan = json.loads((ws / "plan.json").read_text())
    assert plan["model"] == "tiny test model" and plan["created"]
    names = [k["name"] for k in plan["kernels"]]
    assert names == ["matmul_1", "fused_mlp_2", "softmax_3"]  # flash_attention: no shape
    matmul = plan["kernels"][0]
    # aten::linear and aten::matmul merged: 16x64x32 adds up to 10 + 8 = 18 us, still behind
    # the 30 us of 16x101x32, which stays first (the timed primary shape).
    assert matmul["shapes"] == [[16, 101, 32], [16, 64, 32]]
    assert abs(matmul["share"] - 0.48) < 1e-9 and abs(matmul["amdahl_ceiling"] - 1 / 0.52) < 1e-9
    assert matmul["ops"] == ["aten::linear", "aten::matmul"] and matmul["bound"] == "compute"
    assert [k["share"] for k in plan["kernels"]] == sorted((k["share"] for k in plan["kernels"]),
                                                           reverse=True)
    assert plan["cpu_scaled"] is True  # the tests run on a CPU
    # 101 does not fit under matmul's CPU cap of 64 for N: 53 keeps its remainder mod 16
    assert matmul["bench_shapes"] == [[16, 53, 32], [16, 64, 32]]
    for row in plan["kernels"]:
        assert set(row) >= {"name", "kernel_type", "file", "shapes", "bench_shapes", "dtype",
                            "share", "time_us", "amdahl_ceiling", "bound"}
        module = load_module(row["file"])
        assert module.KERNEL_TYPE == row["kernel_type"] and module.KERNEL_NAME == row["name"]
        assert module.BENCH_SHAPES == [tuple(s) for s in row["bench_shapes"]]
        assert module.BENCH_DTYPE == "fp16" and callable(module.kernel_fn)
        text = (ws / f"{row['name']}.py").read_text()
        real = ", ".join("x".join(map(str, s)) for s in row["shapes"])
        assert "CPU mode" in " ".join(text.split()) and real in " ".join(
            line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))


def test_gpu_extraction_keeps_the_real_shapes(setup, monkeypatch):
    _, args, ws = setup
    monkeypatch.setattr(autokernel, "CUDA", True)
    assert run(["--top", "5"] + args) == 0
    plan = json.loads((ws / "plan.json").read_text())
    assert plan["cpu_scaled"] is False
    for row in plan["kernels"]:
        assert row["bench_shapes"] == row["shapes"]
        text = (ws / f"{row['name']}.py").read_text()
        assert "CPU mode" not in text
        assert load_module(row["file"]).BENCH_SHAPES == [tuple(s) for s in row["shapes"]]


@pytest.mark.parametrize("size, cap, want", [
    (32, 64, 32),          # fits: unchanged
    (768, 64, 64),         # a multiple of 16 stays one
    (50257, 5000, 4993),   # a GPT-2 vocabulary: 1 mod 16, odd
    (50257, 64, 49),
    (32000, 4096, 4096),
    (1023, 128, 127),      # 15 mod 16
    (12, 2, 2), (25, 2, 1),  # caps under 16 keep the parity
    (4097, 1, 1),
])
def test_shrink_keeps_alignment_and_parity(size, cap, want):
    assert extract.shrink(size, cap) == want


def test_cpu_shapes_stay_within_each_types_own_cpu_shapes():
    for name, ktype in autokernel.KERNEL_TYPES.items():
        caps = extract.cpu_caps(ktype)
        real = [d * 97 + 13 for d in ktype.gpu_shapes["primary"]]  # odd, huge
        scaled = extract.cpu_shape(ktype, real)
        assert all(1 <= d <= c for d, c in zip(scaled, caps)), name
        assert all(d % 2 == r % 2 for d, r in zip(scaled, real)), name


def test_top_and_types_filters(setup):
    _, args, ws = setup
    assert run(["--top", "1", "--types", "softmax,fused_mlp"] + args) == 0
    plan = json.loads((ws / "plan.json").read_text())
    assert [k["name"] for k in plan["kernels"]] == ["fused_mlp_1"]


def test_missing_starter_is_a_one_line_error_for_that_entry(setup, capsys):
    tmp_path, args, ws = setup
    (tmp_path / "kernels" / "fused_mlp.py").unlink()
    assert run(["--top", "3"] + args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fused_mlp.py is missing" in err[0]
    plan = json.loads((ws / "plan.json").read_text())
    assert [k["kernel_type"] for k in plan["kernels"]] == ["matmul", "softmax"]


def test_agent_work_is_not_overwritten_without_force(setup, capsys):
    _, args, ws = setup
    assert run(["--top", "1"] + args) == 0
    assert run(["--top", "1"] + args) == 0          # same content: fine
    (ws / "matmul_1.py").write_text("# the agent's improved kernel\n")
    assert run(["--top", "1"] + args) == 1
    assert "pass --force" in capsys.readouterr().err
    assert (ws / "matmul_1.py").read_text() == "# the agent's improved kernel\n"
    assert run(["--top", "1", "--force"] + args) == 0
    assert "BENCH_SHAPES" in (ws / "matmul_1.py").read_text()


def test_extract_again_mid_night_leaves_the_plan_and_the_names_alone(setup, capsys):
    """Run again while a kernel file holds the night's work: that file is not overwritten, the
    plan is not rewritten without it, and no other kernel is renamed into its rank."""
    _, args, ws = setup
    assert run(["--top", "3"] + args) == 0
    plan = (ws / "plan.json").read_text()
    (ws / "matmul_1.py").write_text("# the agent's kept kernel\n")
    assert run(["--top", "3"] + args) == 1
    err = capsys.readouterr().err
    assert "left as it was" in err and "pass --force" in err
    assert (ws / "plan.json").read_text() == plan
    assert (ws / "matmul_1.py").read_text() == "# the agent's kept kernel\n"
    assert not (ws / "fused_mlp_1.py").exists()


@pytest.mark.parametrize("extra, message", [
    (["--types", "softmax,bogus"], "unknown kernel type 'bogus'"),
    (["--top", "0"], "--top must be >= 1"),
    (["--profile", "/no/such/profile.json"], "run `uv run profile.py` first"),
])
def test_bad_input_one_line_error(setup, capsys, extra, message):
    _, args, _ = setup
    assert run(args + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_main_job_from_a_fresh_copy(tmp_path):
    """`uv run profile.py` (no arguments: the default model on a CPU), then
    `uv run extract.py --top 5`, in a copy of the repo with an empty workspace."""
    for name in ("profile.py", "extract.py"):
        shutil.copy(autokernel.ROOT / name, tmp_path / name)
    for folder in ("autokernel", "models"):
        shutil.copytree(autokernel.ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "kernels").mkdir()
    for ktype in autokernel.KERNEL_TYPE_NAMES:  # the real starters when present
        real = autokernel.KERNELS_DIR / f"{ktype}.py"
        (tmp_path / "kernels" / f"{ktype}.py").write_text(
            real.read_text() if real.exists() else starter(ktype))
    prof = subprocess.run([sys.executable, "profile.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert prof.returncode == 0, prof.stderr
    assert prof.stderr == "", prof.stderr  # no kineto noise, no warnings
    assert "CPU op time" in prof.stdout and "LLaMA config=compact" in prof.stdout
    result = json.loads((tmp_path / "workspace" / "profile.json").read_text())
    assert result["named_pct"] >= 95.0 and result["input_shapes"] == [[1, 32]]
    ext = subprocess.run([sys.executable, "extract.py", "--top", "5"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert ext.returncode == 0, ext.stderr
    assert "default shape" not in ext.stdout + ext.stderr
    plan = json.loads((tmp_path / "workspace" / "plan.json").read_text())
    assert len(plan["kernels"]) == 5
    assert {k["kernel_type"] for k in plan["kernels"]} == {
        "fused_mlp", "matmul", "flash_attention", "qkv_rotary", "rmsnorm"}
    shapes = {k["kernel_type"]: k["shapes"] for k in plan["kernels"]}
    assert shapes["fused_mlp"] == [[32, 768, 3072]]
    assert [32, 32000, 768] in shapes["matmul"] and shapes["rmsnorm"] == [[32, 768]]
    assert shapes["flash_attention"] == [[1, 12, 32, 64]]
    assert shapes["qkv_rotary"] == [[1, 32, 768, 12, 12, 64]]
    assert plan["cpu_scaled"] is True
    bench = {k["kernel_type"]: k["bench_shapes"] for k in plan["kernels"]}
    assert bench["fused_mlp"] == [[32, 64, 128]] and bench["rmsnorm"] == [[32, 768]]
    assert bench["flash_attention"] == [[1, 4, 32, 64]]  # the CPU shapes' most heads: 4
    assert bench["qkv_rotary"] == [[1, 32, 64, 2, 2, 32]]
    for row in plan["kernels"]:
        text = (tmp_path / row["file"]).read_text()
        assert f"KERNEL_NAME = {row['name']!r}" in text and "BENCH_SHAPES = [" in text
        assert "CPU mode" in text and "x".join(map(str, row["shapes"][0])) in text
