"""
The weight copies the matmul and qkv_rotary kernels read, made once per weight.

Weights for the matmul kernel are transposed to contiguous [K, N] copies ONCE per weight (a
load-time layout change, like a serving engine's; weight_layout="view", verify.py's
--weight-layout view, passes the strided W.t() view instead, for kernels that honour strides).
A copy whose rows would not be a multiple of 128 bytes (GPT-2's vocabulary of 50257) gets zero
columns (and its bias zeros) up to the next multiple, and the kernel's output is viewed back to N
columns: rows that are not 16-byte aligned rule out vector loads and TMA and make a matmul like
GPT-2's lm_head several times slower, and rows that are not 128-byte aligned split every TMA row
of the output across cache lines (the Hopper matmul ran GPT-2's lm_head 15% slower at N = 50264
than at 50304). torch.compile pads such matmuls too; nanoGPT pads its vocabulary. The kernel is
picked and reported by the model's shape, N=50257. A qkv_rotary kernel's stacked q/k/v weights
are made the same way, once per weight version.
"""
import weakref

import torch

ROW_BYTES = 128  # the matmul weight copies' rows: a multiple of one cache line


class WeightCache:
    """Contiguous W.t() copies [K, N_padded] for the matmul kernel, made once per weight and
    shared by every swap of a run (so timing runs never pay for them). Rows are padded with
    zero columns to a multiple of ROW_BYTES (see the module docstring)."""

    def __init__(self):
        self.copies = {}

    def transposed(self, weight):
        key = id(weight)
        hit = self.copies.get(key)
        if hit and hit[0]() is weight and _same_version(hit[1], weight):
            return hit[2]
        n, k = weight.shape
        per_row_unit = max(1, ROW_BYTES // weight.element_size())
        padded = -(-n // per_row_unit) * per_row_unit
        copy = weight.new_zeros((k, padded))
        copy[:, :n] = weight.detach().t()
        self.copies[key] = (weakref.ref(weight), weight._version, copy)
        return copy

    def stacked(self, tensors):
        """torch.cat(tensors) (q/k/v weights, or their biases), made once per versions."""
        key = tuple(id(t) for t in tensors)
        hit = self.copies.get(key)
        if hit and all(r() is t and _same_version(v, t) for r, v, t in zip(hit[0], hit[1],
                                                                             tensors)):
            return hit[2]
        copy = torch.cat([t.detach() for t in tensors])
        self.copies[key] = ([weakref.ref(t) for t in tensors], [t._version for t in tensors],
                            copy)
        return copy

    def padded_bias(self, bias, width):
        """bias [N] with zeros up to `width` (the padded weight copy's columns), made once."""
        if bias is None or bias.shape[0] == width:
            return bias
        hit = self.copies.get(id(bias))
        if hit and hit[0]() is bias and _same_version(hit[1], bias):
            return hit[2]
        copy = bias.new_zeros((width,))
        copy[:bias.shape[0]] = bias.detach()
        self.copies[id(bias)] = (weakref.ref(bias), bias._version, copy)
        return copy


def _same_version(version, tensor):
    """Whether a tensor is unchanged since its copy was made. Dynamo sees a tensor's _version as
    data (a graph break): a traced forward trusts the copy, and keeps it while it runs."""
    return torch.compiler.is_compiling() or version == tensor._version
