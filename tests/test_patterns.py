"""Recognition by computation (autokernel/graph_capture.py and the patterns it matches): a
model written without our classes -- every kernel type spelled out in plain torch and nn.Linear
-- profiles with each computation named by its kernel type, shape and contract variant; the
usual spellings match, look-alikes don't; the instrumented forward computes what the model
does; capture failing falls back to recognition by op name and module class; transformers'
Llama profiles as before, plus the rotary embedding it writes as a function."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel import graph_capture
from models import llama
from test_profile import by_type, run_profile


class Composite(nn.Module):
    """Each kernel type written out, as a user's model might."""

    def __init__(self, vocab=64, dim=16, heads=2, hidden=24):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm_w = nn.Parameter(torch.rand(dim) + 0.5)
        self.ln_w, self.ln_b = nn.Parameter(torch.rand(dim) + 0.5), nn.Parameter(torch.rand(dim))
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up, self.down = (nn.Linear(a, b, bias=False) for a, b in
                                         ((dim, hidden), (dim, hidden), (hidden, dim)))
        self.g2, self.u2, self.d2 = (nn.Linear(a, b, bias=False) for a, b in
                                     ((dim, hidden), (dim, hidden), (hidden, dim)))
        self.head = nn.Linear(dim, vocab, bias=False)
        angles = torch.outer(torch.arange(64.0), 1e4 ** -(torch.arange(0, self.hd, 2) / self.hd))
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1))   # rotate_half tables
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1))
        self.register_buffer("cos_i", angles.cos().repeat_interleave(2, -1))  # interleaved
        self.register_buffer("sin_i", angles.sin().repeat_interleave(2, -1))

    def forward(self, ids, targets):
        B, S = ids.shape
        x = self.embed(ids)
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_w
        q, k, v = (w(h).view(B, S, self.heads, self.hd).transpose(1, 2)
                   for w in (self.q, self.k, self.v))
        half = self.hd // 2
        q = q * self.cos[:S] + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * self.sin[:S]
        pairs = torch.stack((-k[..., 1::2], k[..., ::2]), dim=-1).flatten(-2)
        k = k * self.cos_i[:S] + pairs * self.sin_i[:S]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        future = torch.triu(torch.ones(S, S, dtype=torch.bool, device=ids.device), 1)
        att = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, S, -1))
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        h = (x - mu) / torch.sqrt(var + 1e-5) * self.ln_w + self.ln_b
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        x = x + self.d2(F.gelu(self.g2(h)) * self.u2(h))
        logits = self.head(x)
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        probs = e / e.sum(-1, keepdim=True)
        loss = F.nll_loss(F.log_softmax(logits.view(-1, logits.shape[-1]), dim=-1),
                          targets.view(-1))
        return loss, probs


def composite_inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 64, (2, 8), generator=gen), torch.randint(0, 64, (2, 8), generator=gen)


@pytest.fixture(scope="module")
def composite_profile():
    torch.manual_seed(0)
    return run_profile(Composite().eval(), composite_inputs())


def typed(result):
    """{kernel type: [(shape or None, variant, note)]} over the typed entries."""
    out = {}
    for e in result["entries"]:
        if e["kernel_type"]:
            rows = [(tuple(d["shape"]), d["variant"], "") for d in e["shape_detail"]]
            out.setdefault(e["kernel_type"], []).extend(rows + [(None, {}, e["note"])] * bool(
                e["note"]))
    return out


