"""
Fused SwiGLU MLP, out = (silu(x w_gate^T) * (x w_up^T)) w_down^T, in CUDA C++. Starter kernel for
AutoKernel (BACKEND = "cuda"). Shapes: x[M,D], w_gate/w_up[F,D], w_down[D,F] (nn.Linear weights)
-> out[M,D]; residual[M,D], when given, is added to out (a block's `x + mlp(norm(x))`).

Two launches of one GEMM kernel family:
  1. GATED: each block computes the same tile of x w_gate^T and x w_up^T from one x tile (two
     fp32 accumulators, x read once for both), applies silu(g) * u in registers and writes
     h[M,F] once, in x's dtype (as eager keeps it; the gate math runs in fp32 before that
     rounding). Eager writes gate and up and reads them back for silu and the product: several
     extra passes over an [M,F] tensor that never happen here. h's rows are padded to a
     multiple of 8 elements, so the second GEMM reads 16-byte aligned rows whatever F is.
  2. h @ w_down^T, the same kernel with one B operand; then the residual, when there is one, in
     a pass of its own (out += residual, each rounded to x's dtype: one rounding more than the
     reference's, well inside the tolerance).
Every B operand is an nn.Linear weight [N, K]: K-major, the layout both mma.sync and wgmma
read without a transpose.

Three kernels, as in kernels/cuda/matmul.py (`path` overrides the choice):
  * Hopper (sm_90a), fp16/bf16, 16-byte aligned rows: warp-specialized TMA + wgmma, persistent
    (one block per SM walking tiles; the next tile's loads overlap this one's epilogue). One
    producer warpgroup streams 128x64 tiles of x and two 128x64 tiles of weights (gate and up,
    or two halves of w_down) into a 4-stage shared-memory ring guarded by mbarriers; two
    consumer warpgroups each own 64 rows and keep 128 fp32 accumulators a thread: gated, two
    wgmma.m64n128k16 a k-step (gate and up); down, one wgmma.m64n256k16 over both halves of
    w_down's tile (256 consecutive K-major rows), so the x tile is read once a k-step. Block
    tiles: 128x128 of h (gated), 128x256 of out. The epilogue rounds silu(g) * u (or out) to
    x's dtype and writes each 64x64 slice of a consumer's rows to shared memory (stmatrix, in
    the 128-byte swizzle: no bank conflicts), from where one thread stores it with TMA (whole
    128-byte rows, rows and columns past h / out clipped); each consumer has two slice buffers,
    so a slice's store runs while the next is written (out rows not 16-byte aligned, D not a
    multiple of 8: 4-byte stores from the registers).
  * sm_80 and newer, fp16/bf16, aligned: mma.sync.m16n8k16 with a 3-stage cp.async pipeline and
    ldmatrix from XOR-swizzled shared memory; 128x64 (gated) or 128x128 tiles, 8 warps.
  * everything else (fp32, unaligned rows such as D = 1023): CUDA-core FMA, 128x128 tiles of 8x8
    outputs a thread.

Things to try: 256-wide gated tiles (4 accumulator sets need the registers of a third consumer
warpgroup), fusing the down projection per row block, the residual added in the down GEMM's
epilogue (kernels/cuda/matmul.py's Epilogue) instead of its own pass.

Usage:
  uv run bench.py --kernel kernels/cuda/fused_mlp.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "fused_mlp"
BACKEND = "cuda"

PATHS = {"auto": 0, "wgmma": 1, "mma": 2, "simt": 3}

CUDA_SRC = r"""
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

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

// silu(g) * u = g / (1 + exp(-g)) * u; exp(-g) = inf for g << 0 gives -0, not NaN.
__device__ __forceinline__ float silu_times(float g, float u) {
    return g / (1.f + __expf(-g)) * u;
}

