"""Each shipped model against a plain re-implementation (fp64, written out op by op from its
weights), in fp16/bf16/fp32, and the rotary tables' survival of .half(). CPU, tiny configs."""
import math

import pytest
import torch

from models import bert, custom, gpt2, llama
from models.layers import RotaryEmbedding

TINY = {
    "gpt2": (gpt2, gpt2.GPT2Config(vocab_size=97, max_seq=32, n_layer=2, n_head=4, dim=32)),
    "llama": (llama, llama.LLaMAConfig(vocab_size=97, max_seq=32, n_layer=2, n_head=4, dim=32,
                                       hidden=48)),
    "bert": (bert, bert.BERTConfig(vocab_size=97, max_seq=32, n_layer=2, n_head=4, dim=32,
                                   hidden=64)),
    "custom": (custom, custom.CustomConfig(vocab_size=97, max_seq=32, n_layer=2, n_head=4,
                                           dim=32)),
}


def build(name, dtype=torch.float32, seed=0):
    module, cfg = TINY[name]
    torch.manual_seed(seed)
    model = module.Model(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so the plain versions must use them
        for n, p in model.named_parameters():
            if "norm" in n or "ln" in n or n.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def weights(model):
    return {k: v.double() for k, v in model.state_dict().items()}


# ---- plain formulations (fp64, no nn modules, no F.scaled_dot_product_attention) ------------

def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def attention(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        S = q.shape[-2]
        scores = scores + torch.full((S, S), float("-inf"), dtype=q.dtype).triu(1)
    p = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (p / p.sum(-1, keepdim=True)) @ v


def heads(x, n):
    B, S, C = x.shape
    return x.view(B, S, n, C // n).transpose(1, 2)


def merge(y):
    B, H, S, D = y.shape
    return y.transpose(1, 2).reshape(B, S, H * D)


def lin(x, w, b=None):
    return x @ w.T + (0 if b is None else b)


def plain_gpt2(w, cfg, idx):
    S = idx.shape[1]
    x = w["wte.weight"][idx] + w["wpe.weight"][:S]
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.eps)
        q, k, v = lin(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]).split(cfg.dim, -1)
        y = merge(attention(heads(q, cfg.n_head), heads(k, cfg.n_head), heads(v, cfg.n_head), True))
        x = x + lin(y, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.eps)
        h = lin(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"])
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + lin(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], cfg.eps)
    return x @ w["wte.weight"].T


def rope_complex(x, base):
    """Rotary as a complex multiply, half-split pairing: (x1 + i x2) * e^(i pos freq)."""
    B, H, S, D = x.shape
    freqs = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    rot = torch.polar(torch.ones(S, D // 2, dtype=torch.float64),
                      torch.outer(torch.arange(S, dtype=torch.float64), freqs))
    z = torch.complex(x[..., :D // 2], x[..., D // 2:]) * rot
    return torch.cat([z.real, z.imag], dim=-1)


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def plain_llama(w, cfg, idx):
    x = w["embed.weight"][idx]
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], cfg.eps)
        q, k, v = (heads(lin(h, w[p + f"attn.{n}.weight"]), cfg.n_head) for n in ("wq", "wk", "wv"))
        q, k = rope_complex(q, cfg.rope_base), rope_complex(k, cfg.rope_base)
        x = x + lin(merge(attention(q, k, v, True)), w[p + "attn.wo.weight"])
        h = rms_norm(x, w[p + "mlp_norm.weight"], cfg.eps)
        g = lin(h, w[p + "mlp.w_gate.weight"])
        x = x + lin(g / (1 + torch.exp(-g)) * lin(h, w[p + "mlp.w_up.weight"]),
                    w[p + "mlp.w_down.weight"])
    return lin(rms_norm(x, w["norm.weight"], cfg.eps), w["lm_head.weight"])


def gelu_erf(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def plain_bert(w, cfg, idx):
    S = idx.shape[1]
    x = w["word_embeddings.weight"][idx] + w["position_embeddings.weight"][:S] \
        + w["token_type_embeddings.weight"][0]
    x = layer_norm(x, w["embeddings_norm.weight"], w["embeddings_norm.bias"], cfg.eps)
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        q, k, v = (heads(lin(x, w[p + f"attention.{n}.weight"], w[p + f"attention.{n}.bias"]),
                         cfg.n_head) for n in ("query", "key", "value"))
        a = lin(merge(attention(q, k, v, False)), w[p + "attention.out.weight"],
                w[p + "attention.out.bias"])
        x = layer_norm(x + a, w[p + "attention_norm.weight"], w[p + "attention_norm.bias"], cfg.eps)
        m = lin(gelu_erf(lin(x, w[p + "intermediate.weight"], w[p + "intermediate.bias"])),
                w[p + "output.weight"], w[p + "output.bias"])
        x = layer_norm(x + m, w[p + "output_norm.weight"], w[p + "output_norm.bias"], cfg.eps)
    h = layer_norm(gelu_erf(lin(x, w["head_dense.weight"], w["head_dense.bias"])),
                   w["head_norm.weight"], w["head_norm.bias"], cfg.eps)
    return lin(h, w["word_embeddings.weight"], w["head_bias"])


def plain_custom(w, cfg, idx, targets):
    S = idx.shape[1]
    x = w["embed.weight"][idx] + w["pos.weight"][:S]
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.eps)
        q, k, v = lin(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"]).split(cfg.dim, -1)
        y = merge(attention(heads(q, cfg.n_head), heads(k, cfg.n_head), heads(v, cfg.n_head), True))
        x = x + lin(y, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.eps)
        gate = 1 / (1 + torch.exp(-(h * w[p + "gate"]).sum(-1, keepdim=True)))
        x = x + gate * lin(gelu_erf(lin(h, w[p + "fc.weight"], w[p + "fc.bias"])),
                           w[p + "out.weight"], w[p + "out.bias"])
    logits = lin(layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], cfg.eps), w["head.weight"])
    logits = logits.reshape(-1, logits.shape[-1])
    logp = logits - torch.logsumexp(logits, -1, keepdim=True)
    return -logp[torch.arange(logits.shape[0]), targets.reshape(-1)].mean()


PLAIN = {"gpt2": plain_gpt2, "llama": plain_llama, "bert": plain_bert, "custom": plain_custom}


@pytest.mark.parametrize("name", list(TINY))
def test_model_matches_plain_formulation(name):
    module, cfg = TINY[name]
    model = build(name)
    inputs = module.get_inputs(2, 11, config=cfg)
    with torch.no_grad():
        out = model(*inputs).double()
    expected = PLAIN[name](weights(model), cfg, *inputs)
    assert out.shape == expected.shape
    assert torch.allclose(out, expected, atol=2e-5, rtol=1e-4), (out - expected).abs().max()


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_forward_is_finite_and_close(name, dtype):
    module, cfg = TINY[name]
    inputs = module.get_inputs(2, 16, config=cfg)
    with torch.no_grad():
        ref = build(name)(*inputs)
        out = build(name, dtype)(*inputs)
    assert out.dtype == dtype and torch.isfinite(out).all()
    tol = 0.05 if dtype == torch.float16 else 0.2
    assert (out.float() - ref).abs().max() <= tol * (1 + ref.abs().max()), name


def test_rotary_tables_survive_half():
    rope = RotaryEmbedding(16, 64)
    fresh_cos, fresh_sin = rope.cos.clone(), rope.sin.clone()
    rope.half()
    assert rope.cos.dtype == rope.sin.dtype == torch.float32  # real fp32, not rounded to fp16
    assert torch.equal(rope.cos, fresh_cos) and torch.equal(rope.sin, fresh_sin)
    assert fresh_sin.abs().max() > 0.5  # the sin half is there (a complex->real cast zeroes it)
    x = torch.randn(1, 2, 64, 16)
    out = rope(x.half())
    assert out.dtype == torch.float16
    assert torch.allclose(out.float(), RotaryEmbedding(16, 64)(x), atol=1e-2, rtol=1e-2)
    # No complex buffer anywhere in the model: that is what the fp16 cast silently breaks.
    model = build("llama").half()
    assert not any(b.is_complex() for b in model.buffers())


def test_rotary_matches_reference_tables_and_offset():
    import autokernel
    from autokernel import reference
    rope = RotaryEmbedding(32, 128, base=10000.0)
    x = torch.randn(2, 3, 20, 32, dtype=torch.float64)
    cos, sin = autokernel.rotary_tables(20, 32, torch.float64, "cpu", offset=7)
    expected = reference.rotary_embedding(x, cos, sin)
    assert torch.allclose(rope(x, offset=7), expected, atol=1e-6)


def test_full_configs_have_published_sizes_on_meta():
    """The real presets, built on the meta device (no memory): 7B is never allocated here."""
    expected = {(gpt2, "small"): 124.4e6, (llama, "compact"): 162.4e6, (llama, "7b"): 6.738e9,
                (bert, "base"): 109.5e6}
    for (module, name), count in expected.items():
        with torch.device("meta"):
            model = module.Model(module.CONFIGS[name])
        n = sum(p.numel() for p in model.parameters())
        assert abs(n - count) / count < 0.002, (module.__name__, name, n)
    assert set(llama.CONFIGS) == {"compact", "7b"}
    for module in (gpt2, llama, bert, custom):
        assert len(module.DEFAULT_INPUT_SHAPE) == 2


def test_targets_give_a_loss():
    module, cfg = TINY["llama"]
    model = build("llama")
    idx = module.get_inputs(2, 8, config=cfg)[0]
    loss = model(idx, targets=idx)
    assert loss.shape == () and torch.isfinite(loss)
    with pytest.raises(ValueError, match="max_seq"):
        model(module.get_inputs(1, 33, config=cfg)[0])


def test_matches_transformers_when_installed():
    """GPT-2 and LLaMA against transformers with the same weights (skipped without it)."""
    transformers = pytest.importorskip("transformers")
    idx = torch.randint(0, 97, (2, 11))

    _, cfg = TINY["gpt2"]
    ours = build("gpt2")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        layer_norm_epsilon=cfg.eps, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)).eval()
    sd = {"transformer.wte.weight": ours.wte.weight, "transformer.wpe.weight": ours.wpe.weight,
          "transformer.ln_f.weight": ours.ln_f.weight, "transformer.ln_f.bias": ours.ln_f.bias,
          "lm_head.weight": ours.wte.weight}
    for i, b in enumerate(ours.blocks):
        p = f"transformer.h.{i}."
        for hf_name, mod in (("ln_1", b.ln_1), ("ln_2", b.ln_2)):
            sd[p + hf_name + ".weight"], sd[p + hf_name + ".bias"] = mod.weight, mod.bias
        for hf_name, lin_ in (("attn.c_attn", b.attn.c_attn), ("attn.c_proj", b.attn.c_proj),
                              ("mlp.c_fc", b.mlp.c_fc), ("mlp.c_proj", b.mlp.c_proj)):
            sd[p + hf_name + ".weight"] = lin_.weight.T  # HF's Conv1D stores [in, out]
            sd[p + hf_name + ".bias"] = lin_.bias
    hf.load_state_dict({k: v.detach().contiguous() for k, v in sd.items()}, strict=False)
    with torch.no_grad():
        assert torch.allclose(ours(idx), hf(idx).logits, atol=1e-4, rtol=1e-4)

    _, cfg = TINY["llama"]
    ours = build("llama")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
        rms_norm_eps=cfg.eps, rope_theta=cfg.rope_base, tie_word_embeddings=False)).eval()
    sd = {"model.embed_tokens.weight": ours.embed.weight, "model.norm.weight": ours.norm.weight,
          "lm_head.weight": ours.lm_head.weight}
    names = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
             "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
             "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
             "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj",
             "mlp.w_down": "mlp.down_proj"}
    for i in range(cfg.n_layer):
        for ours_name, hf_name in names.items():
            sd[f"model.layers.{i}.{hf_name}.weight"] = \
                ours.state_dict()[f"blocks.{i}.{ours_name}.weight"]
    hf.load_state_dict(sd, strict=False)
    with torch.no_grad():
        assert torch.allclose(ours(idx), hf(idx).logits, atol=1e-4, rtol=1e-4)