def test_a_model_written_without_our_classes_profiles_by_kernel_type(composite_profile):
    found = typed(composite_profile)
    assert found["rmsnorm"] == [((16, 16), {}, "")]
    assert found["layernorm"] == [((16, 16), {}, "")]
    assert found["softmax"] == [((16, 64), {}, "")]
    assert found["cross_entropy"] == [((16, 64), {}, "")]
    assert found["flash_attention"] == [((2, 2, 8, 8), {}, "")]            # causal: the default
    mlp = sorted(found["fused_mlp"], key=str)
    assert mlp[0] == ((16, 16, 24), {}, "")                                # SwiGLU
    assert mlp[1][0] is None and "gelu(gate) * up" in mlp[1][2]            # GeGLU: noted
    rotary = sorted(found["rotary_embedding"], key=str)
    assert rotary[0] == ((2, 2, 8, 8), {}, "")                             # half-split
    assert rotary[1][0] is None and "interleaved" in rotary[1][2]
    for e in composite_profile["entries"]:
        if e["kernel_type"] not in (None, "matmul"):  # ranked like any op: named by the
            # module it is in, with a share of the time and an Amdahl ceiling
            assert e["name"] == "Composite" and e["calls"] == len(found[e["kernel_type"]]), e
            assert 0 < e["share"] < 1 and e["amdahl_ceiling"] > 1
    # What a kernel replaces is no longer ranked as its pieces (the causal mask's construction
    # included: the kernel's causal flag replaces it).
    names = {e["name"] for e in composite_profile["entries"]}
    assert not names & {"aten::rsqrt", "aten::exp", "aten::log_softmax", "aten::nll_loss",
                        "aten::silu", "aten::masked_fill", "aten::softmax", "aten::stack",
                        "aten::triu", "aten::ones"}


def test_the_profiled_forward_computes_what_the_model_does():
    torch.manual_seed(0)
    model, inputs = Composite().eval(), composite_inputs()
    with torch.inference_mode():
        want = model(*inputs)
        forward, matches = graph_capture.capture(model, inputs)
        got = forward(*inputs)
    torch._dynamo.reset()
    assert len(matches) == 9
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def kinds(fn, *inputs, skip=()):
    """[(kernel type, shape, variant, note)] found in fn's graph (skip: patterns not tried)."""
    class Wrapped(nn.Module):
        def forward(self, *args):
            return fn(*args)
    try:
        with torch.inference_mode():
            _, found = graph_capture.capture(Wrapped(), inputs, skip)
    finally:
        torch._dynamo.reset()
    return [(m.ktype, m.shape, m.variant, m.note) for m in found]


X = torch.randn(3, 5, 8)
W = torch.rand(8) + 0.5
B8 = torch.rand(8)
Q, K, V = (torch.randn(1, 4, 6, 8) for _ in range(3))
K2, V2 = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
CAUSAL = torch.full((6, 6), float("-inf")).triu(1)
LOGITS, TARGETS = torch.randn(6, 10), torch.randint(0, 10, (6,))
L1, L2, L3 = (nn.Linear(8, 12, bias=False), nn.Linear(8, 12, bias=False),
              nn.Linear(12, 8, bias=False))
FUSED = nn.Linear(8, 24, bias=False)
COS, SIN = torch.randn(6, 4), torch.randn(6, 4)


