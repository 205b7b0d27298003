"""verify.py on the CPU (Triton interpreter): every kernel type swapped into a shipped model with
real calls and matching outputs, a wrong kernel caught and named by --diagnose, a kernel that
never runs failed, bad input answered in one line.

The kernels are the small, interpreter-friendly ones in tests/kernels_for_verify/ (one per type;
the wrong ones are written from them by the tests); models are tiny configs of models/."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autokernel
import verify
from autokernel import regate, verify_run, verify_select
from autokernel.weight_cache import WeightCache
from models import bert, custom, gpt2, llama

ROOT = Path(__file__).resolve().parent.parent
KDIR = Path(__file__).resolve().parent / "kernels_for_verify"
TINY_LLAMA = llama.LLaMAConfig(vocab_size=256, max_seq=64, n_layer=1, n_head=2, dim=64, hidden=128)


def kernels(*names):
    return [verify_select.load_kernel(KDIR / f"{n}.py") for n in names]


def kernel_paths(*names):
    return ",".join(str(KDIR / f"{n}.py") for n in names)


def nontrivial_norms(model):
    """Norm weights/biases away from 1/0, so a kernel that drops them shows."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            for name in ("weight", "bias"):
                p = getattr(m, name, None)
                if isinstance(p, nn.Parameter) and p.dim() == 1 and not isinstance(m, nn.Linear):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (name == "weight"))
    return model.eval()


def by_name(report):
    return {e["name"]: e for e in report["kernels"]}


def assert_all_ran_and_match(report, names):
    entries = by_name(report)
    for n in names:
        assert entries[n]["calls"] > 0, (n, entries[n])
        assert entries[n]["status"] == "ok", (n, entries[n])
        assert entries[n]["shapes"]
    assert report["correctness"]["passed"], report["correctness"]
    assert report["correctness"]["rel_err"] <= report["correctness"]["tolerance"]
    assert report["passed"] and not report["failures"], report["failures"]


# ---- the kernel types in the shipped models ---------------------------------------------------

def test_llama_matmul_rmsnorm_attention_mlp_rotary():
    torch.manual_seed(0)
    model = nontrivial_norms(llama.LLaMA(TINY_LLAMA))
    names = ("matmul", "rmsnorm", "flash_attention", "fused_mlp", "rotary_embedding")
    report = verify_run.verify(model, llama.get_inputs(2, 16, config=TINY_LLAMA), kernels(*names),
                               timing=False)
    assert_all_ran_and_match(report, names)
    calls = {n: e["calls"] for n, e in by_name(report).items()}
    # 1 layer: q,k,v,o + lm_head (the MLP's three projections run inside fused_mlp);
    # two norms + the final one; q and k rotated; one attention; one MLP.
    assert calls == {"matmul": 5, "rmsnorm": 3, "flash_attention": 1, "fused_mlp": 1,
                     "rotary_embedding": 2}
    assert by_name(report)["fused_mlp"]["shapes"] == ["32x64x128"]
    assert report["correctness"]["output"] == "logits" and report["correctness"]["top1"] == 1.0
    # Everything is restored: no instance forward left, the original model still runs.
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_gpt2_fp16_layernorm_and_linear_with_bias():
    torch.manual_seed(0)
    cfg = gpt2.GPT2Config(vocab_size=128, max_seq=32, n_layer=1, n_head=2, dim=64)
    model = nontrivial_norms(gpt2.GPT2(cfg)).half()
    names = ("layernorm", "matmul", "flash_attention")
    report = verify_run.verify(model, gpt2.get_inputs(1, 16, config=cfg), kernels(*names),
                               timing=False)
    assert_all_ran_and_match(report, names)
    assert report["dtype"] == "fp16" and report["correctness"]["tolerance"] == 2e-2
    assert by_name(report)["layernorm"]["calls"] == 3
    assert by_name(report)["matmul"]["notes"] == []  # the bias goes into the kernel's epilogue


def test_unaligned_vocab_is_padded_and_dispatched_by_the_model_shape(tmp_path):
    """An odd vocabulary (GPT-2's 50257) gives W.t() rows that are not 128-byte aligned: the
    weight copy gets zero columns, the kernel sees N=192, and the model, the report and the
    dispatch see N=131."""
    torch.manual_seed(0)
    cfg = gpt2.GPT2Config(vocab_size=131, max_seq=32, n_layer=1, n_head=2, dim=64)
    model = nontrivial_norms(gpt2.GPT2(cfg)).half()
    lm_head = {"name": "matmul_lm_head", "kernel_type": "matmul", "file": str(KDIR / "matmul.py"),
               "shapes": [[16, 131, 64]], "dtype": "fp16", "share": 0.1}
    rest = dict(lm_head, name="matmul_rest", shapes=[])
    (tmp_path / "plan.json").write_text(json.dumps({"kernels": [lm_head, rest]}))

    class Args:
        kernels, starters, plan, no_regate = None, False, str(tmp_path / "plan.json"), True
    weights = WeightCache()
    padded = weights.transposed(model.wte.weight)  # the lm_head is tied to the embedding
    assert padded.shape == (64, 192) and padded.is_contiguous()
    assert torch.equal(padded[:, :131], model.wte.weight.t()) and not padded[:, 131:].any()
    report = verify_run.verify(model, gpt2.get_inputs(1, 16, config=cfg),
                               verify_select.select_kernels(Args)[0], timing=False)
    entry = by_name(report)["matmul_lm_head"]
    assert entry["calls"] == 1 and entry["shapes"] == ["16x131x64"], entry
    assert by_name(report)["matmul_rest"]["calls"] == 4  # qkv, proj, fc, fc proj (aligned)
    assert report["passed"] and report["correctness"]["shape"] == [1, 16, 131]


