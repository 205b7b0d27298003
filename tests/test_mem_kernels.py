"""Correctness of the six memory-bound starter kernels (kernels/<type>.py) on the CPU interpreter.

Each kernel runs the KernelType's CPU shape sets (sweep, edge, adversarial stability inputs) in
every dtype and every variant of its contract (norms: other eps values, no weight/bias; reduce:
dim 0 and a middle dim) and is compared with the fp64 oracle at the gate's tolerance; outputs are
checked for poisoned (unwritten) elements, determinism, and both the fused and the looped code
paths. The norms' eps/None-affine cases and reduce over any dim of any rank have tests of their own.

  uv run pytest tests/test_mem_kernels.py
"""
import pytest
import torch

# Masked lanes compute exp(-inf - -inf) etc. in a branch that tl.where then drops; numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

import autokernel
from autokernel.contract import load_module

MEMORY_KERNELS = ("softmax", "layernorm", "rmsnorm", "cross_entropy", "rotary_embedding", "reduce")


def load(name):
    return load_module(autokernel.KERNELS_DIR / f"{name}.py")


def assert_close(name, out, inputs, dtype, label):
    ktype = autokernel.KERNEL_TYPES[name]
    ref = ktype.reference(**inputs)
    assert out.shape == ref.shape, f"{label}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == autokernel.out_dtype(ktype, inputs), f"{label}: dtype {out.dtype}"
    assert torch.isfinite(out.double()).all() or not torch.isfinite(ref.double()).all(), \
        f"{label}: NaN/Inf in output"
    tol = autokernel.tolerance(dtype)
    torch.testing.assert_close(out.double(), ref.double(), atol=tol, rtol=tol, msg=lambda m:
                               f"{name} {label} {autokernel.DTYPE_NAMES[dtype]}: {m}")


def shapes_for(ktype):
    return list(ktype.cpu_shapes["sweep"]) + list(ktype.cpu_shapes["edge"])


@pytest.mark.parametrize("name", MEMORY_KERNELS)
def test_contract(name):
    module = load(name)
    assert module.KERNEL_TYPE == name
    assert getattr(module, "BACKEND", "triton") == "triton"
    assert callable(module.kernel_fn)


@pytest.mark.parametrize("name", MEMORY_KERNELS)
def test_shapes_and_dtypes(name):
    """Every shape in every dtype, the type's variants taken in turn over the shapes (as the
    gate's sweep and edge stages take them)."""
    module, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(1234)
    for i, shape in enumerate(shapes_for(ktype)):
        variant = ktype.variants[i % len(ktype.variants)]
        for dtype in ktype.dtypes():
            inputs = ktype.inputs(shape, dtype, "cpu", gen, variant)
            assert_close(name, module.kernel_fn(**inputs), inputs, dtype,
                         f"shape {shape} {variant}")


@pytest.mark.parametrize("name", MEMORY_KERNELS)
def test_adversarial_inputs(name):
    module, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(99)
    for shape in ktype.cpu_shapes["stability"] + [ktype.cpu_shapes["edge"][0]]:
        for variant in ktype.variants:
            for dtype in ktype.dtypes():
                for label, inputs in ktype.adversarial(shape, dtype, "cpu", gen, **variant):
                    assert_close(name, module.kernel_fn(**inputs), inputs, dtype,
                                 f"{label} at {shape} {variant}")


@pytest.mark.parametrize("name", MEMORY_KERNELS)
def test_every_element_written_and_deterministic(name, monkeypatch):
    """Poison what torch.empty hands out: an element the kernel never writes stays NaN."""
    module, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(7)
    shape = ktype.cpu_shapes["edge"][0]
    real_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    for variant in ktype.variants:
        inputs = ktype.inputs(shape, torch.float32, "cpu", gen, variant)
        monkeypatch.setattr(torch, "empty", poisoned_empty)
        first = module.kernel_fn(**inputs)
        second = module.kernel_fn(**inputs)
        monkeypatch.undo()
        assert_close(name, first, inputs, torch.float32, f"poisoned output {variant}")
        assert torch.equal(first, second), f"two runs on the same inputs differ {variant}"


