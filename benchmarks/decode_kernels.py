"""
A generation step's kernels one at a time: each starter at the shapes a Llama-3.2-1B-shaped
model's decode step calls it with (batch 1 and 8, bf16), against eager PyTorch (cuBLAS, SDPA)
and torch.compile of it, every one timed as CUDA graph replays (as inside a captured step:
no launch overhead from Python) by triton.testing.do_bench_cudagraph, which does not flush L2
between replays (a weight under L2's size is partly served from it). Each starter is first
checked against the fp64 oracle; a wrong one gets no time.

    python3 benchmarks/decode_kernels.py [OUT.json]

Prints one row per call: microseconds, GB/s (the type's bytes a call), the share of the copy
bandwidth prepare.py measured (when prepare.json is there) and ours / eager, ours / compile.
Where the step is slower than torch.compile's, the rows say which kernel to work on.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere
import autokernel.kernel_types  # noqa: E402,F401  (first: CPU mode before triton is imported)
import torch  # noqa: E402
import triton.testing  # noqa: E402

from autokernel import CUDA, KERNEL_TYPES, KERNELS_DIR, reference  # noqa: E402
from autokernel.baselines import ensure_ceilings, roofline_ceilings  # noqa: E402
from autokernel.contract import load_module  # noqa: E402

HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, CACHE = 2048, 8192, 128256, 32, 8, 64, 768
# (kernel type, the step's call it stands for, shape in the type's convention, variant)
CASES = [(t, what, shape(b), variant) for b in (1, 8) for t, what, shape, variant in [
    ("rmsnorm", "a layer's norms", lambda b: (b, HIDDEN), {}),
    ("qkv_rotary", "q/k/v + rotary", lambda b: (b, 1, HIDDEN, HEADS, KV_HEADS, HEAD_DIM), {}),
    ("decode_attention", "attention over the cache",
     lambda b: (b, HEADS, KV_HEADS, 1, CACHE, HEAD_DIM), {"ragged": True}),
    ("matmul", "o_proj", lambda b: (b, HIDDEN, HIDDEN), {}),
    ("fused_mlp", "the MLP", lambda b: (b, HIDDEN, FFN), {}),
    ("matmul", "lm_head", lambda b: (b, VOCAB, HIDDEN), {}),
]]


def timed(fn):
    fn()  # compiles (Triton, inductor) before the capture
    return triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else None
    if not CUDA:
        sys.exit("decode_kernels.py times kernels on a GPU; this machine has none")
    dtype = torch.bfloat16
    ensure_ceilings(log=lambda *_: None)  # prepare.py's copy bandwidth, measured if missing
    bandwidth = roofline_ceilings(dtype)["bandwidth_gb_s"]
    rows = []
    for ktype, what, shape, variant in CASES:
        kt = KERNEL_TYPES[ktype]
        inputs = kt.inputs(shape, dtype, "cuda", torch.Generator("cuda").manual_seed(0), variant)
        starter = load_module(KERNELS_DIR / f"{ktype}.py").kernel_fn
        eager = getattr(reference, f"{ktype}_eager")
        bad, _ = kt.mismatches(starter(**inputs), kt.reference(**inputs), inputs)
        row = {"type": ktype, "call": what, "shape": "x".join(map(str, shape)),
               "correct": not bool(bad.any())}
        if row["correct"]:
            compiled = torch.compile(eager)
            row.update(ours_us=timed(lambda: starter(**inputs)),
                       eager_us=timed(lambda: eager(**inputs)),
                       compile_us=timed(lambda: compiled(**inputs)))
            row["gb_s"] = kt.bytes(shape, dtype) / row["ours_us"] / 1e3
        rows.append(row)
        print(row, flush=True)
    print(f"\nbf16, CUDA graph replays, copy bandwidth {bandwidth:,.0f} GB/s")
    print("| call | shape | ours us | GB/s | % copy | eager us | compile us | vs eager | "
          "vs compile |\n|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        if not r["correct"]:
            print(f"| {r['call']} | {r['shape']} | WRONG | | | | | | |")
            continue
        print(f"| {r['call']} ({r['type']}) | {r['shape']} | {r['ours_us']:.1f} | "
              f"{r['gb_s']:,.0f} | {100 * r['gb_s'] / bandwidth:.0f}% | {r['eager_us']:.1f} | "
              f"{r['compile_us']:.1f} | {r['eager_us'] / r['ours_us']:.2f}x | "
              f"{r['compile_us'] / r['ours_us']:.2f}x |")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
