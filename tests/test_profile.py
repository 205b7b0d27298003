"""profile.py on a CPU: attribution and classification of every shipped model (tiny configs),
KernelBench files, transformers configs, the GPU attribution path (on recorded-event stand-ins),
the launch-bound report, a one-line error for each kind of bad input, and the stdlib `profile`
shadowing hazard."""
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import autokernel
from autokernel import recognize
from autokernel.contract import load_module
from models import bert, custom, gpt2, llama

# `import profile` finds the standard library's (autokernel puts it in sys.modules first), so the
# script is loaded by path under another name.
profile_script = load_module(autokernel.ROOT / "profile.py", "profile_under_test")
ROOT = autokernel.ROOT


def run_profile(model, inputs, dtype=torch.float32):
    return profile_script.profile_model(model.to(dtype), inputs, torch.device("cpu"), dtype,
                                        warmup=0, iters=1)


def by_type(result):
    out = {}
    for e in result["entries"]:
        if e["kernel_type"]:
            out.setdefault(e["kernel_type"], []).extend(tuple(s) for s in e["shapes"])
    return out


# ---- shipped models: >= 95% named, the right types and shapes -------------------------------

def test_llama_attribution_and_shapes():
    cfg = llama.LLaMAConfig(vocab_size=101, max_seq=64, n_layer=2, n_head=4, dim=32, hidden=48)
    result = run_profile(llama.LLaMA(cfg).eval(), llama.get_inputs(2, 8, config=cfg))
    assert result["named_pct"] >= 95.0
    found = by_type(result)
    assert found["rmsnorm"] == [(16, 32)]
    assert found["fused_mlp"] == [(16, 32, 48)]
    assert found["qkv_rotary"] == [(2, 8, 32, 4, 4, 8)]  # q/k/v projections and rotary
    assert "rotary_embedding" not in found
    assert found["flash_attention"] == [(2, 4, 8, 8)]
    assert set(found["matmul"]) == {(16, 32, 32), (16, 101, 32)}
    names = {e["name"] for e in result["entries"]}
    assert {"RMSNorm", "SwiGLU", "Attention"} <= names
    # The SwiGLU's own linears belong to the fused_mlp scope and the q/k/v projections to
    # qkv_rotary's, not to matmul: what is left is each layer's output projection and lm_head.
    matmul = next(e for e in result["entries"] if e["name"] == "aten::linear")
    assert matmul["calls"] == 2 * 1 + 1
    assert result["gpu_busy_pct"] is None and result["time_source"] == "cpu op time"
    assert abs(sum(e["share"] for e in result["entries"]) - 1) < 1e-6
    for e in result["entries"]:
        assert e["bound"] == "n/a" and e["amdahl_ceiling"] >= 1.0


def test_gpt2_bert_custom_attribution():
    cfg = gpt2.GPT2Config(vocab_size=101, max_seq=64, n_layer=1, n_head=2, dim=16)
    result = run_profile(gpt2.GPT2(cfg).eval(), gpt2.get_inputs(2, 8, config=cfg))
    found = by_type(result)
    assert result["named_pct"] >= 95.0
    assert found["layernorm"] == [(16, 16)]
    assert found["flash_attention"] == [(2, 2, 8, 8)]
    assert set(found["matmul"]) == {(16, 48, 16), (16, 16, 16), (16, 64, 16), (16, 16, 64),
                                    (16, 101, 16)}

    cfg = bert.BERTConfig(vocab_size=101, max_seq=64, n_layer=1, n_head=2, dim=16, hidden=32)
    result = run_profile(bert.BERT(cfg).eval(), bert.get_inputs(2, 8, config=cfg))
    assert result["named_pct"] >= 95.0
    attention = next(e for e in result["entries"]
                     if e["name"] == "aten::scaled_dot_product_attention")
    # Bidirectional attention is the flash_attention type too (causal is the contract's flag).
    assert attention["kernel_type"] == "flash_attention"
    assert by_type(result)["flash_attention"] == [(2, 2, 8, 8)]

    cfg = custom.CustomConfig(vocab_size=101, max_seq=64, n_layer=1, n_head=2, dim=16)
    result = run_profile(custom.CustomModel(cfg).eval(), custom.get_inputs(2, 8, config=cfg))
    found = by_type(result)
    assert result["named_pct"] >= 95.0
    # Its attention is written out (q @ k^T, a causal mask, F.softmax, @ v): recognized by
    # computation as causal flash_attention, its softmax and batched matmuls inside it.
    attention = next(e for e in result["entries"] if e["kernel_type"] == "flash_attention")
    assert attention["name"] == "ExplicitAttention" and attention["calls"] == 1
    assert attention["shape_detail"][0]["variant"] == {}
    assert found["flash_attention"] == [(2, 2, 8, 8)]
    assert "softmax" not in found and "aten::matmul" not in {e["name"] for e in result["entries"]}
    # verify.py's graph swap plugs the kernel into the module's captured graph: extract.py
    # writes it like any other type's call site.
    assert all(e["pluggable"] for e in result["entries"] if e["kernel_type"])
    import extract
    merged, skipped = extract.merge_by_type(result["entries"])
    assert "flash_attention" in {m["kernel_type"] for m in merged} and not skipped
    assert found["reduce"] == [(16, 16)]
    assert found["cross_entropy"] == [(16, 101)]


