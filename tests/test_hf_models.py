"""transformers' own model code, built from tiny configs on the CPU: every kernel type the model
uses must actually run on our kernel (no fallback or skipped module by contract: eps, grouped-query
heads, bidirectional attention, projection biases) and the outputs must match the model's.

The kernels are the interpreter-friendly ones in tests/kernels_for_verify/."""
import importlib

import pytest
import torch
import torch.nn as nn

import autokernel
from autokernel import verify_run

transformers = pytest.importorskip("transformers")

from test_verify import by_name, kernels  # noqa: E402

DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               vocab_size=96, max_position_embeddings=64)
LLAMA_TYPES = ("matmul", "rmsnorm", "flash_attention", "rotary_embedding", "fused_mlp")
ENCODER_TYPES = ("matmul", "layernorm", "flash_attention")

MODELS = {
    # Llama-3 style: GQA 4:1, eps 1e-5.
    "llama": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **DECODER, num_key_value_heads=1, rms_norm_eps=1e-5)), LLAMA_TYPES),
    # Qwen2: GQA 2:1, biases on q/k/v, eps 1e-6.
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **DECODER, num_key_value_heads=2, rms_norm_eps=1e-6)), LLAMA_TYPES),
    "mistral": (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **DECODER, num_key_value_heads=2, rms_norm_eps=1e-5, sliding_window=None)), LLAMA_TYPES),
    # Phi-3: q/k/v in one projection, gate and up in one (its halves go to the fused_mlp
    # kernel: autokernel/computed.py finds which half is the gate).
    "phi3": (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **DECODER, num_key_value_heads=2, pad_token_id=0)), LLAMA_TYPES),
    # Gemma: RMSNorm scales by 1 + weight (the kernel gets that copy: computed.py); its MLP's
    # GELU is outside the fused_mlp contract.
    "gemma": (lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **DECODER, num_key_value_heads=2, head_dim=8)),
        ("matmul", "rmsnorm", "flash_attention", "rotary_embedding")),
    # GPT-NeoX: rotary on the first half of each head's dims only (rotary_pct), the rest passed
    # through; q/k/v in one projection; layernorm with biases; GELU MLP (outside fused_mlp).
    "gpt_neox": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **DECODER, rotary_pct=0.5)),
        ("matmul", "layernorm", "flash_attention", "rotary_embedding")),
    # GPT-2: Conv1D projections (torch.addmm with a bias), layernorm eps 1e-5, causal attention.
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=96, n_positions=64)), ENCODER_TYPES),
    # BERT: bidirectional attention, layernorm eps 1e-12, biased projections.
    "bert": (lambda: transformers.BertModel(transformers.BertConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        vocab_size=96, max_position_embeddings=64), add_pooling_layer=False), ENCODER_TYPES),
}


def build(name):
    torch.manual_seed(0)
    make, types = MODELS[name]
    model = make()
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():  # norm weights and biases away from 1/0: a kernel that drops them shows
        gen = torch.Generator().manual_seed(1)
        for m in model.modules():
            for attr in ("weight", "bias"):
                p = getattr(m, attr, None)
                if isinstance(p, nn.Parameter) and p.dim() == 1:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (attr == "weight"))
    return model.eval(), types


@pytest.mark.parametrize("name", list(MODELS))
def test_every_kernel_type_runs_on_transformers_models(name):
    model, types = build(name)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    report = verify_run.verify(model, (ids,), kernels(*types), timing=False)
    entries = by_name(report)
    for t in types:
        e = entries[t]
        assert e["calls"] > 0 and e["status"] == "ok", (t, e)
        assert not e["fallbacks"] and not e["skipped"], (t, e["fallbacks"], e["skipped"])
    assert report["correctness"]["passed"], report["correctness"]
    assert report["passed"] and not report["failures"], report["failures"]


