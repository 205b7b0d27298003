"""
An attention layer's q/k/v projections as one GEMM with rotary embedding on q and k in its
epilogue, in CUDA C++. Starter kernel for AutoKernel (BACKEND = "cuda"):
    qkv[b, s, h, :] = x[b, s, :] @ w_qkv[h*D:(h+1)*D, :]^T (+ bias), heads h < Hq + Hkv rotated:
    out[..., :D/2] = x1 cos[s] - x2 sin[s],  out[..., D/2:] = x2 cos[s] + x1 sin[s]
x [B, S, K] and w_qkv [(Hq + 2 Hkv) * D, K] of any strides, cos/sin [S, D/2]; the output is a
new contiguous [B, S, Hq + 2 Hkv, D] in x's dtype (q heads, k heads, v heads), fp32 math.

Three kernels, picked per call:
  * Hopper (sm_90a), fp16/bf16, a head dim dividing 256 (16 to 256), x's rows and w_qkv's rows
    TMA-describable (unit last stride, 16-byte aligned): the matmul starter's warp-specialized
    TMA + wgmma mainloop, persistent (warpgroup 0 loads 128x64 tiles of x and 256x64 tiles of
    w_qkv into a 4-stage ring; warpgroups 1 and 2 each issue wgmma.m64n256k16 for 64 rows).
    In a thread's wgmma accumulator, column c + D/2 is the same thread's value i + D/4 when c is
    its value i (tiles hold whole heads): the bias and rotation are FMAs on its own registers
    before the tile leaves through shared memory (stmatrix) and TMA stores.
  * other fp16/bf16 (sm_80, D = 80 or 96, unaligned rows): tensor cores by mma.sync.m16n8k16.
    4 warps own 64 positions of one head, each warp 16 rows by all D columns as D/8 tiles; a
    lane holds rows g and g + 8, columns 2t and 2t + 1 of every tile (g = lane / 4, t = lane %
    4), so the head's tiles n and n + D/16 give it both elements of its rotation pairs. K
    advances 32 at a time through shared memory (16-byte loads where rows are aligned; rows
    padded to 80 bytes: no bank conflicts).
  * everything else (fp32, other head dims): CUDA-core FMAs, 64 positions by one head a block,
    each thread 4 rows by 8 pairs (j, j + D/2) in fp32 registers.

On the H100 at the compact LLaMA's shape (the gate, fp16): 108 us, 5.7x eager (620: cuBLAS's
GEMM, then eager rotary), 1.41x torch.compile (152); the mma.sync kernel there ran 715 us (no
pipelining: each k-step loads, syncs, multiplies; 128x128 tiles were slower, 770), the
CUDA-core kernel 10.1 ms. GPU time (bf16): 112 us against the Triton starter's Gluon kernel's
95. Things to try: the cos/sin loads in pairs (4 bytes) where the
tables' rows are contiguous, 128x128 tiles for N that leaves a 256-wide last column half empty
(Qwen2-0.5B's 1152: 52 us against the Gluon kernel's 35), cp.async double buffering and
ldmatrix for the mma.sync kernel.

Usage:
  uv run bench.py --kernel kernels/cuda/qkv_rotary.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "qkv_rotary"
BACKEND = "cuda"

CUDA_SRC = r"""
#include <cuda.h>
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

