"""autokernel/fusion.py: the pass that folds a block's residual add into the matmul's (or
fused_mlp's) epilogue, and its LayerNorm into the matmul, inside torch.compile. Graphs are
traced with make_fx (aten ops, as inductor's post-grad pass sees them) and run before and after
the pass on the CPU."""
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from autokernel import fusion, verify_report, verify_select
from autokernel.kernel_call import KernelOp
from autokernel.swap import Swap

ROOT = Path(__file__).resolve().parent.parent
aten = torch.ops.aten


def compiled_op(path):
    """The kernel file's custom op, as a compiled swap registers it."""
    return KernelOp(verify_select.load_kernel(path), compiled=True).op


def block(op, x_shape=(2, 8, 32)):
    """x + proj(h) as a model writes it: the projection on rows, viewed back to x's shape."""
    def forward(x, h, W, b):
        return x + op(h.reshape(-1, h.shape[-1]), W, b).view(*h.shape[:-1], W.shape[1])
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(x_shape, generator=gen), torch.randn(2, 8, 16, generator=gen),
            torch.randn(16, 32, generator=gen), torch.randn(32, generator=gen))
    return forward, args


def traced(forward, args):
    return make_fx(forward, tracing_mode="fake")(*args)


def adds(gm):
    return sum(n.target == aten.add.Tensor for n in gm.graph.nodes)


def assert_add_folds_into(op, forward, args, **tolerance):
    """forward's one add goes into op's residual, and the outputs stay."""
    gm = traced(forward, args)
    want = gm(*args)
    assert adds(gm) == 1
    assert fusion.fold_residual_adds(gm.graph) == 1
    gm.graph.lint()
    gm.recompile()
    assert adds(gm) == 0
    (call,) = [n for n in gm.graph.nodes if n.target == op]
    assert call.kwargs["residual"] is not None
    torch.testing.assert_close(gm(*args), want, **tolerance)


def test_the_residual_add_folds_into_the_matmul_and_the_outputs_stay():
    op = compiled_op(ROOT / "kernels" / "matmul.py")
    assert_add_folds_into(op, *block(op))


def test_the_residual_add_after_an_mlp_folds_into_fused_mlp():
    """x + mlp(h) with the fused_mlp kernel: the add goes into its down projection."""
    op = compiled_op(ROOT / "kernels" / "fused_mlp.py")

    def forward(x, h, w_gate, w_up, w_down):
        return x + op(h.reshape(-1, 32), w_gate, w_up, w_down).view(2, 8, 32)
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(2, 8, 32, generator=gen), torch.randn(2, 8, 32, generator=gen),
            *(torch.randn(s, generator=gen) / 6 for s in ((48, 32), (48, 32), (32, 48))))
    assert_add_folds_into(op, forward, args, rtol=1e-4, atol=1e-4)


