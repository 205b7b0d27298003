"""
An attention layer's q/k/v projections as one GEMM with rotary embedding on q and k in its
epilogue, in CUDA C++. Starter kernel for AutoKernel (BACKEND = "cuda"):
    qkv[b, s, h, :] = x[b, s, :] @ w_qkv[h*D:(h+1)*D, :]^T (+ bias), heads h < Hq + Hkv rotated:
    out[..., :D/2] = x1 cos[s] - x2 sin[s],  out[..., D/2:] = x2 cos[s] + x1 sin[s]
x [B, S, K] and w_qkv [(Hq + 2 Hkv) * D, K] of any strides, cos/sin [S, D/2]; the output is a
new contiguous [B, S, Hq + 2 Hkv, D] in x's dtype (q heads, k heads, v heads), fp32 math.

Two kernels, picked per call:
  * fp16/bf16 with a head dim of 16, 32, 64, 80, 96, 128 or 256: tensor cores
    (mma.sync.m16n8k16). 4 warps own 64 positions of one head, each warp 16 rows by all D
    columns as D/8 tiles; a lane holds rows g and g + 8, columns 2t and 2t + 1 of every tile
    (g = lane / 4, t = lane % 4), so the head's tiles n and n + D/16 give it both elements of
    its rotation pairs: the epilogue needs no exchange. K advances 32 at a time through shared
    memory (16-byte loads where rows are aligned; rows padded to 80 bytes: no bank conflicts).
  * everything else (fp32, other head dims): CUDA-core FMAs, 64 positions by one head a block,
    each thread 4 rows by 8 pairs (j, j + D/2) in fp32 registers.

On the H100 at the compact LLaMA's shape (the gate, fp16): 715 us, 0.87x eager (620: cuBLAS's
GEMM, then eager rotary), 0.21x torch.compile; the CUDA-core kernel alone ran 10.1 ms; the
Triton starter 116 us. The tensor-core mainloop has no pipelining yet: each k-step loads, syncs,
multiplies. Tried: 128-position, 128-column tiles (8 warps, x and w read from L2 half as
often): 770 us, slower. Things to try, in order: cp.async double buffering (loads of k-step
i + 1 under the MMAs of step i), ldmatrix fragment loads, wgmma with TMA on Hopper
(kernels/cuda/matmul.py has that mainloop).

Usage:
  uv run bench.py --kernel kernels/cuda/qkv_rotary.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "qkv_rotary"
BACKEND = "cuda"

CUDA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

constexpr int BM = 64, BK = 16, ROWS = 4, PAIRS = 8, DMAX = 256;

struct Args {
    long long M, xb, xs, xk, wn, wk, ts, td;
    int S, K, D, heads, rot_heads;
};

// Both kernels' epilogue: elements j and j + D/2 of one head's row (position s) of the output,
// the bias added, rotated for q and k heads, rounded once.
template <typename T>
__device__ __forceinline__ void store_pair(T* o, float v1, float v2, int j, int head, int s,
                                           bool rotate, const T* bias, const T* cos_t,
                                           const T* sin_t, const Args& a) {
    const int half = a.D / 2;
    if (bias) {
        v1 += to_f32(bias[head * a.D + j]);
        v2 += to_f32(bias[head * a.D + j + half]);
    }
    if (rotate) {
        const float c = to_f32(cos_t[s * a.ts + j * a.td]);
        const float sn = to_f32(sin_t[s * a.ts + j * a.td]);
        const float r1 = v1 * c - v2 * sn, r2 = v2 * c + v1 * sn;
        v1 = r1;
        v2 = r2;
    }
    o[j] = from_f32<T>(v1);
    o[j + half] = from_f32<T>(v2);
}

template <typename T>
__global__ void __launch_bounds__(256) qkv_rotary(const T* __restrict__ x,
                                                  const T* __restrict__ w,
                                                  const T* __restrict__ bias,
                                                  const T* __restrict__ cos_t,
                                                  const T* __restrict__ sin_t,
                                                  T* __restrict__ out, Args a) {
    __shared__ float xs[BK][BM];
    __shared__ float ws[BK][DMAX];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = a.D / 2;
    const long long m0 = (long long)blockIdx.x * BM;
    const int head = blockIdx.y;
    const T* wh = w + (long long)head * a.D * a.wn;
    float acc1[ROWS][PAIRS] = {}, acc2[ROWS][PAIRS] = {};
    for (int k0 = 0; k0 < a.K; k0 += BK) {
        for (int i = threadIdx.x; i < BK * BM; i += blockDim.x) {  // x tile, transposed
            const int r = i / BK, kk = i % BK;
            const long long m = m0 + r;
            float v = 0.f;
            if (m < a.M && k0 + kk < a.K)
                v = to_f32(x[(m / a.S) * a.xb + (m % a.S) * a.xs + (long long)(k0 + kk) * a.xk]);
            xs[kk][r] = v;
        }
        for (int i = threadIdx.x; i < BK * a.D; i += blockDim.x) {  // this head's weight rows
            const int d = i / BK, kk = i % BK;
            ws[kk][d] = k0 + kk < a.K ? to_f32(wh[d * a.wn + (long long)(k0 + kk) * a.wk]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float xv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) xv[r] = xs[kk][ty + 16 * r];
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) {
                const int j = tx + 16 * p;
                if (j < half) {
                    const float w1 = ws[kk][j], w2 = ws[kk][j + half];
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        acc1[r][p] = fmaf(xv[r], w1, acc1[r][p]);
                        acc2[r][p] = fmaf(xv[r], w2, acc2[r][p]);
                    }
                }
            }
        }
        __syncthreads();
    }
    const bool rotate = head < a.rot_heads;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const long long m = m0 + ty + 16 * r;
        if (m >= a.M) continue;
        const int s = (int)(m % a.S);
        T* o = out + (m * a.heads + head) * a.D;
#pragma unroll
        for (int p = 0; p < PAIRS; ++p) {
            const int j = tx + 16 * p;
            if (j >= half) continue;
            store_pair(o, acc1[r][p], acc2[r][p], j, head, s, rotate, bias, cos_t, sin_t, a);
        }
    }
}

// Tensor cores (fp16/bf16, D a multiple of 16): 4 warps own 64 positions of one head, warp w
// rows 16w..16w+15 and all D columns as NT = D/8 tiles of mma.sync.m16n8k16. Lane (g, t) =
// (lane / 4, lane % 4) accumulates rows g and g + 8, columns 2t and 2t + 1 of every tile, so
// tiles n and n + NT/2 (the head's two halves) give it both elements of its rotation pairs.
// K advances 32 at a time through shared memory, 16-byte loads where rows are aligned (VEC).
constexpr int TBM = 64, TBK = 32, PAD = 8;  // PAD: rows 80 bytes apart, no bank conflicts

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (std::is_same<T, __half>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <typename T, bool VEC>
__device__ __forceinline__ void fill(T (*dst)[TBK + PAD], int rows, int k0, const Args& a,
                                     const T* src, long long row0, bool x_rows) {
    constexpr int E = VEC ? 8 : 1;  // elements a load
    for (int i = threadIdx.x; i < rows * TBK / E; i += blockDim.x) {
        const int r = i / (TBK / E), kk = (i % (TBK / E)) * E;
        const long long m = row0 + r;
        const bool in = x_rows ? m < a.M : true;
        const T* p = x_rows ? src + (m / a.S) * a.xb + (m % a.S) * a.xs : src + r * a.wn;
        const long long step = x_rows ? a.xk : a.wk;
        if (VEC) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (in && k0 + kk < a.K) v = *reinterpret_cast<const uint4*>(p + k0 + kk);
            *reinterpret_cast<uint4*>(&dst[r][kk]) = v;
        } else {
            dst[r][kk] = in && k0 + kk < a.K ? p[(long long)(k0 + kk) * step] : from_f32<T>(0.f);
        }
    }
}

template <typename T, int NT, bool VEC>
__global__ void __launch_bounds__(128) qkv_rotary_mma(const T* __restrict__ x,
                                                      const T* __restrict__ w,
                                                      const T* __restrict__ bias,
                                                      const T* __restrict__ cos_t,
                                                      const T* __restrict__ sin_t,
                                                      T* __restrict__ out, Args a) {
    __shared__ __align__(16) T xs[TBM][TBK + PAD];
    __shared__ __align__(16) T ws[NT * 8][TBK + PAD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long long m0 = (long long)blockIdx.x * TBM;
    const int head = blockIdx.y, r0 = warp * 16 + g;
    float acc[NT][4] = {};
    for (int k0 = 0; k0 < a.K; k0 += TBK) {
        fill<T, VEC>(xs, TBM, k0, a, x, m0, true);
        fill<T, VEC>(ws, NT * 8, k0, a, w + (long long)head * a.D * a.wn, 0, false);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            const uint32_t fa[4] = {*reinterpret_cast<const uint32_t*>(&xs[r0][kk + 2 * t]),
                                    *reinterpret_cast<const uint32_t*>(&xs[r0 + 8][kk + 2 * t]),
                                    *reinterpret_cast<const uint32_t*>(&xs[r0][kk + 2 * t + 8]),
                                    *reinterpret_cast<const uint32_t*>(
                                        &xs[r0 + 8][kk + 2 * t + 8])};
#pragma unroll
            for (int n = 0; n < NT; ++n)
                mma16816<T>(acc[n], fa,
                            *reinterpret_cast<const uint32_t*>(&ws[8 * n + g][kk + 2 * t]),
                            *reinterpret_cast<const uint32_t*>(&ws[8 * n + g][kk + 2 * t + 8]));
        }
        __syncthreads();
    }
    const bool rotate = head < a.rot_heads;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const long long m = m0 + r0 + 8 * rr;
        if (m >= a.M) continue;
        const int s = (int)(m % a.S);
        T* o = out + (m * a.heads + head) * a.D;
#pragma unroll
        for (int n = 0; n < NT / 2; ++n)
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const int j = 8 * n + 2 * t + cc;
                store_pair(o, acc[n][2 * rr + cc], acc[n + NT / 2][2 * rr + cc], j, head, s,
                           rotate, bias, cos_t, sin_t, a);
            }
    }
}

template <typename T, int NT>
int launch_mma(const void* x, const void* w, const void* bias, const void* c, const void* s,
               void* out, const Args& a, bool vec, cudaStream_t stream) {
    const dim3 grid((unsigned)((a.M + TBM - 1) / TBM), (unsigned)a.heads);
    if (vec)
        qkv_rotary_mma<T, NT, true><<<grid, 128, 0, stream>>>(
            (const T*)x, (const T*)w, (const T*)bias, (const T*)c, (const T*)s, (T*)out, a);
    else
        qkv_rotary_mma<T, NT, false><<<grid, 128, 0, stream>>>(
            (const T*)x, (const T*)w, (const T*)bias, (const T*)c, (const T*)s, (T*)out, a);
    return (int)cudaGetLastError();
}

template <typename T>
int launch(const void* x, const void* w, const void* bias, const void* c, const void* s,
           void* out, const Args& a, cudaStream_t stream) {
    if constexpr (sizeof(T) == 2) {
        const auto aligned = [](const void* p) { return ((uintptr_t)p & 15) == 0; };
        const bool vec = a.xk == 1 && a.wk == 1 && a.K % 8 == 0 && a.xb % 8 == 0 &&
                         a.xs % 8 == 0 && a.wn % 8 == 0 && aligned(x) && aligned(w);
        switch (a.D) {  // the head dims of real models; others take the CUDA-core kernel
#define AK_MMA(D) case D: return launch_mma<T, D / 8>(x, w, bias, c, s, out, a, vec, stream);
            AK_MMA(16) AK_MMA(32) AK_MMA(64) AK_MMA(80) AK_MMA(96) AK_MMA(128) AK_MMA(256)
#undef AK_MMA
        }
    }
    const dim3 grid((unsigned)((a.M + BM - 1) / BM), (unsigned)a.heads);
    qkv_rotary<T><<<grid, 256, 0, stream>>>((const T*)x, (const T*)w, (const T*)bias,
                                            (const T*)c, (const T*)s, (T*)out, a);
    return (int)cudaGetLastError();
}

// dtype: 0 float32, 1 float16, 2 bfloat16 (cuda_build.DTYPE_CODES); bias may be null.
extern "C" int qkv_rotary(const void* x, const void* w, const void* bias, const void* c,
                          const void* s, void* out, long long M, int S, int K, int D, int heads,
                          int rot_heads, long long xb, long long xs, long long xk, long long wn,
                          long long wk, long long ts, long long td, int dtype,
                          cudaStream_t stream) {
    const Args a{M, xb, xs, xk, wn, wk, ts, td, S, K, D, heads, rot_heads};
    switch (dtype) {
        case 0: return launch<float>(x, w, bias, c, s, out, a, stream);
        case 1: return launch<__half>(x, w, bias, c, s, out, a, stream);
        case 2: return launch<__nv_bfloat16>(x, w, bias, c, s, out, a, stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


def kernel_fn(x, w_qkv, cos, sin, kv_heads, bias=None):
    B, S, K = x.shape
    D = 2 * cos.shape[-1]
    if D > 256 or w_qkv.shape[0] % D or cos.stride() != sin.stride():
        raise ValueError(f"head dim {D} (at most 256) must divide w_qkv's {w_qkv.shape[0]} rows, "
                         "and cos and sin must share strides")
    heads = w_qkv.shape[0] // D
    out = torch.empty((B, S, heads, D), dtype=x.dtype, device=x.device)
    if out.numel():
        _lib.qkv_rotary(x, w_qkv, bias, cos, sin, out, B * S, S, K, D, heads, heads - kv_heads,
                        x.stride(0), x.stride(1), x.stride(2), *w_qkv.stride(), *cos.stride(),
                        x.dtype)
    return out
