"""export.py on the CPU: the package it writes runs where this repo is not on the path (only torch
and triton): importing it registers the kernels as torch ops, patch(model) swaps them in and the
model computes what it computed before, a call outside a kernel's contract runs PyTorch, undo()
restores torch and the model, and the package's own smoke test passes (and fails on a wrong
kernel). From a plan, only kernel files that are kept versions in results.tsv are exported."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import export
import autokernel
from autokernel import ROOT
from autokernel.cli import UsageError
from autokernel.export import package_relative
from autokernel.results import append_row
from autokernel.state import digest

# A small model written like a user's: every kernel type's entry point or module, in fp32.
MODEL = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight, self.eps = nn.Parameter(1 + 0.1 * torch.randn(d)), eps
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class SwiGLU(nn.Module):
        def __init__(self, d, f):
            super().__init__()
            self.w_gate, self.w_up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.w_down = nn.Linear(f, d, bias=False)
        def forward(self, x):
            return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))

    class Tiny(nn.Module):
        def __init__(self, vocab=64, d=32):
            super().__init__()
            self.emb, self.ln = nn.Embedding(vocab, d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.norm, self.mlp, self.head = RMSNorm(d), SwiGLU(d, 64), nn.Linear(d, vocab)
        def forward(self, idx, mask=None):
            x = self.emb(idx)
            B, S, D = x.shape
            q, k, v = (t.view(B, S, 2, D // 2).transpose(1, 2)
                       for t in self.qkv(self.ln(x)).split(D, -1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=mask is None, attn_mask=mask)
            x = x + a.transpose(1, 2).reshape(B, S, D)
            x = x + self.mlp(self.norm(x))
            logits = self.head(x * torch.sigmoid(torch.sum(x, dim=-1, keepdim=True)))
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1))
            return F.softmax(logits, dim=-1), loss
''')

# Run outside the repo: import the package, patch the model, report what happened as JSON.
USER_SCRIPT = MODEL + textwrap.dedent('''
    import contextlib, io, json, sys, warnings
    import autokernel_kernels as ak

    torch.manual_seed(0)
    model, other = Tiny().eval(), Tiny().eval()
    idx = torch.randint(0, 64, (2, 16))
    entry_points = (F.linear, F.layer_norm, F.scaled_dot_product_attention, F.softmax, torch.sum)
    report = {"ops": {n: str(op) for n, op in ak.OPS.items()}}

    def max_err(got, want):
        return max(float((g - w).abs().max()) for g, w in zip(got, want))

    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    warnings.simplefilter("always")
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        want, want_masked = model(idx), model(idx, mask)
        with ak.patch(model) as handle:
            report["err"] = max_err(model(idx), want)
            report["calls"], report["fallbacks"] = handle.calls, handle.fallbacks
        report["restored"] = all(a is b for a, b in zip(entry_points, (
            F.linear, F.layer_norm, F.scaled_dot_product_attention, F.softmax, torch.sum))) \\
            and not any("forward" in vars(m) for m in model.modules())
        handle = ak.patch(model, compiled=True)
        report["compiled_err"] = max_err(model(idx), want)
        report["compiled_calls"] = handle.calls
        handle.swap.reset()
        report["masked_err"] = max_err(model(idx, mask), want_masked)
        report["masked_fallbacks"] = handle.fallbacks
        later = ak.patch(other)
        try:
            handle.undo()
            report["undo_out_of_order"] = "allowed"
        except RuntimeError as e:
            report["undo_out_of_order"] = str(e)
        later.undo()
        handle.undo()
        handle.undo()
        report["restored_after_undo"] = F.linear is entry_points[0]
    with ak.patch(model), warnings.catch_warnings(record=True) as training:
        model(idx)
    ours = lambda ws: [str(w.message) for w in ws if str(w.message).startswith("autokernel_")]
    report["warnings"], report["training_warnings"] = ours(seen), ours(training)
    from autokernel_kernels import smoke_test  # (`python -m` runs it in the plan export's test)
    with contextlib.redirect_stdout(io.StringIO()) as smoke:
        report["smoke_exit"] = smoke_test.main(["--dtype", "fp32"])
    report["smoke"] = smoke.getvalue()
    files = {n: getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items())}
    report["repo_modules"] = sorted(n for n, f in files.items()  # the repo's own, not its .venv
                                    if f.startswith(sys.argv[1]) and not f.startswith(sys.prefix))
    print(json.dumps(report))
''')


def run_outside(cwd, *args):
    """python in cwd with only cwd on PYTHONPATH (not the repo), Triton's interpreter on."""
    env = dict(os.environ, PYTHONPATH=str(cwd), TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def starters(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    assert export.main(["--out", str(out), "--starters"]) == 0
    return out


@pytest.fixture(scope="module")
def used(starters):
    """What the user script saw, patching the tiny model with the exported starters."""
    script = starters / "use_it.py"
    script.write_text(USER_SCRIPT)
    proc = run_outside(starters, script.name, str(ROOT) + os.sep)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_package_imports_without_the_repo_and_registers_every_kernel_as_an_op(used):
    assert used["repo_modules"] == []
    assert sorted(used["ops"]) == sorted(autokernel.KERNEL_TYPE_NAMES)
    assert all(op.startswith("autokernel.") for op in used["ops"].values())


def test_patched_model_runs_the_kernels_and_computes_the_same(used):
    assert used["err"] < 1e-4
    assert used["calls"] == {"layernorm": 1, "matmul": 2, "flash_attention": 1, "rmsnorm": 1,
                             "fused_mlp": 1, "reduce": 1, "softmax": 1, "cross_entropy": 1}
    assert used["fallbacks"] == {}


def test_patch_compiled_calls_the_kernels_through_their_ops(used):
    assert used["compiled_err"] < 1e-4
    assert used["compiled_calls"] == used["calls"]


def test_call_outside_the_contract_runs_pytorch_and_is_counted(used):
    assert used["masked_err"] < 1e-4
    assert used["masked_fallbacks"] == {"flash_attention": {"attention mask": 1}}


def test_undo_restores_torch_and_the_model_in_reverse_order_only(used):
    assert used["restored"] and used["restored_after_undo"]
    assert "undo the later patch() first" in used["undo_out_of_order"]


def test_patched_model_run_with_autograd_on_warns_that_it_is_for_inference(used):
    assert used["warnings"] == []
    assert len(used["training_warnings"]) == 1
    assert "torch.no_grad()" in used["training_warnings"][0]


def test_smoke_test_passes_on_the_starters(used):
    assert used["smoke_exit"] == 0, used["smoke"]
    assert f"{len(autokernel.KERNEL_TYPE_NAMES)} kernels" in used["smoke"] \
        and "0 failed" in used["smoke"]


# ---- from a plan: only kept versions ---------------------------------------------------------

# Right shape and dtype, wrong values: exp(x) never divided by its row's sum.
UNNORMALIZED_SOFTMAX = textwrap.dedent('''
    import torch
    import triton
    import triton.language as tl

    KERNEL_TYPE = "softmax"
    KERNEL_NAME = "softmax_1"

    @triton.jit
    def _exp_rows(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        offsets = tl.program_id(0) * n + cols
        x = tl.load(x_ptr + offsets, mask=cols < n, other=0.0)
        tl.store(out_ptr + offsets, tl.exp(x.to(tl.float32)).to(x.dtype), mask=cols < n)

    def kernel_fn(x):
        out = torch.empty_like(x)
        _exp_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
''')


def night(tmp_path, kept_sha=None):
    """A plan of two kernels (softmax_1 and reduce_2, the reduce starter), and a results.tsv
    where softmax_1 has a kept row with kept_sha (default: its file's) and reduce_2 none."""
    softmax = tmp_path / "softmax_1.py"
    softmax.write_text(UNNORMALIZED_SOFTMAX)
    plan = {"model": "tiny", "created": "2026-01-01T00:00:00+00:00", "dtype": "fp32",
            "kernels": [{"name": "softmax_1", "kernel_type": "softmax", "file": str(softmax),
                         "share": 0.3, "shapes": [[32, 64]]},
                        {"name": "reduce_2", "kernel_type": "reduce",
                         "file": str(ROOT / "kernels" / "reduce.py"), "share": 0.1,
                         "shapes": [[32, 32]]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    results = tmp_path / "results.tsv"
    append_row({"experiment": 1, "tag": "softmax_1", "kernel_type": "softmax",
                "latency_us": 12.5, "correctness": "PASS", "status": "keep", "commit": "abc1234",
                "kernel_sha256": kept_sha or digest(softmax.read_bytes())}, results)
    return ["--plan", str(tmp_path / "plan.json"), "--results", str(results)]


def test_plan_export_ships_kept_versions_only_and_its_smoke_test_fails_a_wrong_kernel(tmp_path):
    out = tmp_path / "dist"
    assert export.main(["--out", str(out), "--name", "night_kernels", *night(tmp_path)]) == 0
    manifest = json.loads((out / "night_kernels" / "manifest.json").read_text())
    assert [k["name"] for k in manifest["kernels"]] == ["softmax_1"]
    assert "experiment 1" in manifest["kernels"][0]["kept"]
    assert (out / "night_kernels" / manifest["kernels"][0]["file"]).read_text() \
        == UNNORMALIZED_SOFTMAX
    proc = run_outside(out, "-m", "night_kernels.smoke_test", "--dtype", "fp32")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "softmax_1 4x512 fp32: FAIL" in proc.stdout


def test_nothing_kept_is_one_line_and_exit_1(tmp_path, capsys):
    args = night(tmp_path)
    (tmp_path / "results.tsv").unlink()
    assert export.main(["--out", str(tmp_path / "dist"), *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("export.py: error: nothing to export") and "\n" not in err
    assert not (tmp_path / "dist").exists()


def test_kernel_file_edited_after_its_keep_stops_the_export(tmp_path, capsys):
    args = night(tmp_path, kept_sha="0" * 64)
    assert export.main(["--out", str(tmp_path / "dist"), *args]) == 1
    assert "matches no kept row of softmax_1" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


def test_a_keep_the_plan_cannot_place_is_named(tmp_path, capsys):
    """A kept row on this branch whose tag no plan kernel has (kernel.py judged without its
    KERNEL_NAME line: tagged by its type) is named on a line of its own."""
    import subprocess
    args = night(tmp_path)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    append_row({"experiment": 2, "tag": "softmax", "kernel_type": "softmax", "latency_us": 9.0,
                "correctness": "PASS", "status": "keep", "commit": head,
                "kernel_sha256": "0" * 64}, tmp_path / "results.tsv")
    assert export.main(["--out", str(tmp_path / "dist"), *args]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "unplaced keep" in line]
    assert lines == [f"unplaced keep: experiment 2, tag softmax, commit {head}: no kernel of "
                     f"plan.json is named 'softmax', so it is neither verified nor exported (its "
                     f"code: git show {head}:kernel.py)"]


def test_bad_package_name_is_a_usage_error(tmp_path):
    assert export.main(["--out", str(tmp_path), "--starters", "--name", "2fast"]) == 2


def test_an_earlier_export_is_replaced_and_any_other_folder_kept(tmp_path):
    args = night(tmp_path)
    out = tmp_path / "dist"
    assert export.main(["--out", str(out), *args]) == 0
    (out / "autokernel_kernels" / "stale.py").write_text("")
    assert export.main(["--out", str(out), *args]) == 0
    assert not (out / "autokernel_kernels" / "stale.py").exists()
    (out / "mine").mkdir()
    assert export.main(["--out", str(out), "--name", "mine", *args]) == 2
    assert list((out / "mine").iterdir()) == []


# ---- the repo's modules inside the package ---------------------------------------------------

def test_imports_of_autokernel_become_package_relative():
    source = ("import math\nimport autokernel\nfrom autokernel import ops, KERNEL_TYPES\n"
              "from autokernel.recognize import one_dim, reduce_shape as rs\n"
              "from autokernel.results import rel\n\n"
              "def f():\n    import reference\n    return autokernel.KERNEL_TYPES\n")
    assert package_relative(source, "x.py", {"KERNEL_TYPES", "rel"}) == (
        "import math\nfrom . import kernel_types as autokernel\n"
        "from . import ops; from .kernel_types import KERNEL_TYPES\n"
        "from .recognize import one_dim, reduce_shape as rs\n"
        "from .kernel_types import rel\n\n"
        "def f():\n    from . import reference\n    return autokernel.KERNEL_TYPES\n")


@pytest.mark.parametrize("source, named", [
    ("from autokernel.results import read_rows\n", "read_rows from autokernel.results"),
    ("import autokernel\nautokernel.ROOT\n", "autokernel.ROOT"),
    ("from models.load import load_model\n", "load_model from models.load"),
])
def test_a_name_the_package_does_not_carry_is_named(source, named):
    with pytest.raises(UsageError, match=named):
        package_relative(source, "x.py", {"KERNEL_TYPES", "rel"})


def test_a_kept_cuda_kernel_is_left_out_with_the_reason(tmp_path):
    """The package cannot build CUDA C++ (autokernel/cuda_build.py stays behind): a kept CUDA
    kernel is listed as left out, never shipped to fail at import."""
    from autokernel.export import kept_kernels
    from autokernel.results import read_rows
    cuda = tmp_path / "reduce_1.py"
    cuda.write_text((ROOT / "kernels" / "cuda" / "reduce.py").read_text())
    plan = {"kernels": [{"name": "reduce_1", "kernel_type": "reduce", "file": str(cuda),
                         "shapes": [[32, 32]]}]}
    results = tmp_path / "results.tsv"
    append_row({"experiment": 1, "tag": "reduce_1", "kernel_type": "reduce", "latency_us": 9.0,
                "correctness": "PASS", "status": "keep", "commit": "abc1234",
                "kernel_sha256": digest(cuda.read_bytes())}, results)
    lines = []
    assert kept_kernels(plan, read_rows(results), log=lines.append) == []
    assert "CUDA C++ kernel" in lines[0] and lines[0].endswith("left out"), lines
