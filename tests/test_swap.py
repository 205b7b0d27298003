"""autokernel.swap on the CPU: plugging kernels into a model patches exactly the entry points of
the active kernel types, restores every one of them on exit (also when the forward raises), and
never reads a tensor back while a CUDA graph is being captured. The kernels are the small ones in
tests/kernels_for_verify/; what the swapped models compute is tested through verify.py
(test_verify.py)."""
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import autokernel
from autokernel.endtoend import forward
from autokernel import verify_run, verify_select
from autokernel.swap import SWAP_RULES, Swap
from autokernel.swap_torch import _hits_ignore_index
from models import llama

KDIR = Path(__file__).resolve().parent / "kernels_for_verify"
TINY_LLAMA = llama.LLaMAConfig(vocab_size=256, max_seq=64, n_layer=1, n_head=2, dim=64, hidden=128)


def kernels(*names):
    return [verify_select.load_kernel(KDIR / f"{n}.py") for n in names]


# ---- installing and restoring the patches ---------------------------------------------------

ALL_TYPES = autokernel.KERNEL_TYPE_NAMES


def entry_points():
    """Every attribute a swap rule patches: (the object there now, whether the owner holds it
    itself rather than inheriting it, as torch.Tensor does TensorBase's methods)."""
    return {(owner, attr): (getattr(owner, attr), attr in vars(owner))
            for rule in SWAP_RULES.values() for owner, attr in rule.functions}


def assert_restored(before, model):
    for (owner, attr), (obj, own) in entry_points().items():
        assert obj is before[(owner, attr)][0], (owner, attr)
        assert own == before[(owner, attr)][1], (owner, attr)
    assert not any("forward" in vars(m) for m in model.modules())


class RaisesAfterForward(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, idx):
        self.inner(idx)
        raise RuntimeError("boom after the kernels ran")


def test_installed_restores_every_patch_on_exit_and_on_exception():
    torch.manual_seed(0)
    model = llama.LLaMA(TINY_LLAMA).eval()
    before = entry_points()
    swap = Swap(kernels(*ALL_TYPES))
    with swap.installed(model):
        assert all(getattr(o, a) is not before[(o, a)][0] for o, a in before)  # really patched
        assert any("forward" in vars(m) for m in model.modules())
        forward(model, llama.get_inputs(1, 8, config=TINY_LLAMA))
    assert sum(swap.calls.values()) > 0
    assert_restored(before, model)

    boom = RaisesAfterForward(model)
    swap = Swap(kernels(*ALL_TYPES))
    run, error = verify_run.run_swapped(boom, llama.get_inputs(1, 8, config=TINY_LLAMA), swap)
    assert run is None and "boom after the kernels ran" in error
    assert swap.calls["matmul"] > 0  # the patches were in when it raised
    assert_restored(before, boom)


def test_only_active_types_are_patched_and_no_mode_taxes_the_forward():
    """A model swapping only layernorm runs with no TorchFunctionMode and every other entry
    point (F.linear, Tensor.sum, x @ W, ...) untouched."""
    seen = {}

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.proj = nn.LayerNorm(32), nn.Linear(32, 32)

        def forward(self, x):
            seen["mode"] = torch._C._is_torch_function_mode_enabled()
            seen["patched"] = {(o, a) for o, a in before if getattr(o, a) is not before[(o, a)][0]}
            return self.proj(self.norm(x)).softmax(-1).sum(-1)

    before = entry_points()
    model, swap = Probe(), Swap(kernels("layernorm"))
    with swap.installed(model):
        model(torch.randn(2, 4, 32))
    assert swap.calls["layernorm"] == 1
    assert seen == {"mode": False, "patched": {(F, "layer_norm")}}