def test_softmax_every_path_and_minus_inf():
    """The long-row kernels on short rows, -inf entries as attention masks make, and rows split
    over programs. The interpreter runs programs one by one, so a split row's programs find
    their siblings missing and read the whole row themselves, except the last, which combines
    the partials: both ways are checked."""
    softmax = load("softmax")
    gen = torch.Generator().manual_seed(3)
    x = autokernel.KERNEL_TYPES["softmax"].inputs((3, 1000), torch.float32, "cpu", gen)["x"]
    x[:, ::3] = float("-inf")
    x[1, :500] = float("-inf")
    x[2, 500:] = float("-inf")  # the second half's slices see only -inf
    ref = torch.softmax(x.double(), dim=-1)
    for kwargs in (dict(fused=True), dict(splits=1), dict(splits=3), dict(splits=4, max_spin=2),
                   dict(resident=False, splits=1), dict(resident=False, splits=3)):
        out = softmax.softmax(x, **{"fused": False, "block_n": 128, **kwargs})
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5, msg=str(kwargs))
    # a row of -inf only is NaN, as in torch, and so is a row holding a NaN (here one with its
    # sign bit set); the other rows are unharmed
    assert softmax.softmax(torch.full((1, 600), float("-inf")), fused=False, splits=2).isnan().all()
    x[1, 700] = -float("nan")
    for kwargs in (dict(splits=3), dict(splits=3, max_spin=5), dict(resident=False, splits=3)):
        out = softmax.softmax(x, fused=False, block_n=128, **kwargs)
        assert out[1].isnan().all(), kwargs
        torch.testing.assert_close(out[[0, 2]].double(), ref[[0, 2]], atol=1e-5, rtol=1e-5)
    # rows that start off 16-byte boundaries (odd N) in fp16, and a row stride wider than N;
    # at N=1020 row 0's last slice is empty, at N=17 a row is mostly its unaligned ends
    wide = autokernel.KERNEL_TYPES["softmax"].inputs((3, 1203), torch.float16, "cpu", gen)["x"]
    for view in (wide[:, :1001], wide[:, 5:1006], wide[:, :1020], wide[:, 3:20], wide):
        want = torch.softmax(view.double(), -1)
        for kwargs in (dict(splits=4), dict(splits=8), dict(resident=False, splits=4)):
            out = softmax.softmax(view, fused=False, block_n=128, **kwargs)
            torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2, msg=str(kwargs))


def test_softmax_long_row_plans():
    """Row slices: at most 8192 elements and never more programs a row than SMs (H100: 132)."""
    softmax = load("softmax")
    assert softmax._resident_plan(4096, 50257, None, 132) == (7, 7184, 8192)
    assert softmax._resident_plan(8, 50257, None, 132) == (25, 2016, 2048)  # few rows: more
    assert softmax._resident_plan(1, 1_000_000, None, 132)[0] == 132
    assert softmax._resident_plan(1, 2_000_000, None, 132) is None  # the looped kernel then
    assert softmax._looped_plan(4, 2_000_000, None, 8, None, 132)[1] <= 132
    assert softmax._looped_plan(4096, 2_000_000, None, 8, None, 132)[1] == 1


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "reduce"])
def test_looped_path_on_short_rows(name):
    """Force the long-row (looped) path at a size the interpreter runs fast, in every variant
    (reduce's other dims take the inner kernel: fused= and block_n= do not apply there)."""
    module, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(5)
    for variant in ktype.variants:
        for dtype in (torch.float16, torch.float32):
            for label, inputs in [("random", ktype.inputs((3, 1000), dtype, "cpu", gen, variant))] \
                    + ktype.adversarial((3, 1000), dtype, "cpu", gen, **variant):
                out = getattr(module, name)(**inputs, fused=False, block_n=128)
                assert_close(name, out, inputs, dtype, f"looped path, {label} {variant}")


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_norm_eps_and_missing_affine(name):
    """eps is the caller's (1e-5, 1e-6, 1e-12 and a large one that visibly changes the output),
    and weight and bias may each be None, on both the fused and the looped path."""
    module, ktype = load(name), autokernel.KERNEL_TYPES[name]
    gen = torch.Generator().manual_seed(8)
    terms = ("weight",) if name == "rmsnorm" else ("weight", "bias")
    affine = [("weight",), ()] if name == "rmsnorm" else [("weight", "bias"), ("weight",),
                                                          ("bias",), ()]
    for dtype in (torch.float16, torch.float32):
        for shape in [(4, 96), (3, 1000)]:
            full = ktype.inputs(shape, dtype, "cpu", gen)
            for present in affine:
                for eps in (1e-5, 1e-6, 1e-12, 0.5):
                    inputs = dict(full, eps=eps)
                    for arg in terms:
                        inputs[arg] = full[arg] if arg in present else None
                    label = f"{shape} eps={eps} with {present or 'no affine'}"
                    assert_close(name, module.kernel_fn(**inputs), inputs, dtype, label)
                    looped = getattr(module, name)(**inputs, fused=False, block_n=128)
                    assert_close(name, looped, inputs, dtype, f"looped path, {label}")
    # Rows whose variance and mean square are ~1e-4: eps 1e-2 against 1e-12 changes the output by
    # far more than the tolerance, so a kernel that kept a fixed eps would fail one of the two.
    x = 1e-2 * torch.randn((2, 64), generator=gen)
    rows = {"x": x, "weight": None, **({"bias": None} if name == "layernorm" else {})}
    outs = [module.kernel_fn(**rows, eps=eps) for eps in (1e-2, 1e-12)]
    for eps, out in zip((1e-2, 1e-12), outs):
        assert_close(name, out, dict(rows, eps=eps), torch.float32, f"eps={eps}")
    assert (outs[0] - outs[1]).abs().max() > 0.1