// the CUDA-core kernel: SBM positions by one head a block, K in steps of SBK
constexpr int SBM = 64, SBK = 16, ROWS = 4, PAIRS = 8, DMAX = 256;

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
    __shared__ float xs[SBK][SBM];
    __shared__ float ws[SBK][DMAX];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16, half = a.D / 2;
    const long long m0 = (long long)blockIdx.x * SBM;
    const int head = blockIdx.y;
    const T* wh = w + (long long)head * a.D * a.wn;
    float acc1[ROWS][PAIRS] = {}, acc2[ROWS][PAIRS] = {};
    for (int k0 = 0; k0 < a.K; k0 += SBK) {
        for (int i = threadIdx.x; i < SBK * SBM; i += blockDim.x) {  // x tile, transposed
            const int r = i / SBK, kk = i % SBK;
            const long long m = m0 + r;
            float v = 0.f;
            if (m < a.M && k0 + kk < a.K)
                v = to_f32(x[(m / a.S) * a.xb + (m % a.S) * a.xs + (long long)(k0 + kk) * a.xk]);
            xs[kk][r] = v;
        }
        for (int i = threadIdx.x; i < SBK * a.D; i += blockDim.x) {  // this head's weight rows
            const int d = i / SBK, kk = i % SBK;
            ws[kk][d] = k0 + kk < a.K ? to_f32(wh[d * a.wn + (long long)(k0 + kk) * a.wk]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SBK; ++kk) {
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


// ---------------------------------------------------------------------------------------------
// Hopper (sm_90a): the matmul starter's warp-specialized TMA + wgmma mainloop (persistent, one
// block of three warpgroups per SM; warpgroup 0 loads 128x64 tiles of x and 256x64 tiles of
// w_qkv into a 4-stage ring, warpgroups 1 and 2 each multiply 64 rows by the 256 columns with
// wgmma.m64n256k16), this type's epilogue, and the output stored with TMA in 64x64 slices.
// A thread's accumulator value i sits at row 16 * warp + lane / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (lane % 4) + i % 2: column c + D/2 is value i + D/4 of the same thread, so the
// rotation pairs a thread's own registers.
// ---------------------------------------------------------------------------------------------
namespace hopper {
constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
constexpr uint32_t A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, C_BYTES = 64 * 64 * 2;
// the stages, 2 x 2 output slices, two barriers a stage, and room to align to 1024 bytes
constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 4 * C_BYTES + 2 * STAGES * 8 + 1024;
static_assert(SMEM <= 227 * 1024, "more shared memory than a Hopper block may have");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int c1, uint32_t src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 :: "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>  // this thread's bulk stores, all but the newest N, are done reading
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
__device__ __forceinline__ void fence_async_shared() {  // smem writes seen by the TMA engine
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void warpgroup_sync(int id) {  // named barrier over one warpgroup
    asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory");
}
// Four 8x8 b16 matrices to shared memory: register q holds the thread's pair of matrix q; lane
// l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {  // lo in the low 16 bits
    T two[2] = {from_f32<T>(lo), from_f32<T>(hi)};
    return *reinterpret_cast<uint32_t*>(two);
}
// A shared-memory matrix descriptor for a 128-byte-swizzled tile: start address, leading and
// stride byte offsets (all >> 4), swizzle mode 1 in bits 62-63.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
#define AK_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                   "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define AK_ACC64(i) AK_ACC8(i), AK_ACC8(i + 8), AK_ACC8(i + 16), AK_ACC8(i + 24), \
                    AK_ACC8(i + 32), AK_ACC8(i + 40), AK_ACC8(i + 48), AK_ACC8(i + 56)
#define AK_REGS128 "{" \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, " \
    "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
    "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, " \
    "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, " \
    "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, " \
    "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, " \
    "%120, %121, %122, %123, %124, %125, %126, %127" "}"
#define AK_WGMMA_N256(TYPE) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " AK_REGS128 \
                 ", %128, %129, p, 1, 1, 0, 0;\n}\n" \
                 : AK_ACC64(0), AK_ACC64(64) : "l"(da), "l"(db), "r"(1) : "memory")
// D (64x256 fp32, this warpgroup's registers) += A (64x16, smem) * B^T (B: 256x16, K-major)
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
    if constexpr (std::is_same<T, __half>::value) AK_WGMMA_N256("f16");
    else AK_WGMMA_N256("bf16");
}

// Tile index -> (tile row, tile column), walking 8 tile rows column by column: the blocks in
// flight read few distinct x row-panels and w column-panels (L2 reuse).
__device__ __forceinline__ void tile_of(int tile, int tiles_m, int tiles_n, int& pm, int& pn) {
    constexpr int GROUP_M = 8;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (tile / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (tile % per_group) % rows;
    pn = (tile % per_group) / rows;
}

// The epilogue on a warpgroup's 64 x 256 accumulators (HD divides 256, so each head's columns
// are whole in the tile): bias, then each q/k head's pairs (j, j + HD/2) rotated by the row's
// position. `row` is the thread's first row (its second is row + 8).
template <typename T, int HD>
__device__ __forceinline__ void rotate(float (&acc)[BN / 2], int row, int n0, int lane,
                                       const T* bias, const T* cos_t, const T* sin_t,
                                       const Args& a) {
    const int n_cols = a.heads * HD;
    const long long pos[2] = {row % a.S, (row + 8) % a.S};
    if (bias != nullptr) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int col = n0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
            if (col < n_cols) acc[i] += to_f32(bias[col]);
        }
    }
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
        if ((8 * (i / 4)) % HD >= HD / 2) continue;  // a second half: its pair's partner
        if ((n0 + 8 * (i / 4)) / HD >= a.rot_heads) continue;  // a v head
        const int j = (8 * (i / 4)) % HD + 2 * (lane % 4) + i % 2;
        const long long t = pos[(i / 2) % 2] * a.ts + j * a.td;
        const float c = to_f32(cos_t[t]), sn = to_f32(sin_t[t]);
        const float v1 = acc[i], v2 = acc[i + HD / 4];
        acc[i] = v1 * c - v2 * sn;
        acc[i + HD / 4] = v2 * c + v1 * sn;
    }
}
}  // namespace hopper