def test_ignore_index_check_never_reads_back_during_graph_capture(monkeypatch):
    """Capturing a CUDA graph forbids the read-back: the warm-up's answer for that targets
    shape is reused, and an unseen shape falls back to torch."""
    clean, with_hit = Swap([]), Swap([])
    assert not _hits_ignore_index(clean, torch.tensor([1, 2, 3]), -100)
    assert _hits_ignore_index(with_hit, torch.tensor([1, -100, 3]), -100)
    assert not _hits_ignore_index(with_hit, torch.tensor([1, 2, 3]), -100)  # a later call

    def no_read_back(*args, **kwargs):
        raise AssertionError("read back during a capture")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.Tensor, "any", no_read_back)
    assert not _hits_ignore_index(clean, torch.tensor([4, 5, 6]), -100)
    assert _hits_ignore_index(with_hit, torch.tensor([4, 5, 6]), -100)  # seen at warm-up
    assert _hits_ignore_index(clean, torch.tensor([4, 5]), -100)        # never seen


def test_compiler_tables_are_built_before_the_swap_patches_torch():
    """Inductor keeps torch.addmm as its GEMM fallback when its lowerings are first imported.
    Imported while a compiled swap has torch.addmm patched, the compiled code of every later
    model would call the swap's wrapper (which ignores out=) or find no addmm at all: wrong
    logits in every compiled run after the first. A fresh process, so nothing is imported yet."""
    import subprocess
    import sys
    code = ("import torch, autokernel.kernel_types\n"
            "from autokernel import verify_select\n"
            "from autokernel.swap import Swap\n"
            f"k = verify_select.load_kernel({str(Path(__file__).parent / 'kernels_for_verify' / 'matmul.py')!r})\n"
            "with Swap([k], compiled=True).installed(torch.nn.Linear(2, 2)):\n"
            "    import torch._inductor.lowering\n"
            "from torch._inductor.select_algorithm import extern_kernels\n"
            "import torch._dynamo.trace_rules as rules\n"
            "assert getattr(extern_kernels, 'addmm', None) is torch.addmm, vars(extern_kernels)\n"
            "assert torch._C.TensorBase.matmul in rules.get_tensor_method()\n"
            "assert torch.nn.functional.linear in rules.get_torch_obj_rule_map()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


# ---- q/k/v projections with rotary: attention modules confirmed on a probe --------------------

class NotCausal(llama.Attention):
    """LLaMA's attention with the names and a RotaryEmbedding child, but bidirectional."""

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = (w(x).view(B, S, self.n_head, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(self.rotary(q), self.rotary(k), v)
        return self.wo(y.transpose(1, 2).reshape(B, S, C))


class ScaledQK(llama.Attention):
    """LLaMA's attention with q and k scaled per dim before the rotary by a learned vector,
    initialized to ones: the identity until trained, which the swapped forward leaves out."""

    def __init__(self, config):
        super().__init__(config)
        self.qk_scale = nn.Parameter(torch.ones(self.head_dim))

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = (w(x).view(B, S, self.n_head, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        q, k = self.rotary(q * self.qk_scale), self.rotary(k * self.qk_scale)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, S, C))


def test_qkv_rotary_replaces_an_attention_layers_projections_and_rotary():
    torch.manual_seed(0)
    model = llama.LLaMA(TINY_LLAMA).eval()
    inputs = llama.get_inputs(2, 8, config=TINY_LLAMA)
    with torch.no_grad():
        want = model(*inputs)
        swap = Swap(kernels("qkv_rotary", "flash_attention"))
        with swap.installed(model):
            got = model(*inputs)
    assert swap.calls == {"qkv_rotary": TINY_LLAMA.n_layer, "flash_attention": TINY_LLAMA.n_layer}
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    odd = NotCausal(TINY_LLAMA).eval()
    swap = Swap(kernels("qkv_rotary"))
    with torch.no_grad(), swap.installed(odd):
        odd(torch.randn(1, 8, TINY_LLAMA.dim))
    assert swap.calls == {}
    assert "probe mismatch" in next(iter(swap.skipped["qkv_rotary"]))

    # Right while the scale is all ones, wrong once trained weights are loaded: the probe runs a
    # copy with random weights and refuses it.
    scaled = ScaledQK(TINY_LLAMA).eval()
    swap = Swap(kernels("qkv_rotary"))
    with torch.no_grad(), swap.installed(scaled):
        scaled(torch.randn(1, 8, TINY_LLAMA.dim))
    assert swap.calls == {}
    assert "probe mismatch" in next(iter(swap.skipped["qkv_rotary"]))
