"""Kernels as torch custom ops (autokernel/ops.py) and the model with kernels under
torch.compile, on the CPU: every test kernel becomes an op whose output is kernel_fn's, whose fake
gives the reference's shape and dtype, and whose backward is the reference's; a compiled swap
traces with no graph break and computes the original's outputs; verify.py times and checks
torch.compile with the kernels inside (the one inductor compile of this file: C++ builds are
slow on the CPU, aot_eager proves the tracing elsewhere)."""
import contextlib
import functools
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import autokernel
from autokernel import ops, verify_report, verify_run, verify_select
from autokernel.endtoend import checked_forward, compare_runs, forward
from autokernel.kernel_call import KernelFailure
from autokernel.swap import Swap
from autokernel.weight_cache import WeightCache
from models import custom

KDIR = Path(__file__).resolve().parent / "kernels_for_verify"
TINY = custom.CustomConfig(vocab_size=128, max_seq=32, n_layer=1, n_head=2, dim=32)
CUSTOM_TYPES = ("matmul", "softmax", "layernorm", "reduce", "cross_entropy")
SMALL = {"matmul": (8, 16, 32), "softmax": (4, 24), "layernorm": (4, 24), "rmsnorm": (4, 24),
         "flash_attention": (1, 2, 16, 16), "fused_mlp": (8, 16, 32), "cross_entropy": (8, 24),
         "rotary_embedding": (1, 2, 8, 16), "reduce": (4, 24), "qkv_rotary": (1, 8, 16, 2, 1, 16),
         "decode_attention": (2, 4, 2, 1, 24, 16)}


def kernel(name):
    return verify_select.load_kernel(KDIR / f"{name}.py")