def test_reduce_any_dim_and_rank():
    """x.sum(dim) for every dim (negative too) of 1-D to 4-D x, through both kernels (inner == 1:
    the row kernel; inner > 1: the column-tiled one), with tiles small enough to take several
    steps over R and a partial column block; empty outputs and sums over an empty dim (zeros)."""
    reduce_ = load("reduce")
    gen = torch.Generator().manual_seed(9)
    cases = [((1000,), 0), ((1000,), -1), ((37, 300), -1), ((37, 300), 0), ((37, 300), -2),
             ((4, 37, 8), 1), ((4, 37, 8), 0), ((4, 37, 8), 2), ((4, 37, 8), -2),
             ((3, 5, 7, 2), 2), ((2, 9, 1), 1), ((1, 2100), 0)]
    for dtype in (torch.float16, torch.float32):
        for shape, dim in cases:
            x = torch.randn(shape, generator=gen).to(dtype)
            inputs = {"x": x, "dim": dim}
            assert_close("reduce", reduce_.kernel_fn(**inputs), inputs, dtype, f"{shape} dim={dim}")
            small = reduce_.reduce(x, dim, block_r=4, block_i=16, block_m=2, block_n=64)
            assert_close("reduce", small, inputs, dtype, f"{shape} dim={dim}, small tiles")
    for shape, dim in [((3, 0), 1), ((3, 0), 0), ((0, 5), 1), ((0, 5), 0), ((2, 0, 4), 1)]:
        x = torch.empty(shape)
        out = reduce_.kernel_fn(x=x, dim=dim)
        assert out.shape == x.sum(dim).shape and out.dtype == x.dtype
        assert torch.equal(out, torch.zeros_like(out)), f"{shape} dim={dim}"
    with pytest.raises(IndexError):
        reduce_.kernel_fn(x=torch.zeros(3, 4), dim=2)


def test_reduce_inner_tiles():
    """The column-tiled kernel's tile picks: ~4K-element tiles, wide column blocks when R is
    short, and narrower ones (not below 32) when few programs would each walk a long R."""
    reduce_ = load("reduce")
    assert reduce_._inner_config(16384, 4096, 8) == (512, 8, 8)     # [M, N, 8] over N
    assert reduce_._inner_config(1, 1, 128256)[:2] == (1, 4096)     # a sum of one row: a copy
    assert reduce_._inner_config(1, 16384, 4096)[:2] == (128, 32)   # dim 0 of a tall matrix
    for outer, R, inner in [(1, 16384, 4096), (7, 3, 5000), (1, 100000, 64), (64, 2, 3)]:
        block_r, block_i, _ = reduce_._inner_config(outer, R, inner)
        assert block_r * block_i <= reduce_.TILE and block_i >= min(32, inner)


def test_cross_entropy_split_rows():
    """Rows split over several programs (the small-M path) combine to the same loss."""
    ce = load("cross_entropy")
    ktype = autokernel.KERNEL_TYPES["cross_entropy"]
    gen = torch.Generator().manual_seed(11)
    inputs = ktype.inputs((5, 3001), torch.float32, "cpu", gen)
    for splits in (1, 3, 7):
        out = ce.cross_entropy(**inputs, splits=splits, block_n=256)
        assert_close("cross_entropy", out, inputs, torch.float32, f"{splits} splits")


def test_rotary_strided_input():
    """x as a transposed [B,S,H,D] buffer (what attention layers hand over) is honoured."""
    rotary = load("rotary_embedding")
    gen = torch.Generator().manual_seed(13)
    B, H, S, D = 2, 3, 40, 32
    x = torch.randn((B, S, H, D), generator=gen).transpose(1, 2)
    cos, sin = autokernel.rotary_tables(S, D, torch.float32, "cpu", offset=17)
    out = rotary.kernel_fn(x=x, cos=cos, sin=sin)
    ref = autokernel.KERNEL_TYPES["rotary_embedding"].reference(x=x, cos=cos, sin=sin)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_rotary_heads_per_program():
    """Several heads sharing one cos/sin tile give the same result as one head per program."""
    rotary = load("rotary_embedding")
    ktype = autokernel.KERNEL_TYPES["rotary_embedding"]
    inputs = ktype.inputs((1, 4, 33, 64), torch.float32, "cpu", torch.Generator().manual_seed(2))
    for heads in (2, 4):
        out = rotary.rotary_embedding(**inputs, heads=heads, block_s=16)
        assert_close("rotary_embedding", out, inputs, torch.float32, f"{heads} heads a program")
