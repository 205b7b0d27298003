"""CPU (Triton interpreter) tests for the compute-bound starters: kernels/matmul.py,
kernels/flash_attention.py, kernels/fused_mlp.py.

    uv run pytest tests/test_kernels_compute.py

Each kernel is judged like bench.py judges it: fp64 oracle from reference.py, the shared
tolerance, every CPU shape set and adversarial input of its type, fp16 and fp32 (the interpreter's
bf16 tl.dot is wrong, so bf16 runs on the GPU only), plus the strided layouts models hand over.
"""
import pytest
import torch

import autokernel
import reference

KERNELS = ("matmul", "flash_attention", "fused_mlp")
DTYPES = (torch.float16, torch.float32)


def load(name):
    return autokernel.load_module(autokernel.KERNELS_DIR / f"{name}.py")


def assert_matches(out, ref):
    tol = autokernel.tolerance(ref.dtype)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref.double(), atol=tol, rtol=tol)


def all_cpu_shapes(ktype):
    shapes = [ktype.cpu_shapes["primary"]]
    for stage in ("sweep", "stability", "edge"):
        shapes += ktype.cpu_shapes[stage]
    return shapes


@pytest.mark.parametrize("name", KERNELS)
def test_contract(name):
    mod = load(name)
    assert mod.KERNEL_TYPE == name and mod.BACKEND == "triton" and callable(mod.kernel_fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "fp32"])
@pytest.mark.parametrize("name", KERNELS)
def test_shape_sets(name, dtype):
    mod, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(0)
    for shape in all_cpu_shapes(ktype):
        inputs = ktype.inputs(shape, dtype, "cpu", gen)
        before = {k: v.clone() for k, v in inputs.items()}
        out = mod.kernel_fn(**inputs)
        assert_matches(out, ktype.reference(**inputs))
        for k in inputs:  # inputs untouched, output is a new tensor
            assert torch.equal(inputs[k], before[k]) and out.data_ptr() != inputs[k].data_ptr()


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "fp32"])
@pytest.mark.parametrize("name", KERNELS)
def test_adversarial(name, dtype):
    mod, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(1)
    for label, inputs in ktype.adversarial(ktype.cpu_shapes["stability"][0], dtype, "cpu", gen):
        assert_matches(mod.kernel_fn(**inputs), ktype.reference(**inputs))


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_matmul_strided_operands(tma):
    """B = W.t() (F.linear's weight), column-major A, and a K whose rows TMA cannot describe."""
    mm = load("matmul")
    gen = torch.Generator().manual_seed(2)
    for M, N, K in [(48, 80, 64), (17, 33, 40), (5, 40, 23)]:
        A = torch.randn(M, K, generator=gen).half()
        W = torch.randn(N, K, generator=gen).half()
        for a in (A, A.t().contiguous().t()):
            for b in (W.t(), W.t().contiguous()):
                assert_matches(mm.matmul(a, b, tma=tma), reference.matmul(a, b))


def test_matmul_configs_agree():
    """Every tile shape pick_config can return computes the same product (ragged edges included)."""
    mm = load("matmul")
    gen = torch.Generator().manual_seed(3)
    A, B = torch.randn(70, 96, generator=gen).half(), torch.randn(96, 130, generator=gen).half()
    ref = reference.matmul(A, B)
    seen = set()
    for M, N, K, dt in [(8, 8, 8, torch.float16), (4096, 4096, 64, torch.float16),
                        (512, 512, 64, torch.float16), (512, 512, 64, torch.float32)]:
        cfg = mm.pick_config(M, N, K, dt)
        key = tuple(sorted(cfg.items()))
        if key in seen:
            continue
        seen.add(key)
        assert_matches(mm.matmul(A, B, config=cfg, tma=False), ref)
    assert len(seen) == 4, "pick_config should offer four distinct tilings"


def test_attention_layouts_and_odd_head_dim():
    """Q/K/V as views of a [B,S,H,D] tensor (models transpose, they do not copy) and D=80."""
    fa = load("flash_attention")
    gen = torch.Generator().manual_seed(4)
    for B, H, S, D in [(1, 2, 45, 32), (1, 2, 70, 80)]:
        q, k, v = (torch.randn(B, S, H, D, generator=gen).half().transpose(1, 2) for _ in range(3))
        assert not q.is_contiguous()
        assert_matches(fa.kernel_fn(q, k, v), reference.flash_attention(q, k, v))
    # Small blocks force several off-diagonal and diagonal steps per program.
    q, k, v = (torch.randn(1, 1, 100, 16, generator=gen) for _ in range(3))
    out = fa.flash_attention(q, k, v, config=dict(BLOCK_M=32, BLOCK_N=16, num_warps=4,
                                                  num_stages=2))
    assert_matches(out, reference.flash_attention(q, k, v))


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_fused_mlp_weight_layouts(tma):
    """Weights that are transposed views (w_gate and w_up laid out differently) still work."""
    mlp = load("fused_mlp")
    gen = torch.Generator().manual_seed(5)
    M, D, F = 20, 48, 80
    x = torch.randn(M, D, generator=gen).half()
    w_gate = (torch.randn(D, F, generator=gen) * D ** -0.5).half().t()
    w_up = (torch.randn(F, D, generator=gen) * D ** -0.5).half()
    w_down = (torch.randn(D, F, generator=gen) * F ** -0.5).half()
    out = mlp.fused_mlp(x, w_gate, w_up, w_down, tma=tma)
    assert_matches(out, reference.fused_mlp(x, w_gate, w_up, w_down))