def test_a_kernel_file_without_residual_is_left_unfused_and_still_runs(tmp_path):
    old = tmp_path / "old_matmul.py"  # a kernel file written before the argument
    old.write_text('KERNEL_TYPE = "matmul"\n\n\n'
                   'def kernel_fn(A, B, bias=None, activation=None):\n'
                   '    return A @ B if bias is None else A @ B + bias\n')
    forward, args = block(compiled_op(old))
    gm = traced(forward, args)
    assert fusion.fold_residual_adds(gm.graph) == 0
    x, h, W, b = args
    torch.testing.assert_close(gm(*args), x + (h @ W + b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape", [(32,), (1, 8, 32)])
def test_a_broadcast_residual_is_not_folded(x_shape):
    forward, args = block(compiled_op(ROOT / "kernels" / "matmul.py"), x_shape)
    assert fusion.fold_residual_adds(traced(forward, args).graph) == 0


@pytest.mark.parametrize("use", ["used twice", "added to itself"])
def test_a_projection_used_again_is_not_folded(use):
    op = compiled_op(ROOT / "kernels" / "matmul.py")
    _, args = block(op)

    def forward(x, h, W, b):
        y = op(h.reshape(-1, 16), W, b).view(2, 8, 32)
        return (x + y, y * 2) if use == "used twice" else y + y
    assert fusion.fold_residual_adds(traced(forward, args).graph) == 0


def test_a_residual_computed_after_the_projection_folds_in_a_valid_order():
    """x made after the matmul (a parallel block: proj(h) + other(h)): the fused call goes
    where the add was, after x."""
    op = compiled_op(ROOT / "kernels" / "matmul.py")
    _, args = block(op)

    def forward(x, h, W, b):
        y = op(h.reshape(-1, 16), W, b).view(2, 8, 32)
        return y + x.sin()
    gm = traced(forward, args)
    want = gm(*args)
    assert fusion.fold_residual_adds(gm.graph) == 1
    gm.graph.lint()  # every node defined before its use
    gm.recompile()
    torch.testing.assert_close(gm(*args), want)


def test_the_pass_cache_key_changes_with_the_kernels_that_take_a_residual(tmp_path):
    """A compiled graph with a folded add must not come back from inductor's cache for a kernel
    file that no longer takes residual (same path, so the same op)."""
    path = tmp_path / "mm.py"
    path.write_text((ROOT / "kernels" / "matmul.py").read_text())
    compiled_op(path)
    with_residual = fusion.FusionPass().uuid()
    path.write_text('KERNEL_TYPE = "matmul"\n\n\ndef kernel_fn(A, B, bias=None, activation=None):'
                    '\n    return A @ B\n')
    compiled_op(path)
    assert fusion.FusionPass().uuid() != with_residual
    assert fusion.FusionPass(lambda graph: None).uuid() is None  # a pass with no key: no cache


def test_a_compiled_swap_installs_the_pass_for_its_compiles_only():
    import torch._inductor.config as config
    before = config.post_grad_custom_post_pass
    k = verify_select.load_kernel(ROOT / "kernels" / "matmul.py")
    with Swap([k], compiled=True).installed(nn.Linear(4, 4)):
        assert isinstance(config.post_grad_custom_post_pass, fusion.FusionPass)
    assert config.post_grad_custom_post_pass is before
    with Swap([k]).installed(nn.Linear(4, 4)):  # eager: nothing compiles
        assert config.post_grad_custom_post_pass is before


@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
def test_inductor_folds_a_pre_norm_blocks_adds_and_norm_and_keeps_its_outputs(monkeypatch):
    """The whole way: a compiled swap, inductor's post-grad pass, the fused op lowered and run
    (the one inductor compile of this file; caches off, or a cached graph skips the pass)."""
    import torch._inductor.config as config

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.fc, self.proj = nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 32)

        def forward(self, x):
            x = x + self.proj(torch.relu(self.fc(self.ln(x))))
            return x + self.fc(x)[..., :32]  # a projection whose output is sliced: not folded

    folded, implicit = [], []
    fold = fusion.fold_residual_adds
    monkeypatch.setattr(fusion, "fold_residual_adds", lambda g: folded.append(fold(g)))
    # inductor's implicit fallback logs each op it meets without a lowering: never ours
    import torch._inductor.graph as inductor_graph
    monkeypatch.setattr(inductor_graph.log, "info",
                        lambda msg, *args: implicit.append(msg % args) if "fallback" in msg
                        else None)
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 8, 32)
    want = model(x)
    k, norm = (verify_select.load_kernel(ROOT / "kernels" / f"{t}.py")
               for t in ("matmul", "layernorm"))
    swap = Swap([k, norm], compiled=True)
    torch._dynamo.reset()
    with torch.no_grad(), config.patch(force_disable_caches=True), swap.installed(model):
        model(x)  # the swap's weight copies exist before tracing
        compiled = torch.compile(model, backend="inductor")
        compiled(x)
        swap.reset()
        got = compiled(x)
    torch._dynamo.reset()
    assert folded == [1]
    assert not [m for m in implicit if "autokernel" in m]
    # what verify.py reports: the add after proj and the norm before fc folded in
    assert swap.calls[k.name] == 3 and swap.folded[k.name] == 1 and swap.normed[k.name] == 1
    assert swap.calls[norm.name] == 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_verify_says_which_calls_had_the_add_after_them_folded_in(capsys):
    verify_report.print_compile_kernels({
        "compile_ms": 4.65, "compile_kernels_ms": 4.43, "graph_breaks": 0,
        "compile_kernels_calls": {"layernorm": 25, "matmul": 49},
        "compile_kernels_folded": {"matmul": 24}, "compile_kernels_correctness": None})
    line = capsys.readouterr().out
    assert "layernorm 25, matmul 49 (24 with the add after it folded in);" in line
    verify_report.print_compile_kernels({
        "compile_ms": 4.65, "compile_kernels_ms": 4.33, "graph_breaks": 0,
        "compile_kernels_calls": {"layernorm": 1, "matmul": 49},
        "compile_kernels_folded": {"matmul": 24}, "compile_kernels_normed": {"matmul": 24},
        "compile_kernels_correctness": None})
    line = capsys.readouterr().out
    assert "matmul 49 (24 with the add after it folded in, 24 with the norm before it);" in line