def small_inputs(kernel_type, variant=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return autokernel.KERNEL_TYPES[kernel_type].inputs(SMALL[kernel_type], dtype, "cpu", gen,
                                                      variant)


def tiny_custom():
    torch.manual_seed(0)
    return custom.Model(TINY).eval(), custom.get_inputs(1, 8, config=TINY)


# ---- one op per kernel file -----------------------------------------------------------------

@pytest.mark.parametrize("kernel_type", autokernel.KERNEL_TYPE_NAMES)
def test_op_registers_with_the_types_arguments(kernel_type):
    k = kernel(kernel_type)
    op = ops.kernel_op(k)
    assert op is getattr(torch.ops.autokernel, ops.op_name(k)).default
    assert [a.name for a in op._schema.arguments] == list(autokernel.KERNEL_TYPES[kernel_type].args)
    assert ops.kernel_op(k) is op  # loading the file again reuses the op


def test_op_names_are_identifiers_unique_per_file(tmp_path):
    a, b = kernel("softmax"), kernel("softmax")
    b.name, b.file = "my-softmax v2", tmp_path / "softmax.py"
    assert ops.op_name(a) != ops.op_name(b)
    assert ops.op_name(b).startswith("my_softmax_v2_") and ops.op_name(b).isidentifier()


def test_signature_types_optional_and_scalar_arguments():
    params = ops.signature("layernorm").parameters
    assert params["weight"].annotation == ops.ARG_TYPES["weight"]
    assert params["eps"].annotation is float
    assert ops.signature("flash_attention").parameters["scale"].default is None
    assert ops.signature("reduce").parameters["dim"].annotation is int


@pytest.mark.parametrize("kernel_type, variant", [
    ("softmax", None), ("layernorm", {"affine": False}), ("rmsnorm", None),
    ("flash_attention", {"causal": False, "scale": 0.3}), ("reduce", {"dim": 0}),
    ("matmul", {"bias": True}), ("cross_entropy", None)])
def test_op_output_is_kernel_fns(kernel_type, variant):
    k = kernel(kernel_type)
    inputs = small_inputs(kernel_type, variant)
    torch.testing.assert_close(ops.kernel_op(k)(**inputs), k.fn(**inputs), rtol=0, atol=0)


@pytest.mark.parametrize("kernel_type", autokernel.KERNEL_TYPE_NAMES)
def test_fake_gives_the_references_shape_and_dtype(kernel_type):
    op = ops.kernel_op(kernel(kernel_type))
    inputs = small_inputs(kernel_type, dtype=torch.float16)
    want = autokernel.KERNEL_TYPES[kernel_type].eager(**inputs)
    with FakeTensorMode() as mode:
        fake = {n: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for n, v in inputs.items()}
        out = op(**fake)
    assert (tuple(out.shape), out.dtype) == (tuple(want.shape), want.dtype)
    # compiled code reads the real output with the fake's strides: they must agree
    real = op(**small_inputs(kernel_type))
    assert out.stride() == real.stride() == ops.out_strides(
        out.shape, autokernel.KERNEL_TYPES[kernel_type].out_order)


def test_attention_output_is_laid_out_for_the_output_projection():
    """[B,H,S,D] stored as [B,S,H,D]: y.transpose(1, 2).reshape(B, S, H * D) is a view. This
    test kernel stores a contiguous [B,H,S,D]: the op copies it into the declared layout."""
    k = kernel("flash_attention")
    inputs = small_inputs("flash_attention")
    direct = k.fn(**inputs)
    assert direct.is_contiguous()
    out = ops.kernel_op(k)(**inputs)
    assert out.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(out, direct, rtol=0, atol=0)
    B, H, S, D = out.shape
    assert out.transpose(1, 2).reshape(B, S, H * D).data_ptr() == out.data_ptr()


def test_out_strides_are_torchs_for_that_memory_order():
    for shape in [(2, 3, 5, 7), (1, 4, 1, 8), (2, 1, 3, 0)]:
        want = torch.empty(shape[0], shape[2], shape[1], shape[3]).transpose(1, 2).stride()
        assert ops.out_strides(shape, (0, 2, 1, 3)) == want
        assert ops.out_strides(shape) == torch.empty(shape).stride()


def test_backward_is_the_references():
    k = kernel("layernorm")
    inputs = small_inputs("layernorm")
    leaves = {n: v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v
              for n, v in inputs.items()}
    ops.kernel_op(k)(**leaves).square().sum().backward()
    ref = {n: v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v
           for n, v in inputs.items()}
    autokernel.KERNEL_TYPES["layernorm"].eager(**ref).square().sum().backward()
    for n in ("x", "weight", "bias"):
        torch.testing.assert_close(leaves[n].grad, ref[n].grad)


# ---- a compiled swap ------------------------------------------------------------------------

def test_eager_swap_calls_kernel_fn_directly():
    swap = Swap([kernel("softmax")])
    assert all(op.op is None for ops_ in swap.by_type.values() for op in ops_)


def test_compiled_swap_checks_the_kernels_output(tmp_path):
    bad = tmp_path / "softmax.py"
    bad.write_text((KDIR / "softmax.py").read_text() + "\n\ndef kernel_fn(x):\n    return x[:1]\n")
    swap = Swap([verify_select.load_kernel(bad)], compiled=True)
    with pytest.raises(KernelFailure, match="returned"):
        with swap.installed(torch.nn.Identity()):
            torch.softmax(torch.randn(4, 8), dim=-1)


def test_compiled_model_with_kernels_traces_without_graph_breaks():
    model, inputs = tiny_custom()
    run_ref = checked_forward(model, inputs)
    swap = Swap([kernel(n) for n in CUSTOM_TYPES], compiled=True)
    try:
        with swap.installed(model):
            forward(model, inputs)  # the eager verdicts the traced forward keeps (ignore_index)
            # explain: a trace with no backend compile; it also sees data-dependent breaks,
            # which dynamo's graph_break counter does not count.
            assert verify_run.graph_breaks(model, inputs) == 0
            compiled = torch.compile(model, backend="aot_eager")
            checked_forward(compiled, inputs)
            swap.reset()
            run = checked_forward(compiled, inputs)
    finally:
        torch._dynamo.reset()
    # Counted as the ops ran: one compiled forward, every kernel in it.
    assert dict(swap.calls) == {"layernorm": 3, "matmul": 5, "softmax": 1, "reduce": 1,
                                "cross_entropy": 1}
    result = compare_runs(run, run_ref)
    assert result["passed"], result


def test_a_compiled_attention_layer_reads_the_weight_copies_made_once():
    """nn.TransformerEncoderLayer's attention runs F.multi_head_attention_forward, which Dynamo
    would run as one in-graph call on fake tensors: its linears' weights, unknown to the weight
    cache there, were transposed into new copies inside the graph at every forward. The
    compiled graph holds the four matmul calls and no copy of a weight."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).eval()
    x = torch.randn(5, 2, 16)
    swap = Swap([kernel("matmul")], compiled=True)
    try:
        with torch.no_grad(), swap.installed(layer):
            want = layer(x)  # eager: each weight's copy made once
            got = torch.compile(layer, backend=aot_autograd(fw_compiler=keep))(x)
    finally:
        torch._dynamo.reset()
    ops_run = Counter(str(n.target) for g in graphs for n in g.graph.nodes
                      if n.op == "call_function")
    assert sum(n for op, n in ops_run.items() if "autokernel.matmul" in op) == 4, ops_run
    assert not ops_run["aten.new_zeros.default"] and not ops_run["aten.t.default"], ops_run
    assert torch.allclose(got, want, atol=1e-5)


def test_verify_times_torch_compile_with_kernels_inside():
    model, inputs = tiny_custom()
    report = verify_run.verify(model, inputs, [kernel(n) for n in CUSTOM_TYPES], warmup=0, repeat=1,
                               compile_backend="inductor")
    t = report["timing"]
    assert report["passed"], report["failures"]
    assert t["compile_ms"] and t["compile_kernels_ms"], t["compile_kernels_note"]
    assert t["graph_breaks"] == 0
    assert t["compile_kernels_calls"]["matmul"] == 5
    assert t["compile_kernels_correctness"]["passed"], t["compile_kernels_correctness"]
    assert report["best_variant"] in ("kernels", "gainers", "compile_kernels")
    assert report["best_speedup_vs_compile"] == pytest.approx(t["compile_ms"] / report["best_ms"])
    verify_report.print_report(report)


def test_verify_attributes_the_gain_inside_torch_compile_per_kernel():
    """--compile-alone: each kernel alone inside torch.compile, and the kernels that gain there
    compiled together; the best variant is the fastest whose outputs match."""
    model, inputs = tiny_custom()
    report = verify_run.verify(model, inputs, [kernel(n) for n in ("softmax", "reduce")], warmup=0,
                               repeat=1, compile_backend="aot_eager", compile_alone=True)
    t = report["timing"]
    assert report["passed"], report["failures"]
    entries = {e["name"]: e for e in report["kernels"]}
    for e in entries.values():
        assert e["compile_alone_ms"] > 0
        assert e["compile_gain_ms"] == pytest.approx(t["compile_ms"] - e["compile_alone_ms"])
    gainers = [n for n, e in entries.items() if e["compile_gain_ms"] > 0]
    assert t["compile_gainers"] == gainers
    assert (t["compile_gainers_ms"] is not None) == (0 < len(gainers) < len(entries))
    times = {v: t[f"{v}_ms"] for v in ("kernels", "gainers", "compile_kernels", "compile_gainers")
             if t[f"{v}_ms"] is not None}
    assert report["best_variant"] == min(times, key=times.get)
    verify_report.print_report(report)


def test_verify_pairs_the_best_variant_with_torch_compile_in_interleaved_rounds():
    """--paired-rounds: the best variant and torch.compile are built again and timed in rounds
    whose order alternates; the headline ratio is the median of the rounds' ratios, the one-shot
    ratio is kept beside it."""
    model, inputs = tiny_custom()
    report = verify_run.verify(model, inputs, [kernel(n) for n in ("softmax", "reduce")], warmup=0,
                               repeat=1, compile_backend="aot_eager", compile_alone=False,
                               paired_rounds=3)
    t, paired = report["timing"], report["timing"]["paired"]
    assert report["passed"], report["failures"]
    assert paired["note"] is None and paired["variant"] == report["best_variant"]
    assert paired["rounds"] == 3 and len(paired["ratios"]) == 3
    assert report["best_speedup_vs_compile"] == paired["ratio"] == sorted(paired["ratios"])[1]
    assert report["best_speedup_vs_compile_single"] == pytest.approx(
        t["compile_ms"] / report["best_ms"])
    verify_report.print_report(report)


@pytest.mark.parametrize("variant", ["kernels", "gainers", "compile_kernels",
                                     "compile_gainers"])
def test_pairing_times_the_best_variants_kernels_against_a_plain_torch_compile(variant,
                                                                             monkeypatch):
    """pair_with_compile rebuilds torch.compile of the original (no kernel runs in it) and the
    best variant with exactly its kernels (eager or compiled), then restores every patch."""
    model, inputs = tiny_custom()
    kernels = [kernel(n) for n in ("softmax", "reduce")]
    calls = Counter()
    for k in kernels:
        k.fn = functools.partial(lambda fn, name, **kw: (calls.update([name]), fn(**kw))[1],
                                 k.fn, k.name)
    seen = []

    def one_forward_each(runners, rounds, repeat):  # instead of timing: who ran which kernels
        for context, run in runners:
            calls.clear()
            with context():
                run()
            seen.append(set(calls))
        return [[1.0] * rounds, [2.0] * rounds]  # torch.compile 1 ms, the variant 2 ms
    monkeypatch.setattr(verify_run, "interleaved", one_forward_each)
    originals = (torch.sum, torch.Tensor.sum, F.softmax, torch.Tensor.softmax)
    report = {"best_variant": variant, "best_speedup_vs_compile": 0.6,
              "timing": {"gainers": ["softmax"], "compile_gainers": ["reduce"]}}
    verify_run.pair_with_compile(report, model, inputs, [(k, {}) for k in kernels], WeightCache(),
                                 "copy", "aot_eager", 1, 1, False, 3)
    want = {"gainers": {"softmax"}, "compile_gainers": {"reduce"}}.get(variant,
                                                                       {"softmax", "reduce"})
    assert seen == [set(), want]
    paired = report["timing"]["paired"]
    assert paired["note"] is None and paired["ratios"] == [0.5] * 3
    assert report["best_speedup_vs_compile"] == 0.5
    assert report["best_speedup_vs_compile_single"] == 0.6
    assert (torch.sum, torch.Tensor.sum, F.softmax, torch.Tensor.softmax) == originals


def test_interleaved_rounds_alternate_their_order_inside_each_runners_context():
    from autokernel.endtoend import interleaved
    calls, entered = [], []

    def runner(name):
        @contextlib.contextmanager
        def context():
            entered.append(name)
            inside.add(name)
            yield
            inside.discard(name)
        return context, lambda: calls.append((name, frozenset(inside)))
    inside = set()
    per_round = interleaved([runner("a"), runner("b")], rounds=3, repeat=2)
    assert [len(r) for r in per_round] == [3, 3]
    assert entered == ["a", "b", "b", "a", "a", "b"]
    assert [name for name, _ in calls] == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a",
                                           "b", "b"]
    assert all(within == {name} for name, within in calls)  # each run inside its own context
