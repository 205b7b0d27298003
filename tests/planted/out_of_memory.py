"""Planted: allocates an absurd scratch buffer (a petabyte), on the CPU or the GPU.
Expected reason: out of memory."""
import torch

KERNEL_TYPE = "reduce"
BENCH_SHAPES = [(4, 256)]


def kernel_fn(x, dim=-1):
    scratch = torch.empty((1 << 50,), dtype=x.dtype, device=x.device)
    return scratch[: x.shape[0]]
