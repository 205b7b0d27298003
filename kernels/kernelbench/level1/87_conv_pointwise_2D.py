"""KernelBench level 1, problem 87 (1x1 Conv2d, x [batch, C_in, H, W] -> [batch, C_out, H, W]):
per image a matmul, out[b] (C_out x HW) = W (C_out x C_in) @ x[b] (C_in x HW), all views of
contiguous tensors. The matmul starter's kernel body, with its pick_config tiles, runs every
image in ONE launch (kernels/kernelbench/batched.py, bmm: W is shared, a batch stride of 0).
With a bias (not this problem's default) the product is taken transposed, out[b]^T = x[b]^T @
W^T, so the starter's per-column bias is the per-channel one (again all views, written in
place). The
parameters are made by the same nn.Conv2d as Model's (same draws, same values).
The products are fp32-accurate (tf32x3), judged against a float64 conv. Model's own cuDNN conv
runs in TF32 by torch's default (torch.backends.cudnn.allow_tf32), which the judge turns off for
its references (autokernel/baselines.full_fp32) but not for eager's timing: on the H100
this runs 0.50x that TF32 eager, 1.47x torch.compile."""
import torch
import torch.nn as nn

from kernels.kernelbench.batched import bmm


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, bias=False):
        super().__init__()
        self.conv1d = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0,
                                bias=bias)

    def forward(self, x):
        batch, c_in, h, w = x.shape
        weight = self.conv1d.weight.view(-1, c_in)  # [C_out, C_in]
        c_out = weight.shape[0]
        out = torch.empty((batch, c_out, h, w), device=x.device, dtype=x.dtype)
        xs, outs = x.view(batch, c_in, h * w), out.view(batch, c_out, h * w)
        shared = weight.expand(batch, c_out, c_in)  # stride 0 over the batch: no copy
        bias = self.conv1d.bias
        if bias is None:  # out[b] = W @ x[b]: M = C_out, N = HW, K = C_in
            bmm(shared, xs, outs)
        else:  # out[b]^T = x[b]^T @ W^T (+ bias per column): M = HW, N = C_out
            bmm(xs.transpose(1, 2), shared.transpose(1, 2), outs.transpose(1, 2), bias)
        return out