def test_custom_softmax_sum_cross_entropy_and_timing():
    torch.manual_seed(0)
    cfg = custom.CustomConfig(vocab_size=128, max_seq=32, n_layer=1, n_head=2, dim=32)
    model = nontrivial_norms(custom.CustomModel(cfg))
    names = ("softmax", "reduce", "cross_entropy")
    report = verify_run.verify(model, custom.get_inputs(2, 16, config=cfg), kernels(*names),
                               warmup=0, repeat=1)
    assert_all_ran_and_match(report, names)
    assert by_name(report)["softmax"]["shapes"] == ["64x16"]  # B*H*S rows of S scores
    # forward returns the loss: the logits it was computed from are compared, and the loss too
    assert report["correctness"]["output"] == "logits (the loss's input)"
    assert report["correctness"]["shape"] == [32, 128]
    assert report["correctness"]["loss_rel_err"] <= report["correctness"]["tolerance"]
    t = report["timing"]
    assert t["eager_ms"] > 0 and t["kernels_ms"] > 0 and t["compile_ms"] is None
    assert report["speedup_vs_eager"] == pytest.approx(t["eager_ms"] / t["kernels_ms"])
    assert not report["timing_meaningful"]
    for e in report["kernels"]:
        assert e["alone_ms"] > 0 and e["gain_ms"] == pytest.approx(t["eager_ms"] - e["alone_ms"])
    assert t["gainers"] == [e["name"] for e in report["kernels"] if e["gain_ms"] > 0]
    # the gainers are timed together only when they are some, not all, of the kernels
    assert (t["gainers_ms"] is not None) == (0 < len(t["gainers"]) < len(names))
    # ...and then their outputs are compared too: only then are they a candidate for best
    assert (t["gainers_correctness"] is not None) == (t["gainers_ms"] is not None)
    if t["gainers_correctness"] is not None:
        assert t["gainers_correctness"]["passed"], t["gainers_correctness"]


def test_wrong_softmax_in_custom_model_is_caught(tmp_path):
    """The loss alone must expose a wrong kernel too (custom's forward returns only the loss)."""
    wrong = tmp_path / "bad_softmax.py"
    wrong.write_text((KDIR / "softmax.py").read_text().replace(
        "e / tl.sum(e, axis=1)[:, None]", "e / (tl.sum(e, axis=1)[:, None] + 0.5)"))
    torch.manual_seed(0)
    cfg = custom.CustomConfig(vocab_size=128, max_seq=32, n_layer=1, n_head=2, dim=32)
    model = nontrivial_norms(custom.CustomModel(cfg))
    report = verify_run.verify(model, custom.get_inputs(2, 16, config=cfg),
                               [verify_select.load_kernel(wrong)], timing=False)
    assert not report["passed"] and by_name(report)["softmax"]["status"] == "mismatch"
    assert any("outputs mismatch" in f for f in report["failures"])


# ---- kernels that do not replace anything ---------------------------------------------------

def test_bert_bidirectional_attention_and_its_eps_run_on_the_kernels():
    """BERT's attention is bidirectional and its LayerNorm eps is 1e-12: both are the contract's
    arguments, so both kernels replace the model's ops."""
    cfg = bert.BERTConfig(vocab_size=128, max_seq=32, n_layer=1, n_head=2, dim=32, hidden=64)
    model = nontrivial_norms(bert.BERT(cfg))
    names = ("flash_attention", "layernorm")
    report = verify_run.verify(model, bert.get_inputs(1, 8, config=cfg), kernels(*names),
                               timing=False)
    assert_all_ran_and_match(report, names)
    assert all(not e["fallbacks"] for e in report["kernels"])


def test_rmsnorm_module_with_its_own_eps_is_swapped_and_a_missing_kernel_fails():
    cfg = llama.LLaMAConfig(vocab_size=64, max_seq=16, n_layer=1, n_head=2, dim=32, hidden=64,
                            eps=1e-5)
    model = nontrivial_norms(llama.LLaMA(cfg))
    report = verify_run.verify(model, llama.get_inputs(1, 8, config=cfg),
                               kernels("rmsnorm", "layernorm"), timing=False)
    entries = by_name(report)
    assert entries["rmsnorm"]["status"] == "ok" and entries["rmsnorm"]["calls"] == 3
    assert report["correctness"]["passed"], report["correctness"]
    assert entries["layernorm"]["status"] == "never ran"  # LLaMA has no layernorm at all
    assert any("no matching op in the model" in f for f in report["failures"])


class Scale(nn.Module):  # a leaf with a 1-D weight that is no norm: left alone
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.weight


class Norm(nn.Module):  # RMSNorm by hand, under a name no rule knows, eps in the code
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class LN(nn.Module):  # LayerNorm by hand: var_mean, its own eps attribute, weight and bias
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(n)), \
            nn.Parameter(torch.zeros(n)), eps

    def forward(self, x):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class OffByEps(Norm):  # computes RMSNorm, but eps 1e-5 is not what its graph says (1e-1)
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-1) * self.weight \
            if x.shape[0] == 4 else super().forward(x)


