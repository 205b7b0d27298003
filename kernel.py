"""
The file the agent edits: a small, correct example of the kernel file contract (the sum over the
last dim of x[M, N]). `uv run orchestrate.py next` replaces it with the plan's first kernel.

The contract (autokernel/contract.py reads these names without running the file):
    KERNEL_TYPE   one of the registered types (autokernel.KERNEL_TYPES): what kernel_fn computes
    kernel_fn     takes the reference's tensors by name, returns a new tensor of the reference's
                  dtype and shape; torch only allocates outputs and reads shapes and strides,
                  the math happens in the Triton kernel
optional:
    KERNEL_NAME   the tag in results.tsv and plan.json (default: KERNEL_TYPE)
    BACKEND       "triton" (the default)
    BENCH_SHAPES  the shapes that matter, e.g. [(4096, 50257)]; the first is timed
    BENCH_DTYPE   the timed dtype, "fp16" (default), "bf16" or "fp32"

One program per row walks the row in BLOCK_N-column tiles, masked at the tail (any N: 1023,
50257, 128256), and sums in fp32 whatever the input dtype: an fp16 sum loses digits on long rows.

Usage:
    uv run bench.py -m "what this edit tries"
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

BLOCK_N = 1024  # columns per step: a power of two


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, N, stride_xm, stride_xn, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride can pass 2^31 elements
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        mask = start + cols < N
        x = tl.load(x_ptr + row * stride_xm + (start + cols) * stride_xn, mask=mask, other=0.0)
        acc += x.to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    M, N = x.shape
    y = torch.empty((M,), dtype=x.dtype, device=x.device)
    row_sum_kernel[(M,)](x, y, N, x.stride(0), x.stride(1), BLOCK_N=BLOCK_N)
    return y
