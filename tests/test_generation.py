"""Generation: the decode workload (static KV cache, teacher-forced steps), the decode_attention
kernel plugged into a step, and verify.py / profile.py --generate from the command line."""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import autokernel
from autokernel import verify_select
from autokernel.cli import UsageError
from autokernel.decode import (Step, decoder_for, greedy, parse_generate, step_bytes,
                               teacher_forced, weight_bytes)
from autokernel.swap import Swap
from models.gpt2 import GPT2, GPT2Config
from models.llama import LLaMA, LLaMAConfig
from models.load import HF_TINY, HFLogits

TINY = LLaMAConfig(vocab_size=256, max_seq=64, n_layer=2, n_head=4, dim=64, hidden=128)


def tiny_llama(dtype=torch.float32):
    torch.manual_seed(0)
    return LLaMA(TINY).eval().to(dtype)


def tiny_hf(kv_heads=2, dtype=torch.float32):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dict(HF_TINY["tiny-llama"][1],
                                             num_key_value_heads=kv_heads))
    config._attn_implementation = "sdpa"
    return HFLogits(transformers.AutoModelForCausalLM.from_config(config)).eval().to(dtype)


def prompt(batch=2, length=8, vocab=256):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("make", [tiny_llama, tiny_hf], ids=["llama", "transformers"])
def test_cached_steps_compute_what_the_whole_sequence_does(make):
    """Prefill then one token a step over the static cache gives, at every step, the logits a
    full causal forward of the same tokens gives at that position."""
    model, ids = make(), prompt()
    with torch.no_grad():
        ref = greedy(decoder_for(model, 2, 8 + 5), ids, 5)
        full = model(torch.cat([ids, ref.tokens], 1))
    assert ref.tokens.shape == (2, 5) and ref.logits.shape == (6, 2, full.shape[-1])
    torch.testing.assert_close(ref.logits, full[:, 7:].transpose(0, 1), rtol=1e-4, atol=1e-4)
    assert torch.equal(ref.tokens[:, 0], full[:, 7].argmax(-1))


def test_teacher_forcing_names_the_first_step_that_differs():
    model, ids = tiny_llama(), prompt()
    with torch.no_grad():
        decoder = decoder_for(model, 2, 8 + 4)
        ref = greedy(decoder, ids, 4)
        assert teacher_forced(Step(decoder, 2), ids, ref)["passed"]
        bad = type(ref)(ref.tokens, ref.logits.clone())
        bad.logits[3] += 0.5 * bad.logits[3].abs().max()
        result = teacher_forced(Step(decoder, 2), ids, bad)
    assert not result["passed"] and result["first_mismatch"] == 3
    assert result["error"].startswith("step 3 of 4: logits differ")


def test_the_roofline_counts_each_weight_once_and_the_live_cache():
    model = tiny_llama()
    decoder = decoder_for(model, 2, 16)
    per_position = sum(t.numel() * t.element_size() for t in decoder.cache_tensors()) / 16
    embed = model.embed.weight.numel() * 4
    params = sum(p.numel() * 4 for p in model.parameters())
    assert weight_bytes(model) == params - embed  # a lookup reads B rows, not the table
    assert step_bytes(decoder, 8, 7) == params - embed + per_position * (8 + 4)


def test_parse_generate_and_models_that_cannot_generate():
    assert parse_generate("512x256") == (512, 256)
    for bad in ("512", "0x4", "ax4", "4x-1"):
        with pytest.raises(UsageError, match="use PROMPTxNEW, e.g. 512x256"):
            parse_generate(bad)
    gpt2 = GPT2(GPT2Config(vocab_size=64, max_seq=16, n_layer=1, n_head=2, dim=16))
    with pytest.raises(UsageError, match="needs a decoder with a KV cache: GPT2 has none"):
        decoder_for(gpt2, 1, 8)
    with pytest.raises(UsageError, match="cache length 99 exceeds max_seq 64"):
        decoder_for(tiny_llama(), 1, 99)


@pytest.mark.parametrize("make", [tiny_llama, tiny_hf], ids=["llama", "transformers"])
def test_decode_attention_starter_runs_every_step(make):
    """The starter replaces each step's attention over the cache (transformers folds the query
    heads of a key/value head into the query length: unfolded to heads), and every step's
    logits agree with the original's."""
    model, ids = make(dtype=torch.float16), prompt()
    kernel = verify_select.load_kernel(autokernel.KERNELS_DIR / "decode_attention.py")
    with torch.no_grad():
        decoder = decoder_for(model, 2, 8 + 4)
        ref = greedy(decoder, ids, 4)
        swap = Swap([kernel])
        with swap.installed(model):
            result = teacher_forced(Step(decoder, 2), ids, ref)
    layers = 2
    assert result["passed"], result
    assert swap.calls[kernel.name] >= 4 * layers and not swap.fallbacks["decode_attention"]


