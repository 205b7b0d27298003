"""
The skinny (split-K) path of the matmul and fused_mlp starters, swept over its tiles, slices and
launch settings at a Llama-3.2-1B-shaped decode step's GEMMs (batch 1 and 8, bf16): which
config streams the weights closest to the copy bandwidth, against cuBLAS (F.linear) at the
same shape. Each config's output is checked against an fp32 product first; a wrong one gets no
time. Timed as CUDA graph replays (triton.testing.do_bench_cudagraph), as inside a captured step.

    python3 benchmarks/skinny_sweep.py [OUT.json]

Prints, per GEMM, cuBLAS, the starter's current config and the five fastest configs (us, GB/s
of the weights, share of the copy bandwidth); skinny_config's defaults in kernels/matmul.py and
kernels/fused_mlp.py come from these tables.
"""
import functools
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere
import autokernel.kernel_types  # noqa: E402,F401  (first: CPU mode before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton.testing  # noqa: E402

from autokernel import CUDA, KERNELS_DIR  # noqa: E402
from autokernel.contract import load_module  # noqa: E402

HIDDEN, FFN, VOCAB = 2048, 8192, 128256
# (name, starter, N, K, gated): the decode step's weight products, N output columns over K
GEMMS = [("o_proj", "matmul", HIDDEN, HIDDEN, False),
         ("gate+up", "fused_mlp", FFN, HIDDEN, True),
         ("down", "fused_mlp", HIDDEN, FFN, False),
         ("lm_head", "matmul", VOCAB, HIDDEN, False)]
TILES = [(n, k) for n in (32, 64, 128) for k in (128, 256)]
PER_SM = (1, 2, 4, 8)
LAUNCHES = [dict(num_warps=4, num_stages=3), dict(num_warps=8, num_stages=3),
            dict(num_warps=4, num_stages=5)]


def timed(fn):
    fn()  # compiles before the capture
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def product(module, starter, a, w1, w2):
    """The starter's skinny call for a @ w1^T (silu(a @ w1^T) * (a @ w2^T) when gated)."""
    out = torch.empty(a.shape[0], w1.shape[0], device=a.device, dtype=a.dtype)
    if starter == "matmul":
        return lambda: module.matmul_skinny(a, w1.t(), None, None, None, out)
    return lambda: module.mlp_skinny(a, w1, w2, None, out)


def configs(N, launch):
    yield "current", {}, launch
    for (bn, bk), per_sm, lc in itertools.product(TILES, PER_SM, LAUNCHES):
        if N < 16 * HIDDEN or per_sm == 4:  # lm_head: a slice per program already at 4 a SM
            yield (f"n{bn} k{bk} {per_sm}/SM w{lc['num_warps']} s{lc['num_stages']}",
                   dict(block_n=bn, block_k=bk, per_sm=per_sm), lc)


def sweep(starter, N, K, gated, M, module, bandwidth):
    gen = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K ** 0.5
    w2 = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K ** 0.5
          if gated else None)
    if gated:
        want = F.silu(a.float() @ w1.float().t()) * (a.float() @ w2.float().t())
        cublas = lambda: F.silu(F.linear(a, w1)) * F.linear(a, w2)  # noqa: E731
    else:
        want = a.float() @ w1.float().t()
        cublas = lambda: F.linear(a, w1)  # noqa: E731
    rows = [{"config": "cuBLAS (F.linear)", "us": timed(cublas)}]
    default = module.skinny_config.__wrapped__
    saved = module.skinny_config, module.SKINNY_LAUNCH
    try:
        for label, tile, launch in configs(N, saved[1]):
            module.skinny_config = functools.partial(default, **tile)
            module.SKINNY_LAUNCH = launch
            fn = product(module, starter, a, w1, w2)
            try:
                got = fn()
            except triton.runtime.errors.OutOfResources:  # the tile and stages do not fit
                continue
            if not torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2):
                rows.append({"config": label, "us": None, "wrong": True})
            else:
                rows.append({"config": label, "us": timed(fn)})
    finally:
        module.skinny_config, module.SKINNY_LAUNCH = saved
    weight_bytes = N * K * 2 * (2 if gated else 1)
    for row in rows:
        row["gb_s"] = weight_bytes / row["us"] / 1e3 if row["us"] else None
        row["share"] = row["gb_s"] / bandwidth if row["gb_s"] else None
    return rows


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else None
    if not CUDA:
        sys.exit("skinny_sweep.py times kernels on a GPU; this machine has none")
    from autokernel.baselines import ensure_ceilings, roofline_ceilings
    ensure_ceilings(log=lambda *_: None)  # prepare.py's copy bandwidth, measured if missing
    bandwidth = roofline_ceilings(torch.bfloat16)["bandwidth_gb_s"]
    modules = {s: load_module(KERNELS_DIR / f"{s}.py") for s in ("matmul", "fused_mlp")}
    report = []
    for (name, starter, N, K, gated), M in itertools.product(GEMMS, (1, 8)):
        rows = sweep(starter, N, K, gated, M, modules[starter], bandwidth)
        report.append({"gemm": name, "M": M, "N": N, "K": K, "gated": gated, "rows": rows})
        print(f"\n{name} M={M} ({N}x{K}{', gated' if gated else ''}); copy {bandwidth:,.0f} GB/s")
        fixed = [r for r in rows[:2] if r["us"]]
        best = sorted((r for r in rows[2:] if r["us"]), key=lambda r: r["us"])[:5]
        for row in fixed + best:
            print(f"  {row['config']:<28} {row['us']:8.1f} us {row['gb_s']:7.0f} GB/s "
                  f"{row['share']:5.0%}")
        wrong = [r["config"] for r in rows if r.get("wrong")]
        if wrong:
            print(f"  WRONG: {', '.join(wrong)}")
        sys.stdout.flush()
    if out:
        Path(out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                         "bandwidth_gb_s": bandwidth, "gemms": report}, indent=1))


if __name__ == "__main__":
    main()