def test_profile_records_the_variant_and_extract_times_it(tmp_path):
    """Qwen2's grouped-query attention and biased q/k/v projections, BERT's bidirectional
    attention: profile.json records each shape's variant and extract.py's kernel file times it
    (BENCH_VARIANT), so the night optimizes the case the model runs."""
    import extract
    from test_profile import run_profile
    ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(3))
    # Qwen2's biased q/k/v projections are its qkv_rotary's; BERT's its matmuls
    for name, want, biased in (("qwen2", {"kv_groups": 2}, "qkv_rotary"),
                               ("bert", {"causal": False}, "matmul")):
        result = run_profile(build(name)[0], (ids,))
        merged = {m["kernel_type"]: m for m in extract.merge_by_type(result["entries"])[0]}
        assert merged["flash_attention"]["variant"] == want, (name, merged["flash_attention"])
        assert {"bias": True} in [d["variant"] for e in result["entries"]
                                  if e["kernel_type"] == biased for d in e["shape_detail"]]
        profile = {"dtype": "fp32", "model": name}
        row = extract.write_kernel(merged["flash_attention"], 1, profile,
                                   autokernel.ROOT / "kernels", tmp_path / name, force=False)
        assert row["variant"] == want
        assert f"BENCH_VARIANT = {want!r}" in (tmp_path / name / "flash_attention_1.py").read_text()


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_attention_runs_where_transformers_would_build_a_mask_while_compiling(name, monkeypatch):
    """torch before 2.14 answers is_exporting() with True while dynamo traces, and transformers
    then builds a full mask in every compiled forward, so attention would fall back. Forced
    here in an eager forward: with no padding the swap's mask checks still skip the mask."""
    from autokernel.swap import Swap
    masking = pytest.importorskip("transformers.masking_utils")
    monkeypatch.setattr(masking, "is_torchdynamo_exporting", lambda: True)
    model, _ = build(name)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids)[0]
        swap = Swap(kernels("flash_attention"))
        with swap.installed(model):
            got = model(ids)[0]
        assert swap.calls["flash_attention"] == 1 and not swap.fallbacks, swap.fallbacks
        with swap.installed(model):  # a padding mask: the mask is built, attention falls back
            model(ids, attention_mask=torch.ones_like(ids))
    assert swap.fallbacks["flash_attention"]["attention mask"] == 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def build_or_ours(name):
    """A transformers model from MODELS, or "ours": models/gpt2.py's GPT-2, tiny."""
    if name != "ours":
        return build(name)[0]
    from models.gpt2 import GPT2, GPT2Config
    torch.manual_seed(0)
    return GPT2(GPT2Config(vocab_size=96, max_seq=64, n_layer=1, n_head=2, dim=32)).eval()


@pytest.mark.parametrize("name,want", [("gpt2", "gelu_tanh"), ("bert", "gelu"), ("ours", "gelu_tanh")])
def test_mlp_activation_runs_in_the_matmul_epilogue(name, want):
    """GPT-2's MLP (transformers' Conv1D and models/gpt2.py's nn.Linear) and BERT's intermediate:
    the first projection and its GELU are one matmul call with the activation in the kernel;
    the model's outputs still match."""
    from autokernel import reference
    from autokernel.kernel_call import Kernel
    from autokernel.swap import Swap
    model = build_or_ours(name)
    seen = []

    def fn(A, B, bias=None, activation=None):
        seen.append(activation)
        return reference.matmul_eager(A, B, bias, activation)
    swap = Swap([Kernel("matmul", "matmul", autokernel.ROOT / "autokernel" / "reference.py", fn)])
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(ids)
        want_out = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
        with swap.installed(model):
            out = model(ids)
    got = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
    assert seen.count(want) == 1 and not swap.fallbacks and not swap.skipped, (seen, swap.skipped)
    torch.testing.assert_close(got, want_out, rtol=1e-4, atol=1e-4)


def test_attention_runs_inside_a_compiled_decoder_unless_the_batch_is_packed():
    """Without an attention mask transformers reads position_ids for packed sequences, which
    dynamo cannot trace, and builds the full mask in every compiled forward. When the model
    numbered the tokens itself no row is packed and attention runs on the kernel in one graph;
    position_ids the caller passes (here two sequences packed in one row) still build the mask."""
    from autokernel.swap import Swap
    model, types = build("llama")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    packed = torch.arange(12).remainder(6).expand(2, -1)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        want_packed = model(ids, position_ids=packed, use_cache=False).logits
        swap = Swap(kernels("flash_attention"), compiled=True)
        with swap.installed(model):
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="eager", fullgraph=True)
            got = compiled(ids, use_cache=False).logits
            assert swap.calls["flash_attention"] == 1, dict(swap.calls)
            got_packed = compiled(ids, position_ids=packed, use_cache=False).logits
            assert swap.calls["flash_attention"] == 1, dict(swap.calls)  # packed: SDPA + mask
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got_packed, want_packed, rtol=1e-4, atol=1e-4)
    assert (got_packed - got).abs().max() > 1e-3  # the packing changed the answer