def test_a_compiled_step_reuses_what_the_first_eager_step_worked_out():
    """Step.warm_up runs its first step uncompiled, so the trace finds the swap's eager-only
    checks made (transformers' cos/sin tables, the weight copies): qkv_rotary is plugged in
    every compiled step and nothing compiles twice."""
    import torch._dynamo
    model, ids = tiny_hf(), prompt()
    names = ("rmsnorm", "qkv_rotary", "matmul", "fused_mlp", "decode_attention")
    kernels = [verify_select.load_kernel(autokernel.KERNELS_DIR / f"{n}.py") for n in names]
    decoder = decoder_for(model, 2, 8 + 4)
    swap = Swap(kernels, compiled=True)
    torch._dynamo.reset()
    with torch.no_grad(), swap.installed(model), \
            torch._dynamo.config.patch(error_on_recompile=True):
        step = Step(decoder, 2, torch.compile(decoder, backend="eager"))
        step.prefill(ids)
        step.position.fill_(8)
        swap.reset()
        step.warm_up(3)
    layers = 2
    assert swap.calls["qkv_rotary"] == 3 * layers and swap.calls["decode_attention"] == 3 * layers
    # the compiled step's attention reads the cache's own 2 KV heads (B x Hq x Hkv x Sq x L x D),
    # not the copy transformers repeats to all 4 query heads when SDPA gets a mask
    assert swap.shapes["decode_attention"] == {"2x4x2x1x12x32"}


def test_a_compiled_swap_compiles_every_layers_patched_forward(monkeypatch):
    """Where a graph break leaves each decoder layer a frame of its own (transformers on torch
    2.11 did), Dynamo compiles the layer's patched attention forward once per layer, a closure
    over that layer's weights: the compiled swap makes room for all of them, so no layer runs
    uncompiled past Dynamo's limit (8 by default, 2 here for a 4-layer model; here it would
    raise)."""
    import torch._dynamo
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama
    layer_forward = modeling_llama.LlamaDecoderLayer.forward

    def broken(self, *args, **kwargs):
        torch._dynamo.graph_break()
        return layer_forward(self, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", broken)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dict(HF_TINY["tiny-llama"][1], num_hidden_layers=4,
                                             num_key_value_heads=2))
    config._attn_implementation = "sdpa"
    model = HFLogits(transformers.AutoModelForCausalLM.from_config(config)).eval()
    kernel = verify_select.load_kernel(autokernel.KERNELS_DIR / "qkv_rotary.py")
    swap, ids = Swap([kernel], compiled=True), prompt(batch=1, length=4)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True), \
            torch.no_grad(), swap.installed(model):
        model(ids)  # eager first: the swap's checks and weight copies, as Step.warm_up does
        swap.reset()
        torch.compile(model, backend="eager")(ids)
    assert swap.calls["qkv_rotary"] == 4 and not swap.fallbacks["qkv_rotary"]


def test_a_mask_that_is_not_a_causal_prefix_falls_back():
    kernel = verify_select.load_kernel(autokernel.KERNELS_DIR / "decode_attention.py")
    q, k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16)
    holes = torch.ones(1, 1, 1, 12, dtype=torch.bool)
    holes[..., 3] = False  # a padded prompt's hole: not "the first n positions"
    prefix = (torch.arange(12) < 7)[None]
    want = [F.scaled_dot_product_attention(q, k, v, attn_mask=m) for m in (holes, prefix)]
    swap = Swap([kernel])
    with swap.installed(torch.nn.Module()):
        got = [F.scaled_dot_product_attention(q, k, v, attn_mask=m) for m in (holes, prefix)]
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)  # torch's own
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)  # the kernel's
    assert swap.calls[kernel.name] == 1
    assert swap.fallbacks["decode_attention"] == {"mask is not causal over a live prefix": 1}


def run(script, *args):
    return subprocess.run([sys.executable, str(autokernel.ROOT / script), *args],
                          capture_output=True, text=True, cwd=autokernel.ROOT, timeout=600)


def test_verify_generate_checks_every_step_and_reports_tokens_per_second(tmp_path):
    out = tmp_path / "verify.json"
    proc = run("verify.py", "--module", "transformers", "--hf-config", "tiny-llama",
               "--input-shape", "2x8", "--generate", "8x3", "--no-regate", "--kernels",
               "kernels/decode_attention.py", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["workload"] == {"batch": 2, "prompt": 8, "new": 3, "seed": 0}
    kernels = report["variants"]["kernels"]
    assert kernels["correctness"]["passed"] and kernels["correctness"]["steps"] == 4
    assert kernels["tokens_per_s"] > 0 and report["variants"]["eager"]["tokens_per_s"] > 0
    assert report["kernels"][0]["calls"] > 0 and report["passed"]
    assert "tokens/s" in proc.stdout and "PASS" in proc.stdout


def test_verify_generate_refuses_a_model_without_a_cache_in_one_line():
    proc = run("verify.py", "--model", "models/gpt2.py", "--generate", "4x2", "--starters")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "(use models/llama.py or a transformers causal LM, --module transformers)")