@pytest.mark.parametrize("fn, inputs, want", [
    # rmsnorm: x*x or ** 2, 1/sqrt, ** -0.5, a division, statistics in fp32, no weight
    (lambda x: x * (1 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)) * W, (X,),
     ("rmsnorm", (15, 8), {}, "")),
    (lambda x: W * (x.float() * ((x.float() ** 2).mean(dim=-1, keepdim=True) + 1e-6) ** -0.5
                    ).to(x.dtype), (X,), ("rmsnorm", (15, 8), {}, "")),
    (lambda x: x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6), (X,),
     ("rmsnorm", (15, 8), {"affine": False}, "")),
    # layernorm: var(unbiased=False), var_mean, rsqrt, weight only
    (lambda x: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(
        x.var(-1, keepdim=True, unbiased=False) + 1e-5) * W + B8, (X,),
     ("layernorm", (15, 8), {}, "")),
    (lambda x: (lambda v, m: (x - m) / torch.sqrt(v + 1e-12) * W)(
        *torch.var_mean(x, -1, keepdim=True, correction=0)), (X,),
     ("layernorm", (15, 8), {}, "")),
    # softmax: max(...).values, no max at all, a reciprocal
    (lambda x: (lambda e: e / e.sum(-1, keepdim=True))(
        torch.exp(x - x.max(-1, keepdim=True).values)), (X,), ("softmax", (15, 8), {}, "")),
    (lambda x: torch.exp(x) * torch.reciprocal(torch.exp(x).sum(-1, keepdim=True)), (X,),
     ("softmax", (15, 8), {}, "")),
    # SwiGLU as g * sigmoid(g), and from one fused gate/up projection
    (lambda x: L3(L1(x) * torch.sigmoid(L1(x)) * L2(x)), (X,),
     ("fused_mlp", (15, 8, 12), {}, "")),
    (lambda x: (lambda g, u: L3(F.silu(g) * u))(*FUSED(x).chunk(2, dim=-1)), (X,),
     ("fused_mlp", (15, 8, 12), {}, "")),
    # rotary: the pairs of halves written out, tables of D/2
    (lambda x: torch.cat([x[..., :4] * COS - x[..., 4:] * SIN,
                          x[..., 4:] * COS + x[..., :4] * SIN], dim=-1), (Q,),
     ("rotary_embedding", (1, 4, 6, 8), {}, "")),
    # cross-entropy: gathered log-probabilities, log(softmax)
    (lambda x, t: -x.log_softmax(-1).gather(-1, t.unsqueeze(-1)).squeeze(-1).mean(),
     (LOGITS, TARGETS), ("cross_entropy", (6, 10), {}, "")),
    (lambda x, t: F.nll_loss(torch.log(torch.softmax(x, -1)), t), (LOGITS, TARGETS),
     ("cross_entropy", (6, 10), {}, "")),
    # attention: an additive causal mask, none (bidirectional), grouped-query heads
    (lambda q, k, v: torch.softmax(q @ k.mT * 0.3 + CAUSAL, -1) @ v, (Q, K, V),
     ("flash_attention", (1, 4, 6, 8), {}, "")),
    (lambda q, k, v: F.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1) @ v, (Q, K, V),
     ("flash_attention", (1, 4, 6, 8), {"causal": False}, "")),
    (lambda q, k, v: torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-2, -1) / 8, -1)
     @ v.repeat_interleave(2, 1), (Q, K2, V2),
     ("flash_attention", (1, 4, 6, 8), {"causal": False, "kv_groups": 2}, "")),
])
def test_usual_spellings_match(fn, inputs, want):
    assert kinds(fn, *inputs) == [want]


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: x - x.mean(-1, keepdim=True), (X,)),                          # a plain mean
    (lambda x: x * x.pow(2).mean(-1, keepdim=True), (X,)),                   # no root
    (lambda x: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6), (X,)),  # not the last dim
    (lambda x, y: x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6), (X, X + 1)),
    (lambda x: (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5),
     (X,)),                                                                   # unbiased variance
    (lambda x: torch.exp(x) / torch.exp(x).sum(0, keepdim=True), (X,)),      # over dim 0
    (lambda x: L3(F.relu(L1(x))), (X,)),                                     # not gated
    (lambda x, y: L3(F.silu(L1(x)) * L2(y)), (X, X + 1)),                   # gate, up: 2 inputs
    (lambda q, k, v: torch.softmax(q @ k.mT, dim=-2) @ v, (Q, K, V)),        # softmax over keys
])
def test_look_alikes_do_not_match(fn, inputs):
    assert kinds(fn, *inputs) == []


WQ, WK, WV = (nn.Linear(16, n, bias=b) for n, b in ((32, True), (16, True), (16, True)))


def _rot(t):
    return torch.cat([t[..., :4] * COS - t[..., 4:] * SIN, t[..., 4:] * COS + t[..., :4] * SIN],
                     dim=-1)


