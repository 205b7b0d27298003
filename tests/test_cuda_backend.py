"""
The CUDA C++ backend on a machine without a GPU: every CUDA starter (kernels/cuda/<type>.py)
compiles for the H100 (sm_90a) through the real build path in under a minute, its hot kernels
within their register budgets (ptxas); a compile error is one line naming the kernel file's
line; the dispatch guard still rejects torch compute ops and aliased outputs from a CUDA kernel
file; bench.py refuses a CUDA kernel in one line and changes nothing; extract.py writes CUDA
starters with the model's real shapes. Running the kernels needs a GPU (.device scripts); the
compile tests skip without nvcc.

    uv run pytest tests/test_cuda_backend.py
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autokernel
from autokernel import cuda_build
from autokernel.child import Runner
from autokernel.cli import UsageError, run_main
from autokernel.contract import KernelFileError, check_module, load_module, plan
from autokernel.results import COLUMNS

CUDA_DIR = autokernel.KERNELS_DIR / "cuda"
PLANTED = Path(__file__).resolve().parent / "planted_cuda"
USED_PLANTED = ("compile_error", "torch_sum", "returns_input")  # the ones these tests load
needs_nvcc = pytest.mark.skipif(not cuda_build.nvcc_available(),
                                reason="nvcc (the CUDA toolkit) is not installed")
GIT_ENV = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="cuda test", GIT_AUTHOR_EMAIL="cuda@test",
               GIT_COMMITTER_NAME="cuda test", GIT_COMMITTER_EMAIL="cuda@test")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The starters and the planted kernels imported (so compiled) for sm_90a into a fresh
    cache: ({file stem: module or the exception}, the cache directory).
    How long the compiles take is a benchmark's question (benchmarks/), not a test's."""
    saved_cache, saved_arch = cuda_build.CACHE_DIR, os.environ.get("AUTOKERNEL_CUDA_ARCH")
    cuda_build.CACHE_DIR = tmp_path_factory.mktemp("cuda_build")
    os.environ["AUTOKERNEL_CUDA_ARCH"] = "90a"

    def load(path):
        try:
            return load_module(path)
        except Exception as e:  # noqa: BLE001  (each test reports its own file's failure)
            return e

    paths = sorted(CUDA_DIR.glob("*.py")) + [PLANTED / f"{name}.py" for name in USED_PLANTED]
    try:  # one after another: a process builds one library at a time (cuda_build's build log)
        yield {p.stem: load(p) for p in paths}, cuda_build.CACHE_DIR
    finally:
        cuda_build.CACHE_DIR = saved_cache
        if saved_arch is None:
            os.environ.pop("AUTOKERNEL_CUDA_ARCH", None)
        else:
            os.environ["AUTOKERNEL_CUDA_ARCH"] = saved_arch


@needs_nvcc
@pytest.mark.parametrize("kernel_type", autokernel.KERNEL_TYPE_NAMES)
def test_cuda_starter_compiles_for_hopper_and_keeps_the_contract(built, kernel_type):
    module = built[0][kernel_type]
    if isinstance(module, Exception):
        pytest.fail(f"kernels/cuda/{kernel_type}.py: {type(module).__name__}: {module}")
    checked = check_module(module)
    assert checked["kernel_type"] == kernel_type and checked["backend"] == "cuda"
    launchers = [name for name in vars(module._lib) if not name.startswith("_")]
    assert launchers, "no extern \"C\" launcher was bound"