class FeedForward(nn.Module):  # Meta's LLaMA MLP: w1 gate, w3 up, w2 down
    def __init__(self, n, hidden):
        super().__init__()
        # up registered first: which projection is the gate is found by the numbers
        self.w3, self.w2, self.w1 = nn.Linear(n, hidden, bias=False), \
            nn.Linear(hidden, n, bias=False), nn.Linear(n, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Ungated(FeedForward):  # three projections, no gate: left alone
    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) + self.w3(x))


class HandWritten(nn.Module):
    def __init__(self, n=32):
        super().__init__()
        self.a, self.b, self.c = Norm(n), LN(n, 1e-6), LN(n, 1e-3)
        self.scale, self.odd, self.proj = Scale(n), OffByEps(n), nn.Linear(n, n)
        self.ffn, self.ungated = FeedForward(n, 48), Ungated(n, 48)

    def forward(self, x):
        x = self.odd(self.scale(self.c(self.proj(self.b(self.a(x))))))
        return self.ungated(x + self.ffn(x))


def test_norms_and_mlps_written_by_hand_are_recognized_by_what_they_compute():
    """Modules no name-based rule knows get the kernels when their captured graph is one
    rmsnorm, layernorm or gated MLP and their output confirms the reading (a norm's eps from
    the graph and its own weight and bias; which projection is the gate); a module whose numbers
    disagree keeps its forward, with the reason."""
    torch.manual_seed(0)
    model = nontrivial_norms(HandWritten())
    report = verify_run.verify(model, {"x": torch.randn(2, 5, 32)},
                               kernels("rmsnorm", "layernorm", "fused_mlp"), timing=False)
    entries = by_name(report)
    assert entries["rmsnorm"]["calls"] == 1 and entries["layernorm"]["calls"] == 2, entries
    assert entries["fused_mlp"]["calls"] == 1, entries
    assert report["correctness"]["passed"], report["correctness"]
    skipped = entries["rmsnorm"]["skipped"]
    assert any("differs from rmsnorm with eps 0.1" in reason for reason in skipped), skipped


def test_crashing_and_misshapen_kernels_are_named(tmp_path):
    bad = tmp_path / "bad_reduce.py"
    bad.write_text('KERNEL_TYPE = "reduce"\n\ndef kernel_fn(x, dim=-1):\n'
                   '    return x.reshape(-1, x.shape[-1])[:, :1].clone()\n')
    boom = tmp_path / "boom_reduce.py"
    boom.write_text('KERNEL_TYPE = "reduce"\n\ndef kernel_fn(x, dim=-1):\n'
                    '    raise RuntimeError("oops")\n')
    cfg = custom.CustomConfig(vocab_size=64, max_seq=16, n_layer=1, n_head=2, dim=32)
    model = custom.CustomModel(cfg).eval()
    for path, words in ((bad, "returned (16, 1)"), (boom, "raised RuntimeError: oops")):
        report = verify_run.verify(model, custom.get_inputs(2, 8, config=cfg),
                                   [verify_select.load_kernel(path)], timing=False)
        entry = report["kernels"][0]
        assert entry["status"] == "crashed" and words in entry["error"], entry
        assert not report["passed"]


# ---- the interception rules on odd call forms -----------------------------------------------

class Variants(nn.Module):
    def forward(self, x, targets):
        ignored = targets.clone()
        ignored[0] = -100
        return torch.stack([
            torch.softmax(x, -1).sum(),              # softmax, then a full sum (not last-dim)
            x.softmax(dim=-1)[..., 0].mean(),        # Tensor.softmax
            F.softmax(x, dim=0).mean(),              # not the last dim: original op
            x.sum(-1, keepdim=True).mean(),          # Tensor.sum, keepdim
            torch.sum(x, dim=(-1,)).mean(),          # a one-element dim tuple
            x.sum(1, keepdim=True).mean(),           # a middle dim
            x.sum((0, 1)).mean(),                    # two dims: original op
            F.cross_entropy(x.view(-1, x.shape[-1]), targets),
            F.cross_entropy(x.view(-1, x.shape[-1]), ignored),  # ignore_index hit: original
        ])


def test_call_variants_swap_or_fall_back_with_reasons():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, generator=gen)
    targets = torch.randint(0, 40, (6,), generator=gen)
    report = verify_run.verify(Variants(), (x, targets),
                               kernels("softmax", "reduce", "cross_entropy"), timing=False)
    entries = by_name(report)
    assert report["passed"], report["failures"]
    assert entries["softmax"]["calls"] == 2
    assert entries["softmax"]["fallbacks"] == {"not over the last dim": 1}
    assert entries["reduce"]["calls"] == 3
    assert entries["reduce"]["fallbacks"] == {"not over exactly one dim": 2}  # and the full sum
    assert entries["cross_entropy"]["calls"] == 1
    assert entries["cross_entropy"]["fallbacks"] == {"targets hit ignore_index": 1}


class AttentionVariants(nn.Module):
    def forward(self, q, k, v, k_few, v_few):
        mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
        return torch.stack([
            F.scaled_dot_product_attention(q, k, v, is_causal=True),
            F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5),
            F.scaled_dot_product_attention(q, k_few, v_few, is_causal=True, enable_gqa=True),
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask),      # masked: original
            F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
            F.scaled_dot_product_attention(q, k_few, v_few, scale=0.2, enable_gqa=True),
        ])