template <typename T, int HD>
__global__ void __launch_bounds__(hopper::THREADS, 1)
qkv_rotary_wgmma(const __grid_constant__ CUtensorMap tmX, const __grid_constant__ CUtensorMap tmW,
                 const __grid_constant__ CUtensorMap tmO, const T* __restrict__ bias,
                 const T* __restrict__ cos_t, const T* __restrict__ sin_t, Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace hopper;
    extern __shared__ uint8_t smem[];
    const uint32_t base = (smem_addr(smem) + 1023) & ~1023u;  // 128B swizzle: 1024B-aligned tiles
    const uint32_t sA = base, sB = base + STAGES * A_BYTES, sC = sB + STAGES * B_BYTES;
    const uint32_t bars = sC + 4 * C_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const int M = (int)a.M, N = a.heads * HD;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int KT = (a.K + BK - 1) / BK;
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);   // the producer's arrive; the TMA bytes complete it
            mbar_init(empty(s), 8);  // one arrive per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            int it = 0;
            for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
                int pm, pn;
                tile_of(tile, tiles_m, tiles_n, pm, pn);
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);  // first round: at once
                    mbar_expect_tx(full(s), A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, &tmX, kt * BK, pm * BM, full(s));
                    tma_load_2d(sB + s * B_BYTES, &tmW, kt * BK, pn * BN, full(s));
                }
            }
        }
    } else {  // consumers: warpgroup 1 rows 0-63 of each tile, warpgroup 2 rows 64-127
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, warp = (threadIdx.x % 128) / 32;
        const bool leader = threadIdx.x % 128 == 0;  // issues and waits for the stores
        int it = 0, slices = 0;
        for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
            int pm, pn;
            tile_of(tile, tiles_m, tiles_n, pm, pn);
            const int m0 = pm * BM, n0 = pn * BN;
            float acc[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(full(s), (it / STAGES) & 1);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk)  // a k-step is 32 bytes into 128-byte rows
                    wgmma_m64n256k16<T>(acc, desc(sA + s * A_BYTES + cw * 64 * 128 + kk * 32,
                                                  16, 1024),
                                        desc(sB + s * B_BYTES + kk * 32, 16, 1024));
                wgmma_commit();
                wgmma_wait<1>();  // the MMAs of the k-tile before are done: release its stage
                if (kt > 0 && lane == 0) mbar_arrive(empty((it - 1) % STAGES));
            }
            wgmma_wait<0>();
            if (KT > 0 && lane == 0) mbar_arrive(empty((it - 1) % STAGES));  // the tile's last
            if (m0 + cw * 64 >= M) continue;  // none of this warpgroup's rows are in the output
            rotate<T, HD>(acc, m0 + cw * 64 + warp * 16 + lane / 4, n0, lane, bias, cos_t, sin_t,
                          a);
            // 64-column slices through shared memory (two buffers a warpgroup, in the 128-byte
            // swizzle the TMA box wants: chunk c of row r at c ^ (r % 8)), stored by TMA, which
            // clips rows and columns past the output.
            const int r = warp * 16 + lane % 16;  // the row this lane's stmatrix addresses are in
#pragma unroll
            for (int sl = 0; sl < BN / 64; ++sl) {
                if (n0 + 64 * sl >= N) break;
                const uint32_t buf = sC + (2 * cw + slices++ % 2) * C_BYTES;
                if (leader) bulk_wait_read<1>();  // the store that read buf last is done with it
                warpgroup_sync(1 + cw);
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    uint32_t v[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int i = 32 * sl + 4 * j + 2 * q;
                        v[q] = pack2<T>(acc[i], acc[i + 1]);
                    }
                    stmatrix_x4(buf + r * 128 + (((j + lane / 16) ^ (r % 8)) << 4), v);
                }
                fence_async_shared();
                warpgroup_sync(1 + cw);  // the whole slice is written
                if (leader) {
                    tma_store_2d(&tmO, n0 + 64 * sl, m0 + cw * 64, buf);
                    bulk_commit();
                }
            }
        }
        if (leader) bulk_wait_read<0>();  // shared memory outlives the stores' reads
    }
#endif
}

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, found at run time (no link against libcuda).
static EncodeTiled encode_tiled() {
    static EncodeTiled fn = nullptr;
    if (fn == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status;
#if CUDART_VERSION >= 12050
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &status);
#else
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &status);
#endif
        fn = (EncodeTiled)p;
    }
    return fn;
}