@needs_nvcc
def test_a_cuda_kernel_file_loaded_from_memory_reuses_its_build(built, monkeypatch):
    """The kept version's process loads its file from memory: the same text, the same #line,
    so the same build (no nvcc run), and compile errors still name the file's line."""
    monkeypatch.setattr(cuda_build, "CACHE_DIR", built[1])
    keys = []
    build = cuda_build._build
    monkeypatch.setattr(cuda_build, "_build", lambda text, key, *rest: keys.append(key) or
                        build(text, key, *rest))
    path = CUDA_DIR / "reduce.py"
    load_module(path)
    load_module(autokernel.WORKSPACE / "no_such_dir" / "kept_version.py",
                source=path.read_text())
    assert len(keys) == 2 and keys[0] == keys[1]
    broken = (PLANTED / "compile_error.py").read_text()
    line = next(n for n, text in enumerate(broken.splitlines(), start=1)
                if "undeclared_name;" in text)
    with pytest.raises(cuda_build.CudaBuildError, match=f"kept_version.py line {line + 1}:"):
        load_module(autokernel.WORKSPACE / "no_such_dir" / "kept_version.py",
                    source="# one line further down\n" + broken)


@needs_nvcc
def test_compile_error_is_one_line_with_the_kernel_files_line(built):
    error = built[0]["compile_error"]
    assert isinstance(error, cuda_build.CudaBuildError), error
    message = str(error)
    line = next(i for i, text in enumerate((PLANTED / "compile_error.py").read_text()
                                           .splitlines(), start=1) if "undeclared_name;" in text)
    assert "\n" not in message
    assert f"compile_error.py line {line}: identifier \"undeclared_name\" is undefined" in message
    log = Path(message.rsplit("full log: ", 1)[1].rstrip(")"))
    assert "undeclared_name" in (log if log.is_absolute() else autokernel.ROOT / log).read_text()


# What ptxas must give the hot kernels (sm_90a): the row kernels' aligned fp16 instances fit 32
# registers (2048 threads an SM: their speed on the H100 came from that), and the Hopper GEMMs
# keep their 128 accumulators a thread without spilling.
REGISTER_BUDGETS = {  # file -> [(mangled-name fragment, most registers or None), ...]
    "softmax": [("softmax_rowsI6__halfL4Mode0E", 32), ("softmax_smemI6__halfL4Mode1E", 32)],
    "layernorm": [("layernorm_rowsI6__halfLb1E", 32)],
    "rmsnorm": [("rmsnorm_rowsI6__halfLb1E", 32)],
    "matmul": [("gemm_wgmma", None)],
    "fused_mlp": [("gemm_wgmma", None)],
}