@pytest.mark.parametrize("name", ["gpt2", "ours", "qwen2"])
def test_attention_takes_the_projections_views_without_a_copy(name):
    """GPT-2 splits q, k and v from one c_attn output; Qwen2's come from separate projections.
    Either way each arrives as rows of positions seen through .transpose(1, 2), and the swap
    hands the kernel those views (no copy: the layout the contract's "bshd" variant gates)."""
    from autokernel import reference
    from autokernel.kernel_call import Kernel
    from autokernel.swap import Swap
    model = build_or_ours(name)
    seen = []

    def fn(Q, K, V, causal=True, scale=None):
        seen.append([t.is_contiguous() for t in (Q, K, V)])
        return reference.flash_attention_eager(Q, K, V, causal, scale)
    swap = Swap([Kernel("attention", "flash_attention", autokernel.ROOT / "autokernel" / "reference.py", fn)])
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), swap.installed(model):
        model(ids) if name == "ours" else model(ids, use_cache=False)  # a cache concatenates K, V
    assert seen == [[False, False, False]], (seen, dict(swap.fallbacks))


def test_partial_rotary_runs_only_where_the_models_function_agrees(monkeypatch):
    """Tables narrower than the heads: GPT-NeoX's function turns the first dims, which the kernel
    does (the models test above). One that turns the last dims instead disagrees on the first
    eager call, and the model keeps its own function from then on."""
    module = importlib.import_module("transformers.models.gpt_neox.modeling_gpt_neox")

    def turn_last_dims(q, k, cos, sin, unsqueeze_dim=1):
        c, s, n = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim), cos.shape[-1]
        return tuple(torch.cat([t[..., :-n], t[..., -n:] * c + module.rotate_half(t[..., -n:]) * s],
                               dim=-1) for t in (q, k))

    monkeypatch.setattr(module, "apply_rotary_pos_emb", turn_last_dims)
    model, types = build("gpt_neox")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    report = verify_run.verify(model, (ids,), kernels(*types), timing=False)
    rotary = by_name(report)["rotary_embedding"]
    assert rotary["fallbacks"] == {"partial rotary: the model's function differs": 1}, rotary
    assert report["correctness"]["passed"], report["correctness"]


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gemma", "phi3"])
def test_qkv_rotary_runs_in_transformers_attention_layers(name):
    """q_proj/k_proj/v_proj (Phi-3: one qkv_proj) and apply_rotary_pos_emb as one kernel
    inside transformers' own attention forward (Qwen2: biased projections; Llama: 4 q heads a
    kv head), with and without a KV cache (the cache stores the kernel's rotated keys)."""
    model, types = build(name)
    types = tuple(t for t in types if t != "rotary_embedding") + ("qkv_rotary",)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    report = verify_run.verify(model, (ids,), kernels(*types), timing=False)
    qkv = by_name(report)["qkv_rotary"]
    assert qkv["calls"] > 0 and not qkv["fallbacks"] and not qkv["skipped"], qkv
    assert report["correctness"]["passed"] and report["passed"], report["failures"]
    from autokernel.swap import Swap
    with torch.no_grad():
        want = model(ids).logits
        swap = Swap(kernels("qkv_rotary"))
        with swap.installed(model):
            got = model(ids).logits  # use_cache defaults to True: a DynamicCache
    assert swap.calls["qkv_rotary"] == 1
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_qkv_rotary_skips_a_norm_between_projection_and_rotary():
    """Qwen3 normalizes q and k per head before the rotary: a kernel that rotates in the
    projection's epilogue would normalize rotated values. The probe (a copy of the layer with
    random weights: Qwen3's norms start as all ones, where the two orders agree) says so, and
    the rotary kernel takes the rotation alone."""
    from autokernel.swap import Swap
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **DECODER, num_key_value_heads=2, head_dim=8)).eval()
    with torch.no_grad():
        for m in model.modules():  # trained-like norms: q/k's halves weighted differently
            if "Norm" in type(m).__name__:
                m.weight.copy_(torch.rand(m.weight.shape) + 0.5)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        swap = Swap(kernels("qkv_rotary", "rotary_embedding"))
        with swap.installed(model):
            got = model(ids, use_cache=False).logits
    assert swap.calls == {"rotary_embedding": 2}, dict(swap.calls)  # q and k
    assert any("probe mismatch" in r for r in swap.skipped["qkv_rotary"]), dict(swap.skipped)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_qkv_rotary_runs_inside_a_compiled_decoder():
    """The swapped attention forward (kernel on entry, projections answering from its output,
    the rotary passing q and k on) traces as one graph."""
    from autokernel.swap import Swap
    model, types = build("qwen2")
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        swap = Swap(kernels("qkv_rotary", "flash_attention", "rmsnorm"), compiled=True)
        with swap.installed(model):
            model(ids, use_cache=False)  # eager first, as verify.py does: the tables' verdict
            swap.reset()
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
            got = compiled(ids, use_cache=False).logits
    assert swap.calls["qkv_rotary"] == 1 and swap.calls["flash_attention"] == 1, dict(swap.calls)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