def test_low_precision_profile_runs():
    cfg = llama.LLaMAConfig(vocab_size=64, max_seq=32, n_layer=1, n_head=2, dim=16, hidden=32)
    result = run_profile(llama.LLaMA(cfg).eval(), llama.get_inputs(1, 8, config=cfg),
                         dtype=torch.bfloat16)
    assert result["dtype"] == "bf16" and result["named_pct"] >= 95.0


# ---- the GPU path, on stand-ins for the profiler's events ---------------------------------------

def _evt(name, parent=None, kernels=(), device="cpu", duration=0.0, annotation=False,
         shapes=(), concrete=()):
    cpu = torch.autograd.DeviceType.CPU
    return types.SimpleNamespace(
        name=name, cpu_parent=parent, is_async=False, is_user_annotation=annotation,
        device_type=cpu if device == "cpu" else torch.autograd.DeviceType.CUDA,
        kernels=[types.SimpleNamespace(name=k, duration=d) for k, d in kernels],
        input_shapes=list(shapes), concrete_inputs=list(concrete), self_cpu_time_total=1.0,
        time_range=types.SimpleNamespace(elapsed_us=lambda d=duration: d))


def test_gpu_attribution_scopes_outermost_ops_and_unlinked_kernels():
    scope = _evt(recognize.scope_name("RMSNorm", "rmsnorm", (8, 32)), annotation=True)
    pow_ = _evt("aten::pow", scope, kernels=[("pow_kernel", 3.0)])
    linear = _evt("aten::linear", shapes=[[2, 4, 32], [64, 32], []])
    addmm = _evt("aten::addmm", linear, kernels=[("gemm", 10.0)])
    view = _evt("aten::view")  # no kernels: no time, no entry
    gpu = [_evt("pow_kernel", device="cuda", duration=3.0),
           _evt("gemm", device="cuda", duration=10.0),
           _evt("stray_library_kernel", device="cuda", duration=1.0),
           _evt(recognize.SCOPE_PREFIX + "x", device="cuda", duration=50.0, annotation=True)]
    anchors, unattributed, total = profile_script.attribute([scope, pow_, linear, addmm, view]
                                                            + gpu, on_gpu=True)
    assert total == 14.0 and dict(unattributed) == {"stray_library_kernel": 1.0}
    assert {a.name: t for a, t in anchors} == {scope.name: 3.0, "aten::linear": 10.0}
    entries = profile_script.build_entries(anchors, 1, total, torch.float16,
                                           {"tflops": 700.0, "bandwidth_gb_s": 3000.0})
    rms = next(e for e in entries if e["kernel_type"] == "rmsnorm")
    assert rms["shapes"] == [[8, 32]] and rms["bound"] == "memory"
    assert 0 < rms["pct_of_roofline"] < 100
    mm = next(e for e in entries if e["kernel_type"] == "matmul")
    assert mm["shapes"] == [[8, 64, 32]] and abs(mm["share"] - 10 / 14) < 1e-9


def test_launch_bound_report(capsys):
    result = {"model": "m", "input_shapes": [[1, 512]], "dtype": "fp16", "device": "cuda",
              "device_name": "NVIDIA H100 80GB HBM3", "iters": 10, "warmup": 3,
              "wall_us": 10000.0, "total_op_us": 2600.0, "gpu_busy_pct": 26.0,
              "launch_bound": True, "named_pct": 99.0, "ceilings": None, "groups": [],
              "entries": []}
    profile_script.print_report(result, top=10)
    out = capsys.readouterr().out
    assert "launch-bound: the GPU is busy only 26% of the time" in out
    assert "CUDA graphs" in out
    # 64% busy (the custom model on the H100): not launch-bound, but the idle share is said
    profile_script.print_report(dict(result, gpu_busy_pct=64.0, launch_bound=False), top=10)
    out = capsys.readouterr().out
    assert "partly launch-bound: the GPU idles 36% of the wall time" in out
    profile_script.print_report(dict(result, gpu_busy_pct=97.0, launch_bound=False), top=10)
    assert "launch-bound" not in capsys.readouterr().out


# ---- loaders: KernelBench, transformers, and bad input ----------------------------------------

KERNELBENCH = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)

def get_inputs():
    return [torch.randn(16, 64)]

