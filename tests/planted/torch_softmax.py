"""Planted: lets PyTorch do the math. Expected reason: called torch compute op aten._softmax."""
import torch

KERNEL_TYPE = "softmax"
BENCH_SHAPES = [(4, 256)]


def kernel_fn(x):
    return torch.softmax(x, dim=-1)