def test_qkv_projections_with_rotary_are_one_qkv_rotary():
    """Three projections of one input viewed as heads, the first two rotated: qkv_rotary (B, S,
    K, Hq, Hkv, D), q the projection with more heads (grouped-query), bias as the variant. v
    not seen as a projection of the same input, or a rotary of another input, is not one."""
    x = torch.randn(2, 6, 16)

    def layer(x, rotate_k=True, v_input=None):
        q, k, v = (w(t).view(2, 6, -1, 8).transpose(1, 2)
                   for w, t in ((WQ, x), (WK, x), (WV, x if v_input is None else v_input)))
        return _rot(q), _rot(k) if rotate_k else k, v
    assert kinds(layer, x) == [("qkv_rotary", (2, 6, 16, 4, 2, 8), {"bias": True}, "")]
    assert [k[0] for k in kinds(lambda x: layer(x, rotate_k=False), x)] == ["rotary_embedding"]
    assert [k[0] for k in kinds(lambda x, y: layer(x, v_input=y), x, x + 1)] == \
        ["rotary_embedding", "rotary_embedding"]
    # profile.py skips the fused pattern where no swap reaches it: the rotaries then count
    assert [k[0] for k in kinds(layer, x, skip=("qkv_rotary",))] == \
        ["rotary_embedding", "rotary_embedding"]


WQKV = nn.Linear(16, 64, bias=False)  # q: 4 heads of 8, k and v: 2 each


def test_one_projection_sliced_into_q_k_v_is_qkv_rotary():
    """Phi-3's spelling: one projection whose columns are q, k and v, sliced; the rotary taken
    on x[..., :D] and put back by cat with the (empty) rest. Slices that are not q, k, v in
    that order are not one."""
    x = torch.randn(2, 6, 16)

    def rot_all(t):
        return torch.cat([_rot(t[..., :8]), t[..., 8:]], dim=-1)

    def layer(x, q_cols=(0, 32), k_cols=(32, 48), v_cols=(48, 64)):
        qkv = WQKV(x)
        q, k, v = (qkv[..., a:b].view(2, 6, -1, 8).transpose(1, 2)
                   for a, b in (q_cols, k_cols, v_cols))
        return rot_all(q), rot_all(k), v
    assert kinds(layer, x) == [("qkv_rotary", (2, 6, 16, 4, 2, 8), {}, "")]
    for cols in (dict(k_cols=(48, 64), v_cols=(32, 48)),   # v between q and k
                 dict(k_cols=(32, 40), v_cols=(40, 64))):  # v wider than k
        assert [k[0] for k in kinds(lambda x: layer(x, **cols), x)] == \
            ["rotary_embedding", "rotary_embedding"], cols