def test_profile_generate_ranks_the_decode_steps_ops(tmp_path):
    out = tmp_path / "profile.json"
    proc = run("profile.py", "--module", "transformers", "--hf-config", "tiny-llama",
               "--input-shape", "2x16", "--generate", "16x8", "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = json.loads(out.read_text())
    assert profile["generate"] == "16x8"
    decode = [e for e in profile["entries"] if e["kernel_type"] == "decode_attention"]
    assert decode and decode[0]["shapes"][0] == [2, 4, 4, 1, 24, 32]
    assert {"rmsnorm", "fused_mlp", "matmul"} <= {e["kernel_type"] for e in profile["entries"]}


def test_matmul_starter_splits_k_for_a_decode_steps_rows():
    """M <= 16 (a generation step's batch) takes the split-K path: K cut into slices across
    programs, the slices added in order with the epilogue after; it agrees with the oracle."""
    from autokernel.contract import load_module
    matmul = load_module(autokernel.KERNELS_DIR / "matmul.py")
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 1024, generator=gen).half()
    W = torch.randn(40, 1024, generator=gen).half()  # as F.linear holds it: B = W.t()
    bias, residual = torch.randn(40, generator=gen).half(), torch.randn(3, 40, generator=gen).half()
    assert matmul.skinny_config(40, 1024, 4)[3] == 4  # four slices of K
    got = matmul.kernel_fn(A=A, B=W.t(), bias=bias, activation="gelu_tanh", residual=residual)
    want = autokernel.KERNEL_TYPES["matmul"].reference(A=A, B=W.t(), bias=bias,
                                                       activation="gelu_tanh", residual=residual)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_fused_mlp_starter_splits_k_for_a_decode_steps_rows():
    from autokernel.contract import load_module
    mlp = load_module(autokernel.KERNELS_DIR / "fused_mlp.py")
    inputs = autokernel.KERNEL_TYPES["fused_mlp"].inputs((2, 128, 1024), torch.float16, "cpu",
                                                         torch.Generator().manual_seed(0),
                                                         {"residual": True})
    assert mlp.skinny_config(1024, 128, 4, True)[3] == 1  # gate+up: one slice
    assert mlp.skinny_config(128, 1024, 4)[3] == 4  # down: four slices of K
    got = mlp.kernel_fn(**inputs)
    want = autokernel.KERNEL_TYPES["fused_mlp"].reference(**inputs)
    bad, _ = autokernel.KERNEL_TYPES["fused_mlp"].mismatches(got, want, inputs)
    assert not bad.any()


def test_qkv_rotary_starter_splits_k_for_a_decode_steps_rows():
    from autokernel.contract import load_module
    qkv = load_module(autokernel.KERNELS_DIR / "qkv_rotary.py")
    kt = autokernel.KERNEL_TYPES["qkv_rotary"]
    for variant in ({}, {"bias": True}):
        inputs = kt.inputs((3, 1, 512, 4, 2, 32), torch.float16, "cpu",
                           torch.Generator().manual_seed(0), variant)
        assert inputs["x"].shape[:2] == (3, 1)
        assert qkv.skinny_config(inputs["w_qkv"].shape[0], 512, 4)[3] == 4
        got = qkv.kernel_fn(**inputs)
        bad, _ = kt.mismatches(got, kt.reference(**inputs), inputs)
        assert not bad.any(), variant


def test_torch_compiles_decode_is_also_timed_with_the_caches_own_kv_heads(monkeypatch):
    """A grouped-query model's torch.compile baseline runs twice: as transformers writes it (the
    cache copied to every query head under a mask) and with SDPA given the cache's own KV heads;
    the kernels are held to the faster. Both compute the original's logits."""
    from autokernel.verify_decode import verify_generation
    key_heads = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        key_heads.append((q.shape[2], k.shape[1]))
        return sdpa(q, k, v, *args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    report = verify_generation(tiny_hf(kv_heads=2), [], 8, 3, 2, repeat=1,
                               compile_backend="eager")
    v = report["variants"]
    assert list(v) == ["eager", "torch.compile", "torch.compile, grouped-query SDPA"]
    assert all(e["correctness"]["passed"] for e in v.values()), v
    assert report["compile_variant"] in ("torch.compile", "torch.compile, grouped-query SDPA")
    # a decode step's keys: the 4 query heads' copies, and in the last variant the 2 KV heads
    decode = [h for q, h in key_heads if q == 1]
    assert 4 in decode and decode[-1] == 2, key_heads