def normed_projection(ln_op, mm_op, n=32):
    """A pre-norm block's norm and projection as a model writes them (rows of the norm's
    output), with the norm's x also used on its own (the residual stream)."""
    def forward(x, w, b, W, bias):
        h = ln_op(x, w, b, 1e-5)
        return x[..., :1] + mm_op(h.reshape(-1, h.shape[-1]), W, bias).view(2, 8, W.shape[1])
    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(2, 8, 16, generator=gen) * 2 + 3, 1 + 0.2 * torch.randn(16, generator=gen),
            0.2 * torch.randn(16, generator=gen), torch.randn(16, n, generator=gen),
            torch.randn(n, generator=gen))
    return forward, args


def calls_of(gm, op):
    return [n for n in gm.graph.nodes if n.target == op]


def test_a_layernorm_folds_into_the_projection_after_it_and_the_outputs_stay():
    ln_op, mm_op = (compiled_op(ROOT / "kernels" / f"{t}.py") for t in ("layernorm", "matmul"))
    forward, args = normed_projection(ln_op, mm_op)
    gm = traced(forward, args)
    want = gm(*args)
    assert fusion.fold_layernorms(gm.graph) == 1
    gm.graph.lint()
    gm.recompile()
    assert not calls_of(gm, ln_op)
    (call,) = calls_of(gm, mm_op)
    assert call.kwargs["ln_eps"] == 1e-5 and call.kwargs["ln_weight"] is not None
    torch.testing.assert_close(gm(*args), want, rtol=1e-4, atol=1e-4)


def test_a_layernorm_is_not_folded_into_a_vocabulary_wide_projection_or_a_second_use(
        monkeypatch):
    ln_op, mm_op = (compiled_op(ROOT / "kernels" / f"{t}.py") for t in ("layernorm", "matmul"))
    monkeypatch.setattr(fusion, "LN_FOLD_MAX_N", 16)  # N = 32 counts as vocabulary-wide
    gm = traced(*normed_projection(ln_op, mm_op))
    assert fusion.fold_layernorms(gm.graph) == 0
    monkeypatch.undo()

    def twice(x, w, b, W, bias):  # the norm's output also used on its own
        h = ln_op(x, w, b, 1e-5)
        return mm_op(h.reshape(-1, 16), W, bias).sum() + h.sum()
    gm = traced(twice, normed_projection(ln_op, mm_op)[1])
    assert fusion.fold_layernorms(gm.graph) == 0

    def halves(x, w, b, W, bias):  # rows of 16 normalized, products over 8 of them
        h = ln_op(x, w, b, 1e-5)
        return mm_op(h.reshape(-1, 8), W[:8], bias)
    gm = traced(halves, normed_projection(ln_op, mm_op)[1])
    assert fusion.fold_layernorms(gm.graph) == 0


def test_a_kernel_file_without_the_norm_is_left_unfused(tmp_path):
    old = tmp_path / "old_matmul.py"  # a kernel file written before the arguments
    old.write_text('KERNEL_TYPE = "matmul"\n\n\n'
                   'def kernel_fn(A, B, bias=None, activation=None, residual=None):\n'
                   '    return A @ B if bias is None else A @ B + bias\n')
    ln_op = compiled_op(ROOT / "kernels" / "layernorm.py")
    gm = traced(*normed_projection(ln_op, compiled_op(old)))
    assert fusion.fold_layernorms(gm.graph) == 0