def get_init_inputs():
    return [64]
'''


def test_kernelbench_file(tmp_path, capsys):
    path = tmp_path / "kb.py"
    path.write_text(KERNELBENCH)
    out = tmp_path / "profile.json"
    rc = profile_script.main(["--model", str(path), "--output", str(out), "--iters", "1",
                              "--warmup", "0"])
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["input_shapes"] == [[16, 64]] and "KernelBench" in result["model"]
    found = by_type(result)
    assert found["softmax"] == [(16, 64)] and found["matmul"] == [(16, 64, 64)]
    assert result["named_pct"] >= 95.0


LSTM_FP32_STATE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    """As KernelBench level 3's LSTMs did: the initial state made in forward, in the default
    dtype (fp32), whatever the model's."""
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x):
        h0 = torch.zeros(1, x.shape[0], 16, device=x.device)
        return self.lstm(x, (h0, h0))[0]

def get_inputs():
    return [torch.randn(2, 5, 8)]

def get_init_inputs():
    return []
'''


def test_a_model_that_fails_in_the_default_dtype_is_profiled_in_the_one_it_runs_in(
        tmp_path, capsys, monkeypatch):
    """The default is fp16 on a GPU; here (a CPU) the same default is planted."""
    from models import load
    real = load.device_and_dtype
    monkeypatch.setattr(load, "device_and_dtype", lambda args: (real(args)[0], {
        None: torch.float16}.get(args.dtype) or autokernel.parse_dtype(args.dtype)))
    path, out = tmp_path / "lstm.py", tmp_path / "profile.json"
    path.write_text(LSTM_FP32_STATE)
    assert profile_script.main(["--model", str(path), "--output", str(out), "--iters", "1",
                                "--warmup", "0"]) == 0
    err = capsys.readouterr().err
    assert "profile: note: " in err and "does not run in fp16" in err and "dtype" \
        in err.split("fp16", 1)[1] and "loaded in fp32, the dtype it runs in" in err, err
    result = json.loads(out.read_text())
    assert result["dtype"] == "fp32" and result["model_args"]["dtype"] == "fp32"
    monkeypatch.setattr(load, "device_and_dtype", real)  # asked for: fp16 or nothing
    capsys.readouterr()
    assert profile_script.main(["--model", str(path), "--output", str(out), "--dtype", "fp16"]) \
        != 0
    assert "the model's forward raised" in capsys.readouterr().err


def test_transformers_config_model(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "profile.json"
    rc = profile_script.main(["--module", "transformers", "--hf-config", "tiny-llama",
                              "--input-shape", "1x16", "--output", str(out), "--iters", "1"])
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["named_pct"] >= 95.0
    found = by_type(result)
    assert {"matmul", "rmsnorm", "fused_mlp", "flash_attention"} <= set(found)
    # A local config.json works too (offline), and a hub name gets a clear error.
    import transformers
    transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64).save_pretrained(
        tmp_path / "cfg")
    assert profile_script.main(["--module", "transformers", "--hf-config", str(tmp_path / "cfg"),
                                "--input-shape", "1x8", "--output", str(out), "--iters", "1"]) == 0
    capsys.readouterr()
    assert profile_script.main(["--module", "transformers", "--hf-config", "gpt2",
                                "--output", str(out)]) == 2
    assert "offline" in capsys.readouterr().err


def test_transformers_vision_config_model(tmp_path, capsys):
    """A vision config (no vocabulary, channels) builds its image classifier on BxCxHxW pixel
    values; its convolutions and norms are regions (ResNet has no attention: no sdpa forced)."""
    pytest.importorskip("transformers")
    config = tmp_path / "resnet.json"
    config.write_text(json.dumps({"model_type": "resnet", "embedding_size": 8,
                                  "hidden_sizes": [8, 16], "depths": [1, 1],
                                  "layer_type": "basic", "num_labels": 3}))
    out = tmp_path / "profile.json"
    flags = ["--module", "transformers", "--hf-config", str(config), "--output", str(out),
             "--iters", "1"]
    assert profile_script.main([*flags, "--input-shape", "1x3x32x32"]) == 0, \
        capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["input_shapes"] == [[1, 3, 32, 32]] and result["region_pct"] > 50
    assert result["model_args"]["input_shape"] == "1x3x32x32"  # verify.py rebuilds the same
    capsys.readouterr()
    assert profile_script.main([*flags, "--input-shape", "1x4x32x32"]) == 2
    assert "takes 3: use Bx3xHxW" in capsys.readouterr().err
    assert profile_script.main([*flags, "--input-shape", "1x32"]) == 2
    assert "BxCxHxW" in capsys.readouterr().err