def test_attention_variants_swap_or_fall_back_with_reasons():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 8, 16, generator=gen) for _ in range(3))
    k_few, v_few = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(2))
    report = verify_run.verify(AttentionVariants(), (q, k, v, k_few, v_few),
                               kernels("flash_attention"), timing=False)
    entry = report["kernels"][0]
    assert report["passed"], report["failures"]
    assert entry["calls"] == 5
    assert entry["fallbacks"] == {"attention mask": 1}
    assert entry["notes"] == []  # grouped-query heads are read by the kernel, not repeated


def test_two_kernels_of_one_type_dispatch_by_declared_shape(tmp_path):
    """plan.json can list several kernels of one type: each owns the shapes it declared."""
    plan = {"kernels": [
        {"name": "matmul_lm_head", "kernel_type": "matmul", "file": str(KDIR / "matmul.py"),
         "shapes": [[32, 256, 64]], "dtype": "fp32", "share": 0.1},
        {"name": "matmul_rest", "kernel_type": "matmul", "file": str(KDIR / "matmul.py"),
         "shapes": [], "dtype": "fp32", "share": 0.3}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    class Args:
        kernels, starters, plan, no_regate = None, False, str(tmp_path / "plan.json"), True
    ks = verify_select.select_kernels(Args)[0]
    torch.manual_seed(0)
    # The strided W.t() view (--weight-layout view) instead of a contiguous copy: the test
    # matmul honours strides, so the outputs must still match.
    report = verify_run.verify(llama.LLaMA(TINY_LLAMA).eval(), llama.get_inputs(2, 16,
                               config=TINY_LLAMA), ks, timing=False, weight_layout="view")
    entries = by_name(report)
    assert entries["matmul_lm_head"]["shapes"] == ["32x256x64"]
    assert entries["matmul_lm_head"]["calls"] == 1
    assert entries["matmul_rest"]["calls"] == 7  # q, k, v, o and the MLP's three projections
    assert report["passed"]


# ---- the CLI --------------------------------------------------------------------------------

TINY_MODEL_FILE = '''
from models import llama
CONFIGS = {"tiny": llama.LLaMAConfig(vocab_size=256, max_seq=64, n_layer=1, n_head=2, dim=64,
                                     hidden=128)}
Model = llama.LLaMA
DEFAULT_INPUT_SHAPE = (2, 16)


def get_inputs(batch, seq, device="cpu", config=CONFIGS["tiny"]):
    return llama.get_inputs(batch, seq, device, config)
'''


@pytest.fixture
def tiny_model(tmp_path):
    path = tmp_path / "tiny_llama.py"
    path.write_text(TINY_MODEL_FILE)
    return ["--model", str(path), "--input-shape", "2x16", "--dtype", "fp32"]


def test_wrong_kernel_fails_and_diagnose_names_it(tiny_model, tmp_path, capsys):
    source = (KDIR / "rmsnorm.py").read_text()
    wrong = source.replace("SCALE = 1.0", 'SCALE = 1.25  # deliberately wrong\n'
                           'KERNEL_NAME = "wrong_rmsnorm"')
    assert wrong != source
    (tmp_path / "wrong_rmsnorm.py").write_text(wrong)
    out = tmp_path / "verify.json"
    args = tiny_model + ["--kernels", f"{kernel_paths('matmul')},{tmp_path / 'wrong_rmsnorm.py'}",
                         "--out", str(out)]
    assert verify.main(args + ["--no-regate"]) == 1
    text = capsys.readouterr().out
    assert "outputs mismatch" in text and "--diagnose" in text and "verdict: FAIL" in text
    assert json.loads(out.read_text())["passed"] is False

    assert verify.main(args + ["--diagnose", "--no-regate"]) == 1
    lines = capsys.readouterr().out.splitlines()
    failing = [ln for ln in lines if ln.startswith("diagnose: FAIL")]
    assert len(failing) == 1 and "wrong_rmsnorm" in failing[0] and "wrong_rmsnorm.py" in failing[0]
    assert "max rel err" in failing[0]
    assert any(ln.startswith("diagnose: matmul") and "ok alone" in ln for ln in lines)
    report = json.loads(out.read_text())
    entries = by_name(report)
    assert entries["wrong_rmsnorm"]["status"] == "mismatch"
    assert entries["wrong_rmsnorm"]["alone"]["rel_err"] > 0.1
    assert entries["matmul"]["alone"]["passed"] and entries["matmul"]["status"] == "ok"


def test_starters_without_a_call_site_are_neither_regated_nor_imported(tiny_model, tmp_path,
                                                                         monkeypatch, capsys):
    """--starters re-gates (a minute or so each on a GPU) and imports only the starters whose
    kernel type the model calls; the rest are listed as unused. Here the LLaMA has no layernorm
    or softmax: their files would raise if imported."""
    starters = tmp_path / "starters"
    starters.mkdir()
    for name in ("matmul", "rmsnorm"):
        (starters / f"{name}.py").write_text((KDIR / f"{name}.py").read_text())
    for name in ("layernorm", "softmax"):
        (starters / f"{name}.py").write_text(f'KERNEL_TYPE = "{name}"\n'
                                             f'raise RuntimeError("imported")\n')
    monkeypatch.setattr(autokernel, "starters_dir", lambda backend: starters)
    regated = []
    monkeypatch.setattr(regate, "run_gates", lambda paths, **_: {
        str(p): (regated.append(Path(p).name) or True, "PASS") for p in paths})
    out = tmp_path / "verify.json"
    assert verify.main(tiny_model + ["--starters", "--no-timing", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 of 4 starters have no call site in this model beside the others " \
           "(layernorm, softmax)" in text
    assert sorted(regated) == ["matmul.py", "rmsnorm.py"]
    entries = by_name(json.loads(out.read_text()))
    assert [entries[n]["status"] for n in ("layernorm", "matmul", "rmsnorm", "softmax")] == \
        ["unused", "ok", "ok", "unused"]
    assert entries["softmax"]["calls"] == 0 and entries["matmul"]["calls"] > 0


def test_a_refused_kernel_gives_its_call_sites_back(tiny_model, tmp_path, monkeypatch, capsys):
    """qkv_rotary takes the attention layers' rotation from rotary_embedding: with both given,
    rotary_embedding has no call site of its own. When qkv_rotary then fails its re-gate, the
    rotation is rotary_embedding's again, and it is re-gated and run."""
    monkeypatch.setattr(regate, "run_gates", lambda paths, **_: {
        str(p): (False, "FAIL: planted") if Path(p).name == "qkv_rotary.py" else (True, "PASS")
        for p in paths})
    out = tmp_path / "v.json"
    argv = tiny_model + ["--kernels", kernel_paths("qkv_rotary", "rotary_embedding", "matmul"),
                         "--no-timing", "--out", str(out)]
    assert verify.main(argv) == 1  # a refused file fails the run
    text = capsys.readouterr().out
    assert "1 of 3 kernel files have no call site in this model beside the others " \
           "(rotary_embedding)" in text and "1 more have call sites" in text, text
    report = json.loads(out.read_text())
    assert by_name(report)["rotary_embedding"]["calls"] == 2  # q and k of the one layer
    assert not report["regate"][kernel_paths("qkv_rotary")]["passed"]


def test_no_call_site_at_all_still_reports(tiny_model, tmp_path, monkeypatch, capsys):
    """Nothing to plug in: exit 1 and a verify.json that says so, starters or named files."""
    starters = tmp_path / "starters"
    starters.mkdir()
    (starters / "softmax.py").write_text('KERNEL_TYPE = "softmax"\n'
                                         'raise RuntimeError("imported")\n')
    monkeypatch.setattr(autokernel, "starters_dir", lambda backend: starters)
    for source in (["--starters"], ["--kernels", kernel_paths("softmax")]):
        out = tmp_path / "v.json"
        assert verify.main(tiny_model + source + ["--no-timing", "--out", str(out)]) == 1
        report = json.loads(out.read_text())
        assert any("no kernel ran" in f for f in report["failures"]), report["failures"]
        assert by_name(report)["softmax"]["calls"] == 0
    capsys.readouterr()


def test_a_model_that_raises_is_one_line(tmp_path, capsys):
    """The call-site check runs the model first: its error is still verify's one line."""
    path = tmp_path / "raising.py"
    path.write_text(TINY_MODEL_FILE.replace("Model = llama.LLaMA", """
class Model(llama.LLaMA):
    def forward(self, *args, **kwargs):
        raise ValueError("boom")
"""))
    code = verify.main(["--model", str(path), "--input-shape", "2x16", "--dtype", "fp32",
                        "--kernels", kernel_paths("rmsnorm"), "--no-timing", "--no-regate",
                        "--out", str(tmp_path / "v.json")])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "the original model raised ValueError: boom" in err, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err


def test_cli_never_ran_is_a_failure(tiny_model, tmp_path, capsys):
    args = tiny_model + ["--kernels", kernel_paths("rmsnorm", "softmax"), "--no-timing",
                         "--out", str(tmp_path / "v.json")]
    assert verify.main(args + ["--no-regate"]) == 1
    text = capsys.readouterr().out
    assert "FAIL softmax" in text and "never ran" in text
    assert "1 of 2 kernel files have no call site in this model beside the others (softmax)" \
        in text  # so not loaded
    # nothing broke the model (its outputs match): the hint is to drop the file, not --diagnose
    assert "leave it out of --kernels" in text and "--diagnose" not in text
    assert "re-gate: skipped (--no-regate)" in text
    assert json.loads((tmp_path / "v.json").read_text())["regate"] is None


def test_cli_subprocess_timing_compile_and_json(tiny_model, tmp_path):
    """Run as a top-level script from the repo root (where our profile.py shadows the stdlib's)
    with torch.compile on: the compile path must work and verify.json must hold the timings."""
    out = tmp_path / "verify.json"
    env = dict(os.environ, TRITON_INTERPRET="1", AUTOKERNEL_WORKSPACE=str(autokernel.WORKSPACE))
    proc = subprocess.run(
        [sys.executable, "verify.py", *tiny_model, "--kernels", kernel_paths("rmsnorm", "matmul"),
         "--warmup", "0", "--repeat", "1", "--compile-backend", "eager", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["passed"] and report["timing"]["compile_ms"] > 0
    # each kernel file went through the gate before it was plugged in
    assert "re-gating 2 kernel file(s)" in proc.stdout and "[2 of 2 done" in proc.stdout
    assert all(c["passed"] and c["gate"].startswith("PASS") for c in report["regate"].values())
    assert report["speedup_vs_compile"] > 0 and "NOT meaningful" in proc.stdout
    assert {e["name"]: e["calls"] > 0 for e in report["kernels"]} == {"rmsnorm": True,
                                                                      "matmul": True}
    t = report["timing"]
    for e in report["kernels"]:  # a share of the gain exists only when there is a gain
        assert (e["share"] is not None) == (t["eager_ms"] > t["kernels_ms"]), (e, t)
        if e["share"] is not None:
            assert e["share"] == pytest.approx(e["gain_ms"] / (t["eager_ms"] - t["kernels_ms"]))


def test_hf_llama_swaps(tmp_path, capsys):
    pytest.importorskip("transformers")
    import transformers.models.llama.modeling_llama as modeling_llama
    original = modeling_llama.apply_rotary_pos_emb
    names = ("matmul", "rmsnorm", "rotary_embedding", "fused_mlp", "flash_attention")
    out = tmp_path / "verify.json"
    code = verify.main(["--module", "transformers", "--hf-config", "tiny-llama", "--input-shape",
                        "1x16", "--dtype", "fp32", "--kernels", kernel_paths(*names),
                        "--no-timing", "--no-regate", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    entries = by_name(json.loads(out.read_text()))
    assert all(entries[n]["calls"] > 0 for n in names), entries
    assert entries["rotary_embedding"]["calls"] == 4   # q and k in each of the 2 layers
    assert entries["rmsnorm"]["calls"] == 5
    assert modeling_llama.apply_rotary_pos_emb is original


def test_hf_gpt2_conv1d_addmm_swaps(tmp_path, capsys):
    """transformers' GPT-2 projects through Conv1D (torch.addmm), not F.linear."""
    pytest.importorskip("transformers")
    names = ("matmul", "layernorm", "flash_attention")
    out = tmp_path / "verify.json"
    code = verify.main(["--module", "transformers", "--hf-config", "tiny-gpt2", "--input-shape",
                        "1x16", "--dtype", "fp32", "--kernels", kernel_paths(*names),
                        "--no-timing", "--no-regate", "--out", str(out)])
    assert code == 0, capsys.readouterr().out
    entries = by_name(json.loads(out.read_text()))
    assert all(entries[n]["calls"] > 0 for n in names), entries
    assert entries["matmul"]["notes"] == []  # Conv1D's bias goes into the kernel's epilogue


def test_a_keep_the_plan_cannot_place_is_named(tmp_path, capsys):
    """A kept row on this branch whose tag no plan kernel has (kernel.py judged under another
    name) is named on a line of its own; a plan kernel's keep and a row of another branch not."""
    from autokernel.results import append_row
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    plan = {"created": "2026-01-01T00:00:00+00:00",
            "kernels": [{"name": "softmax_1", "kernel_type": "softmax", "share": 0.5,
                         "file": str(KDIR / "softmax.py"), "shapes": [[4, 64]]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    tsv = tmp_path / "results.tsv"
    for n, tag, commit in ((1, "softmax_1", head), (2, "softmax", head), (3, "reduce", "0" * 40)):
        append_row({"experiment": n, "tag": tag, "kernel_type": tag.split("_")[0],
                    "latency_us": 9.0, "correctness": "PASS", "status": "keep",
                    "commit": commit}, tsv)

    class Args:
        kernels, starters, plan, no_regate = None, False, str(tmp_path / "plan.json"), False
        results = str(tsv)
    specs, rows = verify.kernel_specs(Args)
    assert [s[1] for s in specs] == ["softmax_1"] and len(rows) == 3
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == [f"unplaced keep: experiment 2, tag softmax, commit {head}: no kernel of "
                     f"plan.json is named 'softmax', so it is neither verified nor exported (its "
                     f"code: git show {head}:kernel.py)"]


def test_bad_input_is_one_line(tiny_model, tmp_path, capsys):
    bad_type = tmp_path / "bad.py"
    bad_type.write_text('KERNEL_TYPE = "conv"\ndef kernel_fn(x):\n    return x\n')
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text('{"kernels": [{"name": "no_file"}]}')
    cases = [
        (["--kernels", str(tmp_path / "missing.py")], "does not exist"),
        (["--kernels", "softmax"], "did you mean kernels/softmax.py?"),  # a type, not a file
        (["--kernels", str(bad_type)], "unknown KERNEL_TYPE 'conv'"),
        (["--plan", str(tmp_path / "none.json")], "run extract.py first"),
        (["--plan", str(bad_plan)], "re-run `uv run extract.py`"),
        (["--kernels", kernel_paths("rmsnorm"), "--starters"], "not both"),
        (["--kernels", kernel_paths("rmsnorm"), "--repeat", "0"], "--repeat >= 1"),
        (["--kernels", kernel_paths("rmsnorm"), "--input-shape", "2by16"], "--input-shape"),
        (["--kernels", kernel_paths("rmsnorm"), "--cuda-graphs"], "needs a CUDA GPU"),
    ]
    for extra, words in cases:
        argv = [a for a in tiny_model if a not in ("--input-shape", "2x16")] + extra \
            if "--input-shape" in extra else tiny_model + extra
        assert verify.main(argv + ["--no-regate"]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err, err


def test_a_wrong_model_flag_is_named_before_any_re_gate(tmp_path, monkeypatch, capsys):
    """Re-gating the kernels takes minutes: a mistyped --model is refused before it starts."""
    import autokernel.regate
    monkeypatch.setattr(autokernel.regate, "check_all", lambda *a: pytest.fail("re-gated"))
    (tmp_path / "notes.md").write_text("# not a model\n")
    for model, words in ((tmp_path / "nope.py", "not found"), (tmp_path / "notes.md",
                                                               "is not a .py file")):
        assert verify.main(["--model", str(model), "--kernels", kernel_paths("rmsnorm")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err


def test_each_long_step_says_what_runs_and_what_is_left(tiny_model, tmp_path, capsys):
    """No silent stretch: before each long step, a line with its number of all, what it runs and
    the steps after it, in the order they run, all before the report."""
    assert verify.main(tiny_model + ["--kernels", kernel_paths("rmsnorm"), "--no-regate",
                                     "--no-timing", "--out", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    names = ["load the model", "find call sites", "run the original", "run with the kernels"]
    at = [out.find(f"step {i}/4: {name}") for i, name in enumerate(names, start=1)]
    assert -1 not in at and at == sorted(at) and at[-1] < out.find("correctness:"), out
    second = next(line for line in out.splitlines() if "step 2/4" in line)
    assert second.endswith("(then: run the original, run with the kernels)"), second


def test_a_long_step_is_never_silent(capsys):
    """While a step runs longer than the heartbeat, a line says it is still running and how far
    it got; none once the step is over."""
    import threading

    from autokernel.verify_report import Steps
    steps, calls, beats = Steps(["run with the kernels"]), [3], threading.Event()

    def progress():
        beats.set()
        return f"{calls[0]} kernel calls so far"
    with steps.heartbeat("running the forward with the kernels", progress, every_s=0.01):
        assert beats.wait(60), "no heartbeat while the step ran"
        beats.clear()
        assert beats.wait(60)
    after = capsys.readouterr().out.splitlines()
    assert after and all("... still running the forward with the kernels: " in line
                         and line.endswith(", 3 kernel calls so far") for line in after), after
    assert capsys.readouterr().out == ""  # the heartbeat stopped with the step


def test_model_flags_come_from_profile_json(tiny_model, tmp_path, monkeypatch, capsys):
    """With no model flags, verify rebuilds the model profile.py recorded in profile.json."""
    model_file = tiny_model[1]
    profile_json = tmp_path / "profile.json"
    profile_json.write_text(json.dumps({"entries": [], "model_args": {
        "model": model_file, "class_name": None, "config": None, "module": None,
        "hf_config": None, "input_shape": "1x8", "dtype": "fp32", "device": None}}))
    monkeypatch.setattr(autokernel, "PROFILE_JSON", profile_json)
    out = tmp_path / "v.json"
    assert verify.main(["--kernels", kernel_paths("rmsnorm"), "--no-timing", "--no-regate",
                        "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model flags from" in text and "--input-shape 1x8" in text
    report = json.loads(out.read_text())
    assert report["kernels"][0]["shapes"] == ["8x64"] and "tiny_llama.py" in report["model"]


def test_model_flags_come_from_the_profile_the_plan_names(tiny_model, tmp_path, monkeypatch,
                                                        capsys):
    """The plan's kernels come from the model its own profile recorded (extract.py --profile),
    not from whatever workspace/profile.json holds now; a plan whose profile is gone says so."""
    def profile(name, input_shape):
        path = tmp_path / name
        path.write_text(json.dumps({"entries": [], "model_args": {
            "model": tiny_model[1], "input_shape": input_shape, "dtype": "fp32"}}))
        return path
    monkeypatch.setattr(autokernel, "PROFILE_JSON", profile("profile.json", "2x16"))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"profile": str(profile("night_profile.json", "1x8")), "kernels": [
        {"name": "rmsnorm", "kernel_type": "rmsnorm", "file": str(KDIR / "rmsnorm.py"),
         "share": 0.5}]}))
    out = tmp_path / "v.json"
    argv = ["--plan", str(plan), "--no-timing", "--no-regate", "--out", str(out)]
    assert verify.main(argv) == 0
    assert "model flags from" in capsys.readouterr().out
    assert json.loads(out.read_text())["kernels"][0]["shapes"] == ["8x64"]  # 1x8, not 2x16
    (tmp_path / "night_profile.json").unlink()
    assert verify.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "night_profile.json" in err and "gone" in err, err


def test_the_morning_recheck_refuses_files_that_no_kept_row_vouches_for(tmp_path):
    import hashlib
    from autokernel import regate
    kernel = tmp_path / "softmax_1.py"
    kernel.write_text("KERNEL_TYPE = 'softmax'\n")
    digest = hashlib.sha256(kernel.read_bytes()).hexdigest()

    def kept(n, sha):
        return {"tag": "softmax_1", "status": "keep", "correctness": "PASS", "experiment": str(n),
                "kernel_sha256": sha, "commit": "abc1234", "latency_us": "10.0"}
    assert regate.kept_version(kernel, "softmax_1", [])[0] is None  # the starter: a warning
    ok, text = regate.kept_version(kernel, "softmax_1", [kept(1, digest)])
    assert ok and "experiment 1, commit abc1234" in text
    ok, text = regate.kept_version(kernel, "softmax_1", [kept(1, digest), kept(2, "0" * 64)])
    assert ok and "older keep" in text
    ok, text = regate.kept_version(kernel, "softmax_1", [kept(3, "f" * 64)])  # forged or edited
    assert ok is False and "matches no kept row" in text


def test_the_morning_rechecks_run_the_gate_side_by_side(tmp_path):
    """Re-gates record nothing, so they share bench.py's lock (here one is held all along) and
    leave a killed recording run's crash record to the next bench.py that records; a bench.py
    that records keeps them waiting."""
    from autokernel import regate, state
    wrong, good = ROOT / "tests" / "planted" / "nan_output.py", ROOT / "kernels" / "softmax.py"
    record = state.SNAPSHOT_PATH
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("the record of a killed bench.py")
    lines = []
    try:
        with state.exclusive(shared=True):
            verdicts = regate.run_gates([wrong, good], at_once=2, log=lines.append)
        assert record.read_text() == "the record of a killed bench.py"
        with state.exclusive():
            refused = regate.regate(good)
    finally:
        record.unlink(missing_ok=True)
    passed, text = verdicts[str(wrong)]
    assert not passed and text.startswith("FAIL") and "NaN" in text
    assert verdicts[str(good)] == (True, "PASS (the correctness stages; not timed)")
    assert any(line.startswith("softmax.py: stage_5_edge: PASS") for line in lines), lines
    assert not refused[0] and "another bench.py is judging" in refused[1], refused


def test_the_regates_gate_checks_correctness_only_and_records_nothing(tmp_path):
    """bench.py --correctness-only (verify.py's re-gate): the stages' verdict and nothing else:
    no timing, no baselines, no row, and no git action even on kernel.py, whose wrong edit a
    judging run would revert."""
    from autokernel.results import append_row
    from test_bench import GIT_ENV, PLANTED, git, make_repo, run_bench
    repo = make_repo(tmp_path / "repo")
    append_row({"experiment": 1, "tag": "reduce", "status": "judged", "correctness": "PASS"},
               repo / "results.tsv")
    results, head = (repo / "results.tsv").read_bytes(), git(repo, "rev-parse", "HEAD")
    wrong = (PLANTED / "nan_output.py").read_text()
    (repo / "kernel.py").write_text(wrong)
    for kernel, verdict in (("kernel.py", "FAIL"), ("kernels/softmax.py", "PASS")):
        run = run_bench(repo, "--correctness-only", "--kernel", kernel, env=dict(
            GIT_ENV, AUTOKERNEL_SANDBOX="off"))  # unconfined: the judge puts the repo back
        assert run["rc"] == 0 and run["keys"]["correctness"] == verdict, run["stdout"]
        assert run["last_line"].startswith("verdict: CHECKED"), run["last_line"]
        assert verdict == "PASS" or "NaN" in run["keys"]["reason"], run["keys"]
        assert not {"latency_us", "rounds_us", "eager_us", "status"} & set(run["keys"]), run["keys"]
        assert (repo / "results.tsv").read_bytes() == results
        assert git(repo, "rev-parse", "HEAD") == head and (repo / "kernel.py").read_text() == wrong
        assert git(repo, "status", "--porcelain").split() == ["M", "kernel.py"]
    # Under the sandbox a re-gate puts nothing back: a commit made while it runs stays.
    proc = subprocess.Popen([sys.executable, "bench.py", "--correctness-only", "--kernel",
                             "kernels/softmax.py"], cwd=repo, env=GIT_ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    while not proc.stdout.readline().startswith("stage_1_smoke"):  # the child runs by now
        assert proc.poll() is None, proc.stdout.read()
    git(repo, "commit", "-qam", "the user's own commit, during the re-gate")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0 and "correctness: PASS" in out, out
    assert git(repo, "log", "-1", "--format=%s").strip() == \
        "the user's own commit, during the re-gate" and git(repo, "status", "--porcelain") == ""


def test_best_variant_is_the_fastest_whose_outputs_were_compared_and_match():
    ok, bad = {"passed": True}, {"passed": False}

    def best(**timing):
        t = dict(kernels_ms=5.0, compile_ms=4.0, gainers_ms=None, gainers_correctness=None,
                 compile_kernels_ms=None, compile_kernels_correctness=None,
                 compile_gainers_ms=None, compile_gainers_correctness=None)
        report = {"timing": dict(t, **timing)}
        verify_run.best_variant(report)
        return report["best_variant"], report["best_speedup_vs_compile"]
    assert best(gainers_ms=2.0, gainers_correctness=ok) == ("gainers", 2.0)
    assert best(gainers_ms=2.0, gainers_correctness=bad) == ("kernels", 0.8)
    assert best(gainers_ms=2.0) == ("kernels", 0.8)  # never compared: no candidate
    assert best(compile_kernels_ms=3.2, compile_kernels_correctness=ok,
                compile_gainers_ms=1.0, compile_gainers_correctness=bad) == ("compile_kernels", 1.25)


def test_a_constant_original_output_is_called_out():
    """A model whose outputs are all one value (a random init that zeroes them) matches any
    kernel's; the comparison passes, but says it could not tell."""
    from autokernel.endtoend import compare
    flat = compare(torch.zeros(2, 10), torch.zeros(2, 10))
    assert flat["passed"] and "constant (0 everywhere)" in flat["note"]
    assert "note" not in compare(torch.eye(3), torch.eye(3))