// A 2-D map over a row-major [rows, cols] matrix (row stride ld elements), 128-byte swizzled
// boxes of box_rows x box_cols; out-of-range elements read as zeros and are not stored.
template <typename T>
static bool make_map(CUtensorMap* map, const void* ptr, long long rows, long long cols,
                     long long ld, int box_cols, int box_rows) {
    EncodeTiled encode = encode_tiled();
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)(ld * sizeof(T))};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    const cuuint32_t elem[2] = {1, 1};
    const CUtensorMapDataType type = std::is_same<T, __half>::value
                                         ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return encode(map, type, 2, const_cast<void*>(ptr), dims, strides, box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
           CUDA_SUCCESS;
}

// Opt a kernel in to more than 48 KB of dynamic shared memory, once per kernel and device (the
// attribute persists; a CUDA graph being captured then never sees the call).
static void allow_smem(const void* kernel, int bytes) {
    static const void* done[64];
    static int devices[64], count = 0;
    int device = 0;
    cudaGetDevice(&device);
    for (int i = 0; i < count; ++i)
        if (done[i] == kernel && devices[i] == device) return;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (count < 64) {
        done[count] = kernel;
        devices[count++] = device;
    }
}

static bool aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

static int sm_count() {  // of the current device, asked once per device
    static int counts[64] = {};
    int device = 0;
    cudaGetDevice(&device);
    if (device < 64 && counts[device] == 0)
        cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device);
    return device < 64 && counts[device] > 0 ? counts[device] : 132;
}

// The Hopper kernel where TMA can describe x as [M, K] rows and w as [N, K] rows (unit last
// strides, 16-byte aligned rows and bases; x's batches one after another) and the head dim
// divides the 256-column tile; false otherwise (the caller takes the mma.sync kernel).
template <typename T, int HD>
static bool launch_wgmma(const void* x, const void* w, const void* bias, const void* c,
                         const void* s, void* out, const Args& a, cudaStream_t stream) {
    using namespace hopper;
    const long long N = (long long)a.heads * HD;
    if (a.xk != 1 || a.wk != 1 || (a.M > a.S && a.xb != a.S * a.xs) || (a.xs * 2) % 16 ||
        (a.wn * 2) % 16 || a.K % 8 || !aligned16(x) || !aligned16(w) || !aligned16(out) ||
        a.M > 0x7fffffff)
        return false;
    CUtensorMap tx, tw, to;
    if (!make_map<T>(&tx, x, a.M, a.K, a.xs, BK, BM) || !make_map<T>(&tw, w, N, a.K, a.wn, BK, BN)
        || !make_map<T>(&to, out, a.M, N, N, 64, 64))
        return false;
    allow_smem((const void*)qkv_rotary_wgmma<T, HD>, SMEM);
    const long long tiles = ((a.M + BM - 1) / BM) * ((N + BN - 1) / BN);
    const unsigned grid = (unsigned)(tiles < sm_count() ? tiles : sm_count());
    qkv_rotary_wgmma<T, HD><<<grid, THREADS, SMEM, stream>>>(
        tx, tw, to, (const T*)bias, (const T*)c, (const T*)s, a);
    return true;
}

template <typename T>
int launch(const void* x, const void* w, const void* bias, const void* c, const void* s,
           void* out, const Args& a, cudaStream_t stream) {
    if constexpr (sizeof(T) == 2) {
#if AUTOKERNEL_SM == 90
        switch (a.D) {  // head dims that divide the Hopper kernel's 256-column tiles
#define AK_WGMMA(D) case D: \
    if (launch_wgmma<T, D>(x, w, bias, c, s, out, a, stream)) return (int)cudaGetLastError(); \
    break;
            AK_WGMMA(16) AK_WGMMA(32) AK_WGMMA(64) AK_WGMMA(128) AK_WGMMA(256)
#undef AK_WGMMA
        }
#endif
        const bool vec = a.xk == 1 && a.wk == 1 && a.K % 8 == 0 && a.xb % 8 == 0 &&
                         a.xs % 8 == 0 && a.wn % 8 == 0 && aligned16(x) && aligned16(w);
        switch (a.D) {  // the head dims of real models; others take the CUDA-core kernel
#define AK_MMA(D) case D: return launch_mma<T, D / 8>(x, w, bias, c, s, out, a, vec, stream);
            AK_MMA(16) AK_MMA(32) AK_MMA(64) AK_MMA(80) AK_MMA(96) AK_MMA(128) AK_MMA(256)
#undef AK_MMA
        }
    }
    const dim3 grid((unsigned)((a.M + SBM - 1) / SBM), (unsigned)a.heads);
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