def _nvcc_device(stem, folder, arch):
    """nvcc -cubin on one CUDA starter's source: its device code, built with cuda_build's flags
    for `arch` (the host side is the same on every arch, and the sm_90a builds compile it)."""
    text = (CUDA_DIR / f"{stem}.py").read_text()
    source = folder / f"{stem}_{arch}.cu"
    source.write_text(re.search(r'CUDA_SRC = r"""(.*?)"""', text, re.S).group(1))
    nvcc = cuda_build.find_cuda_home() / "bin" / "nvcc"
    target = [f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-DAUTOKERNEL_SM={arch.rstrip('a')}"]
    proc = subprocess.run([str(nvcc), *cuda_build.FLAGS, *target, "-cubin", str(source),
                           "-o", str(folder / f"{stem}_{arch}.cubin")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, f"kernels/cuda/{stem}.py for sm_{arch}: {proc.stderr[-2000:]}"


@needs_nvcc
def test_hot_kernels_keep_their_register_budget(built):
    """Read from the sm_90a builds' own logs (ptxas -v is one of the build's flags)."""
    modules, _ = built
    for stem, budgets in REGISTER_BUDGETS.items():
        assert not isinstance(modules[stem], Exception), modules[stem]
        report = cuda_build.resource_usage(modules[stem]._lib.build_log.read_text())
        for fragment, most in budgets:
            kernels = {k: v for k, v in report.items() if fragment in k}
            assert kernels, f"{stem}: no kernel named like {fragment} ({sorted(report)})"
            for kernel, (registers, spilled) in kernels.items():
                assert spilled == 0, f"{stem}: {kernel} spills {spilled} bytes"
                assert most is None or registers <= most, \
                    f"{stem}: {kernel} uses {registers} registers (budget {most})"


@needs_nvcc
def test_cuda_starters_compile_for_ampere_too(tmp_path):
    """sm_80 (A100) has no clusters, TMA or wgmma: those paths must compile away there, leaving
    the mma.sync and CUDA-core ones (AUTOKERNEL_CUDA_ARCH=80 builds this way)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda stem: _nvcc_device(stem, tmp_path, "80"), autokernel.KERNEL_TYPE_NAMES))


@needs_nvcc
def test_guard_rejects_torch_math_and_aliases_in_a_cuda_kernel(built):
    """The child's honesty checks do not depend on the backend: kernel_fn's torch compute ops
    and outputs that alias an input are caught before any CUDA launch."""
    x = torch.randn(4, 16, dtype=torch.float16)
    buffer = torch.empty(4, dtype=torch.float16)
    reply = Runner(built[0]["torch_sum"].kernel_fn).call({"x": x, "dim": -1}, float("nan"), buffer)
    assert reply == {"status": "forbidden", "op": "aten.sum"}
    reply = Runner(built[0]["returns_input"].kernel_fn).call({"x": x, "dim": -1}, float("nan"),
                                                             buffer)
    assert reply["aliases"] == ["x"]


@needs_nvcc
def test_a_launcher_takes_its_arguments_but_the_stream_and_cuda_tensors_only(built):
    # The starter's reduce_sum(x, y, outer, r, inner, dtype, tpr, rpb, stream)
    reduce_sum = built[0]["reduce"]._lib.reduce_sum
    assert reduce_sum.arity == 8 and reduce_sum.stream_at == 8
    with pytest.raises(TypeError, match="reduce_sum takes 8 arguments"):
        reduce_sum(1, 2)
    with pytest.raises(ValueError, match="reduce_sum: const void\\* x is a cpu tensor"):
        reduce_sum(torch.zeros(2), None, 1, 2, 1, torch.float32, 0, 0)


def test_launcher_signatures_are_read_from_the_source():
    found = cuda_build.launchers('''
        // extern "C" int commented_out(int x) {
        extern "C" int scale(const float* x, float* y, float a, long long n, int dtype,
                             cudaStream_t stream) { return 0; }
    ''')
    assert list(found) == ["scale"]
    kinds = [kind for _, kind in found["scale"]]
    assert kinds[:2] == ["ptr", "ptr"] and kinds[-1] == "stream"
    with pytest.raises(cuda_build.CudaBuildError, match="cannot pass parameter 'Foo f'"):
        cuda_build.launchers('extern "C" int bad(Foo f) { return 0; }')


def test_first_error_maps_nvcc_logs_to_one_line():
    log = ("[2/3] nvcc ... cuda.cu\nCUDA_SRC(57): error: identifier \"x\" is undefined\n"
           "CUDA_SRC(60): error: later\n2 errors detected")
    assert cuda_build.first_error(log, "kernel.py") == \
        'kernel.py line 57: identifier "x" is undefined'
    assert cuda_build.first_error("ptxas error   : Entry function 'k' uses too much shared "
                                  "data", "kernel.py") == \
        "kernel.py: Entry function 'k' uses too much shared data"


def test_contract_takes_the_cuda_backend():
    assert plan({"KERNEL_TYPE": "reduce", "BACKEND": "cuda"})["backend"] == "cuda"
    with pytest.raises(KernelFileError, match="BACKEND 'opencl' is not supported"):
        plan({"KERNEL_TYPE": "reduce", "BACKEND": "opencl"})


def test_bench_refuses_a_cuda_kernel_in_one_line_and_changes_nothing(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("bench.py", ".gitignore"):
        shutil.copy(autokernel.ROOT / name, repo / name)
    for folder in ("autokernel", "kernels"):
        shutil.copytree(autokernel.ROOT / folder, repo / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CUDA_DIR / "reduce.py", repo / "kernel.py")
    results = "\t".join(COLUMNS) + "\n"
    (repo / "results.tsv").write_text(results)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True).stdout
    proc = subprocess.run([sys.executable, "bench.py", "-m", "try it"], cwd=repo, env=GIT_ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "CUDA C++ kernel" in proc.stderr and "needs an NVIDIA GPU" in proc.stderr
    assert (repo / "results.tsv").read_text() == results
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                            text=True).stdout
    assert status == "" and subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo,
                                           capture_output=True, text=True).stdout == head
    assert not (repo / "workspace" / "bench.lock").exists()  # refused before taking the lock


def test_verify_refuses_cuda_kernels_before_regating_them():
    """After extract.py --backend cuda on a CPU: one line at once, not a re-gate of each kernel
    that the gate then refuses."""
    proc = subprocess.run([sys.executable, str(autokernel.ROOT / "verify.py"), "--kernels",
                           f"{CUDA_DIR / 'reduce.py'},{CUDA_DIR / 'softmax.py'}", "--no-timing"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "reduce.py (and 1 more) is a CUDA C++ kernel" in proc.stderr
    assert "nothing was re-gated or run" in proc.stderr


def test_bench_refusal_covers_kernel_files_too():
    from autokernel import experiment
    if autokernel.CUDA:
        pytest.skip("a GPU is present: bench.py judges CUDA kernels here")
    with pytest.raises(UsageError, match="softmax.py is a CUDA C.. kernel"):
        experiment.refuse_cuda_without_gpu(argparse.Namespace(kernel=str(CUDA_DIR / "softmax.py")))
    experiment.refuse_cuda_without_gpu(argparse.Namespace(kernel=str(autokernel.KERNELS_DIR /
                                                                     "softmax.py")))


def test_extract_writes_cuda_starters_with_real_shapes(tmp_path, capsys):
    extract = load_module(autokernel.ROOT / "extract.py", "extract_cuda_under_test")
    profile = {"model": "tiny", "dtype": "bf16", "device": "cuda", "input_shapes": [[2, 8]],
               "total_op_us": 10.0, "entries": [
                   {"name": "aten::softmax", "kernel_type": "softmax", "time_us": 6.0,
                    "share": 0.6, "bound": "memory",
                    "shape_detail": [{"shape": [4096, 50257], "time_us": 6.0}]}]}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    args = ["--profile", str(tmp_path / "profile.json"), "--workspace", str(tmp_path / "ws")]
    assert run_main("extract.py", extract.main, args + ["--backend", "cuda"]) == 0
    written = tmp_path / "ws" / "softmax_1.py"
    text = written.read_text()
    assert 'BACKEND = "cuda"' in text and "(4096, 50257)," in text and "CPU mode" not in text
    saved_plan = json.loads((tmp_path / "ws" / "plan.json").read_text())
    assert saved_plan["backend"] == "cuda" and saved_plan["kernels"][0]["backend"] == "cuda"
    assert saved_plan["kernels"][0]["bench_shapes"] == [[4096, 50257]]
    capsys.readouterr()
    code = run_main("extract.py", extract.main,
                    args + ["--backend", "cuda", "--kernels-dir", str(autokernel.KERNELS_DIR),
                            "--force"])
    err = capsys.readouterr().err
    assert code == 1 and "is a triton kernel, not cuda" in err and err.count("\n") == 1
    # A CUDA plan made from a CPU profile (fp32, the CPU's small shapes) says so.
    (tmp_path / "profile.json").write_text(json.dumps(dict(profile, device="cpu", dtype="fp32")))
    assert run_main("extract.py", extract.main, ["--profile", str(tmp_path / "profile.json"),
                                                 "--workspace", str(tmp_path / "ws_cpu"),
                                                 "--backend", "cuda"]) == 0
    assert "this plan comes from a CPU profile (fp32, CPU shapes)" in capsys.readouterr().out