RAISES_IN_FORWARD = '''
import torch
CONFIGS = {"default": None}
class Model(torch.nn.Module):
    def __init__(self, config=None):
        super().__init__()
    def forward(self, x):
        raise RuntimeError("boom in forward\\nsecond line")
def get_inputs(batch, seq, device="cpu"):
    return (torch.zeros(batch, seq, dtype=torch.long, device=device),)
'''
RAISES_IN_INIT = RAISES_IN_FORWARD.replace("super().__init__()", "raise ValueError('bad init')")


@pytest.mark.parametrize("args, code, message", [
    (["--model", "no/such/file.py"], 2, "not found"),
    (["--class-name", "Nope"], 2, "no nn.Module class 'Nope'"),
    (["--input-shape", "8xabc"], 2, "bad --input-shape"),
    (["--input-shape", "8x1x2"], 2, "bad --input-shape"),
    (["--dtype", "fp8"], 2, "unknown dtype"),
    (["--config", "huge"], 2, "unknown --config 'huge'"),
    (["--input-shape", "1x99999"], 2, "exceeds"),
    (["--hf-config", "tiny-llama"], 2, "needs --module transformers"),
    (["--device", "tpu"], 2, "unknown --device"),
    (["--iters", "0"], 2, "--iters"),
    (["RAISES_IN_FORWARD"], 1, "forward raised RuntimeError: boom in forward"),
    (["RAISES_IN_INIT"], 1, "raised ValueError: bad init"),
    (["SYNTAX_ERROR"], 1, "could not import"),
])
def test_bad_input_one_line_error(tmp_path, capsys, args, code, message):
    sources = {"RAISES_IN_FORWARD": RAISES_IN_FORWARD, "RAISES_IN_INIT": RAISES_IN_INIT,
               "SYNTAX_ERROR": "def broken(:\n"}
    if args[0] in sources:
        path = tmp_path / "model.py"
        path.write_text(sources[args[0]])
        args = ["--model", str(path), "--input-shape", "1x4"]
    rc = profile_script.main(args + ["--output", str(tmp_path / "p.json"), "--warmup", "0"])
    err = capsys.readouterr().err
    assert rc == code
    assert err.count("\n") == 1 and err.startswith("profile.py: error:"), err
    assert message in err, err
    assert not (tmp_path / "p.json").exists()


def test_cli_error_has_no_traceback():
    proc = subprocess.run([sys.executable, "profile.py", "--model", "missing.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "profile.py: error: model file missing.py not found: pass --model FILE (a .py file)"]


def test_seven_b_refused_with_numbers_when_it_cannot_fit(monkeypatch, capsys, tmp_path):
    """The 7B preset is sized on the meta device first: on a box without the memory it is a
    one-line error, never an allocation (simulated here with a 4 GiB box)."""
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda k: 2**20 if k == "SC_AVPHYS_PAGES" else real(k))
    rc = profile_script.main(["--model", str(ROOT / "models" / "llama.py"), "--config", "7b",
                              "--output", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "needs 25.1 GiB" in err and "use a smaller --config" in err


# ---- the stdlib-shadowing hazard ------------------------------------------------------------

COMPILE_AT_ROOT = ("import torch\n"
                   "double = torch.compile(lambda x: x * 2 + 1, backend='eager')\n"
                   "assert double(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]\n"
                   "print('compiled fine')\n")


def _python(code, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_a_profile_py_on_the_path_breaks_torch_compile(tmp_path):
    """The hazard itself: a script whose directory holds a `profile.py` (one that does not fix
    things up, unlike ours) cannot torch.compile."""
    (tmp_path / "profile.py").write_text('"""Shadows the stdlib module."""\n')
    control = _python("import sys; sys.path.insert(0, '')\n" + COMPILE_AT_ROOT, tmp_path)
    assert control.returncode != 0 and "profile" in control.stderr


def test_torch_compile_works_from_the_repo_root():
    """What every top-level script does: import autokernel first (it loads the stdlib `profile`
    before ours can shadow it), then torch.compile, from the repo root."""
    fixed = _python("import sys; sys.path.insert(0, '')\nimport autokernel\n" + COMPILE_AT_ROOT,
                    ROOT)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert "compiled fine" in fixed.stdout


def test_no_module_imports_profile_py():
    """profile.py is a script: no module imports it, by name (which would get the stdlib's, or
    shadow it) or by path. Models load through models/load.py, recognition is in
    autokernel/recognize.py. The one `import profile` is autokernel's load of the stdlib one."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv", "workspace") or rel.parts[0].startswith(".") \
                or rel == Path("autokernel", "__init__.py"):
            continue
        text = path.read_text(errors="replace")
        if re.search(r"^\s*(import profile\b|from profile import)", text, re.M) \
                or re.search(r"/\s*[\"']profile\.py[\"']", text):  # ROOT / "profile.py"
            offenders.append(str(rel))
    assert offenders == [], offenders