// Tile index -> (tile row, tile column), walking GROUP_M tile rows column by column: the tiles
// in flight at once read few distinct row-panels of x and of the weights (L2 reuse).
__device__ __forceinline__ void tile_of(int tile, int tiles_m, int tiles_n, int& pm, int& pn) {
    constexpr int GROUP_M = 8;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (tile / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (tile % per_group) % rows;
    pn = (tile % per_group) / rows;
}

// C[row, col] and C[row, col + 1], each only if inside C. PAIR: one 4-byte store.
template <typename T>
__device__ __forceinline__ void store_pair(T* C, int M, int N, long long ldc, int row, int col,
                                           float v0, float v1, bool pair) {
    if (row >= M || col >= N) return;
    T* p = C + (long long)row * ldc + col;
    if (pair && col + 1 < N) {
        T two[2] = {from_f32<T>(v0), from_f32<T>(v1)};
        *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<uint32_t*>(two);
    } else {
        p[0] = from_f32<T>(v0);
        if (col + 1 < N) p[1] = from_f32<T>(v1);
    }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// ---------------------------------------------------------------------------------------------
// CUDA-core kernel: C = A W1^T, or silu(A W1^T) * (A W2^T) when DUAL; any dtype and strides.
// 256 threads, a 128x128 tile, 8x8 outputs a thread at rows ty + 16 i and columns tx + 16 j.
// ---------------------------------------------------------------------------------------------
template <typename T, bool DUAL>
__global__ void __launch_bounds__(256)
gemm_simt(const T* __restrict__ A, const T* __restrict__ W1, const T* __restrict__ W2,
          T* __restrict__ C, int M, int N, int K, long long sam, long long sak, long long swn,
          long long swk, long long ldc) {
    constexpr int BM = 128, BN = 128, BK = 8;
    __shared__ float As[BK][BM], Bs[DUAL ? 2 : 1][BK][BN];
    int pm, pn;
    tile_of(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    float acc[DUAL ? 2 : 1][8][8] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // 1024 elements of each tile, 4 a thread
            const int e = tid + 256 * r, row = e / BK, kk = e % BK;  // consecutive threads walk k
            const int gm = m0 + row, gn = n0 + row, gk = k0 + kk;
            As[kk][row] = gm < M && gk < K ? to_f32(A[gm * sam + gk * sak]) : 0.f;
            Bs[0][kk][row] = gn < N && gk < K ? to_f32(W1[gn * swn + gk * swk]) : 0.f;
            if (DUAL)  // (the index is 0 where the branch is compiled out)
                Bs[DUAL ? 1 : 0][kk][row] =
                    gn < N && gk < K ? to_f32(W2[gn * swn + gk * swk]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] = As[k][ty + 16 * i];
#pragma unroll
            for (int o = 0; o < (DUAL ? 2 : 1); ++o) {
                float b[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) b[j] = Bs[o][k][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[o][i][j] = fmaf(a[i], b[j], acc[o][i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = m0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int col = n0 + tx + 16 * j;
            if (row < M && col < N) {
                const float v =
                    DUAL ? silu_times(acc[0][i][j], acc[DUAL ? 1 : 0][i][j]) : acc[0][i][j];
                C[(long long)row * ldc + col] = from_f32<T>(v);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mma.sync kernel (sm_80+), half precision, rows 16-byte aligned and K a multiple of 8.
// Shared B tile: 128 rows of [n][k]; DUAL: rows 0-63 from W1 and 64-127 from W2 (the same 64
// columns of C), else 128 rows of W1.
// ---------------------------------------------------------------------------------------------
namespace mma {
constexpr int BM = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int A_CHUNKS = BM * BK / 8, B_CHUNKS = 128 * BK / 8;  // 16-byte chunks per stage
constexpr int SMEM = STAGES * (A_CHUNKS + B_CHUNKS) * 16;

// The 16-byte slot of chunk `c` of row `r` in a tile with 8 chunks a row (XOR swizzle).
__device__ __forceinline__ int slot(int r, int c) { return r * 8 + (c ^ (r & 7)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");  // 0 bytes: zero fill
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (std::is_same<T, __half>::value) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
}  // namespace mma

template <typename T, bool DUAL>
__global__ void __launch_bounds__(mma::THREADS)
gemm_mma(const T* __restrict__ A, const T* __restrict__ W1, const T* __restrict__ W2,
         T* __restrict__ C, int M, int N, int K, long long lda, long long ldw, long long ldc,
         bool pair) {
    using namespace mma;
    constexpr int BN = DUAL ? 64 : 128;  // columns of C a block
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sA = smem_addr(smem), sB = sA + STAGES * A_CHUNKS * 16;
    int pm, pn;
    tile_of(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp % 2, wn = warp / 2;  // 64 rows x (BN / 4) columns of C a warp

    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
        const uint32_t a_base = sA + stage * A_CHUNKS * 16, b_base = sB + stage * B_CHUNKS * 16;
#pragma unroll
        for (int i = 0; i < A_CHUNKS / THREADS; ++i) {
            const int q = tid + i * THREADS, r = q / 8, c = q % 8;
            const bool ok = m0 + r < M && k0 + c * 8 < K;
            const T* src = ok ? A + (long long)(m0 + r) * lda + k0 + c * 8 : A;
            cp_async16(a_base + slot(r, c) * 16, src, ok);
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS / THREADS; ++i) {
            const int q = tid + i * THREADS, r = q / 8, c = q % 8;
            const T* W = DUAL && r >= 64 ? W2 : W1;
            const int n = n0 + (DUAL ? r % 64 : r);
            const bool ok = n < N && k0 + c * 8 < K;
            const T* src = ok ? W + (long long)n * ldw + k0 + c * 8 : W;
            cp_async16(b_base + slot(r, c) * 16, src, ok);
        }
    };

    // acc[o][i][j]: operand o (DUAL: gate, up; else: the warp's left and right 16 columns),
    // m16 tile i, n8 tile j.
    float acc[2][4][2][4] = {};
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        const int stage = kt % STAGES;
        const uint32_t a_base = sA + stage * A_CHUNKS * 16, b_base = sB + stage * B_CHUNKS * 16;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t a[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                ldmatrix_x4(a[i],
                            a_base + slot(wm * 64 + i * 16 + lane % 16, kk * 2 + lane / 16) * 16);
#pragma unroll
            for (int o = 0; o < 2; ++o) {
                // the 16 shared rows of this warp's operand o: two n8 tiles, both k halves
                const int first = DUAL ? o * 64 + wn * 16 : wn * 32 + o * 16;
                uint32_t b[4];
                ldmatrix_x4(b, b_base + slot(first + lane % 8 + 8 * (lane / 16),
                                             kk * 2 + (lane / 8) % 2) * 16);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    mma16816<T>(acc[o][i][0], a[i], b[0], b[1]);
                    mma16816<T>(acc[o][i][1], a[i], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int row = m0 + wm * 64 + i * 16 + g;
            if (DUAL) {
                const int col = n0 + wn * 16 + j * 8 + 2 * t;
                const float* gv = acc[0][i][j];
                const float* uv = acc[1][i][j];
                store_pair(C, M, N, ldc, row, col, silu_times(gv[0], uv[0]),
                           silu_times(gv[1], uv[1]), pair);
                store_pair(C, M, N, ldc, row + 8, col, silu_times(gv[2], uv[2]),
                           silu_times(gv[3], uv[3]), pair);
            } else {
#pragma unroll
                for (int o = 0; o < 2; ++o) {
                    const int col = n0 + wn * 32 + o * 16 + j * 8 + 2 * t;
                    const float* v = acc[o][i][j];
                    store_pair(C, M, N, ldc, row, col, v[0], v[1], pair);
                    store_pair(C, M, N, ldc, row + 8, col, v[2], v[3], pair);
                }
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Hopper kernel: TMA + mbarriers + wgmma, warp-specialized. B stage: two 128-row K-major tiles
// (DUAL: the gate and up weights at the same columns; else two halves of a 256-wide tile, one
// after the other: 256 rows of 128 bytes, which one n256 descriptor reads).
// ---------------------------------------------------------------------------------------------
namespace hopper {
constexpr int BM = 128, BK = 64, STAGES = 4, THREADS = 384;
constexpr uint32_t A_BYTES = BM * BK * 2, B_HALF = 128 * BK * 2, B_BYTES = 2 * B_HALF;
// C leaves through shared memory in 64x64 slices (one TMA box: 64 rows of 128 bytes), two
// buffers per consumer warpgroup used in turn: one is written while the other's TMA store reads
// it. A whole 64x256 band per warpgroup (64 KB for the two) would cost a stage of the ring
// (4 x 48 KB).
constexpr uint32_t C_BYTES = 64 * 64 * 2;
// the stages, C's 2 x 2 slices, the stages' two barriers each, and room to align to 1024 bytes
constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 4 * C_BYTES + 2 * STAGES * 8 + 1024;
static_assert(SMEM <= 227 * 1024, "more shared memory than a Hopper block may have");

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
// This thread's bulk stores, all but the newest N, are done reading shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
// This thread's shared-memory writes are seen by the TMA engine (the async proxy).
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Named barrier `id` over one warpgroup (id 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int id) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory");
}
// Four 8x8 b16 matrices to shared memory: register q holds the thread's pair of matrix q (row
// lane / 4, columns 2 (lane % 4) and + 1, the mma accumulator layout); lane l gives the address
// of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {  // lo in the low 16 bits
    T two[2] = {from_f32<T>(lo), from_f32<T>(hi)};
    return *reinterpret_cast<uint32_t*>(two);
}

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled tile: rows of 128 bytes,
// 8-row groups 1024 bytes apart (SBO); the leading offset is unused for this layout.
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
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
#define AK_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
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
#define AK_WGMMA_N128(TYPE) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " AK_REGS64 \
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : AK_ACC64(64 * H) : "l"(da), "l"(db), "r"(1) : "memory")
#define AK_WGMMA_N256(TYPE) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " AK_REGS128 \
                 ", %128, %129, p, 1, 1, 0, 0;\n}\n" \
                 : AK_ACC64(0), AK_ACC64(64) : "l"(da), "l"(db), "r"(1) : "memory")

// D (64x128 fp32: values 64 H to 64 H + 63 of this warpgroup's registers) += A (64x16, smem) *
// B (16x128, smem, K-major).
template <typename T, int H>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[128], uint64_t da, uint64_t db) {
    if constexpr (std::is_same<T, __half>::value) AK_WGMMA_N128("f16");
    else AK_WGMMA_N128("bf16");
}

// D (64x256 fp32, this warpgroup's registers) += A (64x16, smem) * B (16x256, smem, K-major):
// one instruction for the warpgroup's whole row band, so A is read from shared memory once per
// k-step (two n128 instructions read it twice).
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
    if constexpr (std::is_same<T, __half>::value) AK_WGMMA_N256("f16");
    else AK_WGMMA_N256("bf16");
}
}  // namespace hopper

// Persistent: one block per SM walks tiles blockIdx.x, + gridDim.x, ...; the k-tiles of all its
// tiles are one sequence `it` through the stage ring, so the producer fills the next tile's
// first stages while the consumers run this tile's epilogue. tma_c: C leaves through shared
// memory and TMA stores (tmC); else by 4-byte stores from the registers (C's rows not 16-byte
// aligned).
template <typename T, bool DUAL>
__global__ void __launch_bounds__(hopper::THREADS, 1)
gemm_wgmma(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmW1,
           const __grid_constant__ CUtensorMap tmW2, const __grid_constant__ CUtensorMap tmC,
           T* __restrict__ C, int M, int N, int K, long long ldc, bool pair, bool tma_c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace hopper;
    constexpr int BN = DUAL ? 128 : 256;  // columns of C a tile
    extern __shared__ uint8_t smem[];
    const uint32_t base = (smem_addr(smem) + 1023) & ~1023u;  // 128B swizzle: 1024B-aligned tiles
    const uint32_t sA = base, sB = base + STAGES * A_BYTES, sC = sB + STAGES * B_BYTES;
    const uint32_t bars = sC + 4 * C_BYTES;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int KT = (K + BK - 1) / BK;
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
                const int m0 = pm * BM, n0 = pn * BN;
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);  // first round: at once
                    mbar_expect_tx(full(s), A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, &tmA, kt * BK, m0, full(s));
                    tma_load_2d(sB + s * B_BYTES, &tmW1, kt * BK, n0, full(s));
                    if (DUAL) tma_load_2d(sB + s * B_BYTES + B_HALF, &tmW2, kt * BK, n0, full(s));
                    else tma_load_2d(sB + s * B_BYTES + B_HALF, &tmW1, kt * BK, n0 + 128, full(s));
                }
            }
        }
    } else {  // consumers: warpgroup 1 rows 0-63 of each tile, warpgroup 2 rows 64-127
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, warp = (threadIdx.x % 128) / 32;
        const bool leader = threadIdx.x % 128 == 0;  // issues and waits for the C stores
        int it = 0, slices = 0;
        for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
            int pm, pn;
            tile_of(tile, tiles_m, tiles_n, pm, pn);
            const int m0 = pm * BM, n0 = pn * BN;
            // DUAL: gate in values 0-63, up in 64-127 (an n128 layout each); else one n256
            float acc[128];
#pragma unroll
            for (int i = 0; i < 128; ++i) acc[i] = 0.f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(full(s), (it / STAGES) & 1);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    // 64 (A) or 128 / 256 (B) rows of 128 bytes; a k-step is 32 bytes into a row
                    const uint64_t da = desc(sA + s * A_BYTES + cw * 64 * 128 + kk * 32);
                    const uint32_t b = sB + s * B_BYTES + kk * 32;
                    if constexpr (DUAL) {  // gate and up are different matrices: one n128 each
                        wgmma_m64n128k16<T, 0>(acc, da, desc(b));
                        wgmma_m64n128k16<T, 1>(acc, da, desc(b + B_HALF));
                    } else {  // the two halves are 256 consecutive rows
                        wgmma_m64n256k16<T>(acc, da, desc(b));
                    }
                }
                wgmma_commit();
                wgmma_wait<1>();  // the MMAs of the k-tile before are done: release its stage
                if (kt > 0 && lane == 0) mbar_arrive(empty((it - 1) % STAGES));
            }
            wgmma_wait<0>();
            if (KT > 0 && lane == 0) mbar_arrive(empty((it - 1) % STAGES));  // the tile's last
            // Accumulator layout (wgmma m64nN, fp32): value i of a thread sits at row
            // 16 * warp + lane / 4 + 8 * ((i / 2) % 2),
            // column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
            auto value = [&](int i) {  // C at value i's place (i < BN / 2)
                if constexpr (DUAL) return silu_times(acc[i], acc[64 + i]);
                else return acc[i];
            };
            if (!tma_c) {
                const int row = m0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
                for (int i = 0; i < BN / 2; i += 4) {
                    const int col = n0 + (i / 4) * 8 + 2 * (lane % 4);
                    store_pair(C, M, N, ldc, row, col, value(i), value(i + 1), pair);
                    store_pair(C, M, N, ldc, row + 8, col, value(i + 2), value(i + 3), pair);
                }
                continue;
            }
            if (m0 + cw * 64 >= M) continue;  // none of this warpgroup's rows are in C
            // Slice sl (columns 64 sl to 64 sl + 63) goes to the buffer the store before last
            // read, laid out as the TMA box's 128-byte swizzle wants it: 16-byte chunk c of row r
            // at chunk c ^ (r % 8) of the row, so the 8 rows of each 8x8 matrix of a stmatrix
            // fall in 8 different bank groups. Rows and columns past C are clipped by the store.
            const int r = warp * 16 + lane % 16;  // the row this lane's stmatrix addresses are in
#pragma unroll
            for (int sl = 0; sl < BN / 64; ++sl) {
                if (n0 + 64 * sl >= N) break;  // the rest of the tile is past C's last column
                const uint32_t buf = sC + (2 * cw + slices++ % 2) * C_BYTES;
                if (leader) bulk_wait_read<1>();  // the store that read buf last is done with it
                warpgroup_sync(1 + cw);
                // stmatrix q of each j: rows 8 (q % 2) to 8 (q % 2) + 7 of n8 block j + q / 2
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    uint32_t v[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int i = 32 * sl + 4 * j + 2 * q;
                        v[q] = pack2<T>(value(i), value(i + 1));
                    }
                    stmatrix_x4(buf + r * 128 + (((j + lane / 16) ^ (r % 8)) << 4), v);
                }
                fence_async_shared();
                warpgroup_sync(1 + cw);  // the whole slice is written
                if (leader) {
                    tma_store_2d(&tmC, n0 + 64 * sl, m0 + cw * 64, buf);
                    bulk_commit();
                }
            }
        }
        if (leader) bulk_wait_read<0>();  // shared memory outlives the stores' reads
    }
#endif
}

// ---- host side ------------------------------------------------------------------------------

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

enum Path { AUTO = 0, WGMMA = 1, MMA = 2, SIMT = 3 };

// C[M,N] = A W1^T, or silu(A W1^T) * (A W2^T) when W2 is given. A: [M,K] (sam, sak); W1, W2:
// [N,K] (swn, swk), both with the same strides.
template <typename T>
static int gemm(const T* A, const T* W1, const T* W2, T* C, int M, int N, int K, long long sam,
                long long sak, long long swn, long long swk, long long ldc, int path,
                cudaStream_t stream) {
    const bool dual = W2 != nullptr;
    const bool pair = ldc % 2 == 0 && ((uintptr_t)C & 3) == 0;
    const bool tensor_ok = sizeof(T) == 2 && sak == 1 && swk == 1 && aligned16(A) &&
                           aligned16(W1) && (!dual || aligned16(W2)) && (sam * 2) % 16 == 0 &&
                           (swn * 2) % 16 == 0 && K % 8 == 0;
    if (path == AUTO) path = !tensor_ok ? SIMT : AUTOKERNEL_SM == 90 ? WGMMA
                             : AUTOKERNEL_SM >= 80 ? MMA : SIMT;
    if (path != SIMT && (!tensor_ok || (path == WGMMA && AUTOKERNEL_SM != 90) ||
                         AUTOKERNEL_SM < 80))
        return (int)cudaErrorNotSupported;
    if constexpr (sizeof(T) == 2) {
        if (path == WGMMA) {
            using namespace hopper;
            CUtensorMap ta, t1, t2, tc = {};
            const bool ok = make_map<T>(&ta, A, M, K, sam, BK, BM) &&
                            make_map<T>(&t1, W1, N, K, swn, BK, 128) &&
                            make_map<T>(&t2, dual ? W2 : W1, N, K, swn, BK, 128);
            // C's stores go through TMA where its rows are 16-byte aligned: 64x64 boxes
            const bool tma_c = aligned16(C) && (ldc * sizeof(T)) % 16 == 0 &&
                               make_map<T>(&tc, C, M, N, ldc, 64, 64);
            if (ok) {
                const int bn = dual ? 128 : 256;
                const int tiles = ((M + BM - 1) / BM) * ((N + bn - 1) / bn);
                const unsigned grid = (unsigned)(tiles < sm_count() ? tiles : sm_count());
                if (dual) {
                    allow_smem((const void*)gemm_wgmma<T, true>, SMEM);
                    gemm_wgmma<T, true><<<grid, THREADS, SMEM, stream>>>(
                        ta, t1, t2, tc, C, M, N, K, ldc, pair, tma_c);
                } else {
                    allow_smem((const void*)gemm_wgmma<T, false>, SMEM);
                    gemm_wgmma<T, false><<<grid, THREADS, SMEM, stream>>>(
                        ta, t1, t2, tc, C, M, N, K, ldc, pair, tma_c);
                }
                return (int)cudaGetLastError();
            }
            path = MMA;  // the driver could not describe the operands: no TMA
        }
        if (path == MMA) {
            using namespace mma;
            const int bn = dual ? 64 : 128;
            const unsigned tiles = ((M + BM - 1) / BM) * ((N + bn - 1) / bn);
            if (dual) {
                allow_smem((const void*)gemm_mma<T, true>, SMEM);
                gemm_mma<T, true><<<tiles, THREADS, SMEM, stream>>>(A, W1, W2, C, M, N, K, sam,
                                                                    swn, ldc, pair);
            } else {
                allow_smem((const void*)gemm_mma<T, false>, SMEM);
                gemm_mma<T, false><<<tiles, THREADS, SMEM, stream>>>(A, W1, W1, C, M, N, K, sam,
                                                                     swn, ldc, pair);
            }
            return (int)cudaGetLastError();
        }
    }
    const unsigned tiles = ((M + 127) / 128) * ((N + 127) / 128);
    if (dual)
        gemm_simt<T, true><<<tiles, 256, 0, stream>>>(A, W1, W2, C, M, N, K, sam, sak, swn, swk,
                                                      ldc);
    else
        gemm_simt<T, false><<<tiles, 256, 0, stream>>>(A, W1, W1, C, M, N, K, sam, sak, swn, swk,
                                                       ldc);
    return (int)cudaGetLastError();
}

// out[M, D] (contiguous) += R (rows ldr apart), in fp32, one thread an element.
template <typename T>
__global__ void add_residual(T* out, const T* R, long long ldr, int D, long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(R[i / D * ldr + i % D]));
}

