"""Planted: matmul through torch (cuBLAS), not Triton. Expected reason: torch compute op aten.mm."""
KERNEL_TYPE = "matmul"
BENCH_SHAPES = [(16, 16, 16)]


def kernel_fn(A, B, bias=None, activation=None):
    out = A @ B
    return out if bias is None else out + bias