def test_a_value_read_outside_the_computation_keeps_it_apart():
    """A kernel computes the output only: a norm whose 1/rms is also returned is its ops."""
    def norm_and_scale(x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r * W, r
    assert kinds(norm_and_scale, X) == []


def test_masks_that_are_not_causal_are_noted():
    bias = torch.randn(6, 6)  # a score bias (ALiBi-like) is no mask; the kernel has no bias
    padding = torch.zeros(6, 6)
    padding[:, -2:] = float("-inf")
    for mask in (bias, padding):
        [(ktype, shape, variant, note)] = kinds(lambda q, k, v: torch.softmax(
            q @ k.mT + mask, -1) @ v, Q, K, V)
        assert (ktype, shape) == ("flash_attention", None) and "not causal" in note


def test_capture_failure_falls_back_to_op_names_and_module_classes(monkeypatch, capsys):
    def broken(model, inputs, *args):
        raise RuntimeError("no graph today")
    monkeypatch.setattr(graph_capture, "capture", broken)
    cfg = llama.LLaMAConfig(vocab_size=64, max_seq=16, n_layer=1, n_head=2, dim=16, hidden=32)
    result = run_profile(llama.LLaMA(cfg).eval(), llama.get_inputs(1, 4, config=cfg))
    out = capsys.readouterr().out
    assert "graph capture failed (RuntimeError: no graph today)" in out
    assert {"rmsnorm", "fused_mlp", "rotary_embedding", "flash_attention"} <= set(by_type(result))
    assert {"RMSNorm", "SwiGLU", "RotaryEmbedding"} <= {e["name"] for e in result["entries"]}


def entries_by_type(result):
    return {(e["kernel_type"], tuple(map(tuple, e["shapes"])),
             tuple(str(d["variant"]) for d in e["shape_detail"])) for e in result["entries"]
            if e["kernel_type"]}


def test_transformers_llama_profiles_as_before_plus_its_qkv_rotary(monkeypatch):
    """Every kernel type op names and module classes found in transformers' Llama is found
    with capture too (same shapes, same variants), except the q/k/v projections: those and
    apply_rotary_pos_emb (a function, no module) are now one qkv_rotary, which the swap plugs
    in; with eager attention, the written-out attention is grouped-query causal
    flash_attention."""
    pytest.importorskip("transformers")
    from test_hf_models import build
    model, _ = build("llama")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    captured = run_profile(model, (ids,))
    with monkeypatch.context() as m:
        m.setattr(graph_capture, "capture", lambda *a: (_ for _ in ()).throw(RuntimeError("off")))
        before = run_profile(model, (ids,))

    def normalized(result):  # shapes of one entry in a fixed order
        return {(k, tuple(sorted(s)), tuple(sorted(v))) for k, s, v in entries_by_type(result)
                if k != "matmul"}

    def matmuls(result):
        return {tuple(s) for e in result["entries"] if e["kernel_type"] == "matmul"
                for s in e["shapes"]}
    assert normalized(before) <= normalized(captured)
    # q (32 wide), k and v (8: the one kv head) went to qkv_rotary; o_proj and lm_head stay
    assert matmuls(before) - matmuls(captured) == {(24, 8, 32)}
    assert matmuls(captured) == {(24, 32, 32), (24, 96, 32)}
    qkv = [(e["name"], e["shapes"], e["pluggable"]) for e in captured["entries"]
           if e["kernel_type"] == "qkv_rotary"]
    assert qkv == [("LlamaAttention", [[2, 12, 32, 4, 1, 8]], True)]
    assert not [e for e in captured["entries"] if e["kernel_type"] == "rotary_embedding"]

    model.config._attn_implementation = "eager"
    eager = run_profile(model, (ids,))
    attention = [e for e in eager["entries"] if e["kernel_type"] == "flash_attention"]
    assert [(e["name"], e["shapes"], e["shape_detail"][0]["variant"]) for e in attention] == [
        ("LlamaAttention", [[2, 4, 12, 8]], {"kv_groups": 4})]


def test_a_projection_followed_by_gelu_is_a_matmul_with_the_activation_variant():
    """GPT-2's MLP (models/gpt2.py: nn.Linear then nn.GELU(approximate="tanh")) and a Conv1D-style
    addmm then the erf GELU: matmul shapes recorded with their epilogue variant, which extract
    then times (BENCH_VARIANT); a GELU whose input has another reader is not fused."""
    from models import gpt2

    class Conv1DMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.b = nn.Parameter(torch.randn(16, 40)), nn.Parameter(torch.randn(40))
            self.w2 = nn.Parameter(torch.randn(16, 40))

        def forward(self, x):
            h = torch.addmm(self.b, x.view(-1, 16), self.w)
            shared = x.view(-1, 16) @ self.w2
            return F.gelu(h).sum() + (F.gelu(shared) + shared).sum()

    cfg = gpt2.GPT2Config(vocab_size=96, max_seq=64, n_layer=1, n_head=2, dim=32)
    result = run_profile(gpt2.GPT2(cfg).eval(), (torch.randint(0, 96, (2, 8)),))
    variants = {tuple(d["shape"]): d["variant"] for e in result["entries"]
                if e["kernel_type"] == "matmul" for d in e["shape_detail"]}
    assert variants[(16, 128, 32)] == {"activation": "gelu_tanh", "bias": True}
    assert variants[(16, 32, 128)] == {"bias": True}  # c_proj: no activation after it
    result = run_profile(Conv1DMLP().eval(), (torch.randn(3, 16),))
    variants = [d["variant"] for e in result["entries"] if e["kernel_type"] == "matmul"
                for d in e["shape_detail"]]
    assert {"activation": "gelu", "bias": True} in variants
    assert not any(v.get("activation") and not v.get("bias") for v in variants)
