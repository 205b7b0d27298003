"""KernelBench level 1, problem 87 (1x1 Conv2d, x [batch, C_in, H, W] -> [batch, C_out, H, W]):
per image a matmul, out[b] (C_out x HW) = W (C_out x C_in) @ x[b] (C_in x HW), all views of
contiguous tensors. The matmul starter's kernel body (kernels/matmul.py, matmul_ptr_kernel with
its pick_config tiles, called as a device function) runs every image in ONE launch: grid axis 1
is the image, whose x and out base pointers a wrapper kernel offsets (W is shared). With a bias
(not this problem's default) the product is taken transposed, out[b]^T = x[b]^T @ W^T, so the
starter's per-column bias is the per-channel one (again all views, written in place). The
parameters are made by the same nn.Conv2d as Model's (same draws, same values).
The products are fp32-accurate (tf32x3): on an H200 at the real size it matched a float64 conv
everywhere, while Model's cuDNN conv in fp32 runs in TF32 by default
(torch.backends.cudnn.allow_tf32) and missed the 1e-4 tolerance of float64 at ~16% of the elements."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

from kernels.matmul import _dot_precision, matmul_ptr_kernel, pick_config


@triton.jit
def batched_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_ab, stride_am, stride_ak,
                   stride_bb, stride_bk, stride_bn, stride_cb, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                   HAS_BIAS: tl.constexpr):
    batch = tl.program_id(1).to(tl.int64)
    matmul_ptr_kernel(a_ptr + batch * stride_ab, b_ptr + batch * stride_bb,
                      c_ptr + batch * stride_cb, bias_ptr, M, N, K, stride_am, stride_ak,
                      stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
                      GROUP_M, EVEN_K, PRECISION, HAS_BIAS, None)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, bias=False):
        super().__init__()
        self.conv1d = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0,
                                bias=bias)

    def forward(self, x):
        batch, c_in, h, w = x.shape
        weight = self.conv1d.weight.view(-1, c_in)  # [C_out, C_in]
        c_out, hw = weight.shape[0], h * w
        out = torch.empty((batch, c_out, h, w), device=x.device, dtype=x.dtype)
        xs, outs = x.view(batch, c_in, hw), out.view(batch, c_out, hw)
        bias = self.conv1d.bias
        if bias is None:  # out[b] = W @ x[b]: M = C_out, N = HW, K = C_in
            a, a_sb, b, b_sb, c, c_sb = weight, 0, xs[0], xs.stride(0), outs[0], outs.stride(0)
            M, N = c_out, hw
        else:  # out[b]^T = x[b]^T @ W^T (+ bias per column): M = HW, N = C_out
            a, a_sb, b, b_sb = xs[0].t(), xs.stride(0), weight.t(), 0
            c, c_sb = outs[0].t(), outs.stride(0)
            M, N = hw, c_out
        cfg = pick_config(M, N, c_in, x.dtype)
        BM, BN, BK = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
        grid = ((M + BM - 1) // BM * ((N + BN - 1) // BN), batch)
        batched_kernel[grid](
            a, b, c, bias if bias is not None else c, M, N, c_in, a_sb, *a.stride(), b_sb,
            *b.stride(), c_sb, *c.stride(), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
            GROUP_M=cfg["GROUP_M"], EVEN_K=c_in % BK == 0, PRECISION=_dot_precision(x.dtype),
            HAS_BIAS=bias is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return out