template <typename T>
static int mlp(const void* x, const void* wg, const void* wu, const void* wd, const void* R,
               long long ldr, void* h, void* out, int M, int D, int F, const long long* s,
               long long ldh, int path, cudaStream_t stream) {
    // s: strides of x (2), w_gate and w_up (2, shared), w_down (2); h and out are row-major.
    int err = gemm<T>((const T*)x, (const T*)wg, (const T*)wu, (T*)h, M, F, D, s[0], s[1], s[2],
                      s[3], ldh, path, stream);
    if (err) return err;
    err = gemm<T>((const T*)h, (const T*)wd, nullptr, (T*)out, M, D, F, ldh, 1, s[4], s[5], D,
                  path, stream);
    if (err || R == nullptr) return err;
    const long long n = (long long)M * D;
    add_residual<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((T*)out, (const T*)R, ldr,
                                                                     D, n);
    return (int)cudaGetLastError();
}

// h: [M, ldh] scratch (ldh >= F); out: [M, D] contiguous; R: [M, D] rows ldr apart, or null.
// path: 0 auto, 1 wgmma, 2 mma.sync, 3 CUDA cores. dtype: 0 float32, 1 float16, 2 bfloat16
// (cuda_build.DTYPE_CODES).
extern "C" int fused_mlp(const void* x, const void* wg, const void* wu, const void* wd,
                         const void* R, long long ldr, void* h, void* out, int M, int D, int F,
                         long long sxm, long long sxk, long long swn, long long swk,
                         long long sdn, long long sdk, long long ldh, int dtype, int path,
                         cudaStream_t stream) {
    const long long s[6] = {sxm, sxk, swn, swk, sdn, sdk};
    switch (dtype) {
        case 0: return mlp<float>(x, wg, wu, wd, R, ldr, h, out, M, D, F, s, ldh, path, stream);
        case 1: return mlp<__half>(x, wg, wu, wd, R, ldr, h, out, M, D, F, s, ldh, path, stream);
        case 2: return mlp<__nv_bfloat16>(x, wg, wu, wd, R, ldr, h, out, M, D, F, s, ldh, path,
                                          stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


def fused_mlp(x, w_gate, w_up, w_down, residual=None, path="auto"):
    """The SwiGLU MLP (+ residual[M, D]) -> new out[M, D] in x's dtype. path: auto, wgmma, mma,
    simt."""
    M, D = x.shape
    F = w_gate.shape[0]
    if w_up.stride() != w_gate.stride():
        w_up = w_up.contiguous()
        w_gate = w_gate.contiguous()  # the two gated weights are read with one set of strides
    ldh = (F + 7) // 8 * 8  # 16-byte aligned rows of h for the second GEMM
    h = torch.empty((M, ldh), dtype=x.dtype, device=x.device)
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if residual is not None and (tuple(residual.shape) != (M, D) or residual.dtype != x.dtype):
        raise ValueError(f"residual must be [{M}, {D}] in {x.dtype}, like out")
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()  # the pass reads rows of unit-stride columns
    ldr = residual.stride(0) if residual is not None else 0
    if out.numel():
        _lib.fused_mlp(x, w_gate, w_up, w_down, residual, ldr, h, out, M, D, F, *x.stride(),
                       *w_gate.stride(), *w_down.stride(), ldh, x.dtype, PATHS[path])
    return out


def kernel_fn(x, w_gate, w_up, w_down, residual=None):
    return fused_mlp(x, w_gate, w_up, w_down, residual)
