"""
Matmul C[M,N] = activation(A[M,K] @ B[K,N] (+ bias[N])) (+ residual[M,N]) in CUDA C++. Starter
kernel for AutoKernel (BACKEND = "cuda"): fp32 accumulation, C in A's dtype, the bias and the
residual added to the fp32 accumulator in the epilogue (C makes one trip through memory and is
rounded once); the activation (None, "gelu_tanh", "gelu") in a second pass over C, for now (the
residual then comes after it, in that pass). A LayerNorm of A's rows first (ln_weight, ln_bias,
ln_eps): a row kernel of its own writes the normalized A before the GEMM, for now (the Triton
starter folds the norm into its GEMM).

Three kernels, picked per call (`path` overrides it, for tuning and checks):

  * Hopper (sm_90a), fp16/bf16, 16-byte aligned rows: warp-specialized TMA + wgmma, persistent
    (one block of three warpgroups per SM, walking 128x256 tiles of C: the producer loads the
    next tile's first stages while the consumers store this one). Warpgroup 0 is the producer:
    one thread issues TMA copies of the next 128x64 tile of A and 64x256 tile of B into a
    4-stage ring of shared memory, each stage guarded by two mbarriers ("full": the copy engine
    counts the bytes in; "empty": the consumers are done with it). Warpgroups 1 and 2 are the
    consumers: each owns 64 rows of the tile and issues wgmma.m64n256k16 (asynchronous
    warpgroup MMAs that read both operands straight from shared memory) into 128 fp32
    accumulator registers, keeping one k-tile of MMAs in flight while it releases the stage
    before (its four warps meet at a named barrier before each k-tile, and once more before the
    one arrive that releases a stage). The producer gives registers to the consumers
    (setmaxnreg: 40 for it, 232 for them). TMA writes the tiles in the 128-byte swizzled layout
    wgmma reads (K-major A; B either N-major, [K,N] rows, read with wgmma's transpose bit, or
    K-major, the [N,K] rows of an nn.Linear weight), and fills out-of-range rows and columns
    with zeros, so no tail needs a mask until the epilogue. The epilogue adds the bias and the
    residual in fp32 and rounds to C's dtype into half the registers; the next tile's MMAs then
    start at once, and under each of its first four k-tiles one 64x64 slice of the rounded tile
    goes to shared memory (stmatrix, in the same 128-byte swizzle: no bank conflicts), from
    where one thread stores it with TMA (whole 128-byte rows, rows and columns past C clipped).
    Two slice buffers per consumer: a slice's store has a k-tile's time to read its buffer
    before the buffer is written again. (C rows not 16-byte aligned: 4-byte stores from the
    registers, not deferred.) Tiles are visited in groups of 16 tile rows, column by column, so
    the blocks in flight share A and B in L2. The grid is as few blocks as take the same number
    of waves, each with as many tiles (4096^3: 128 blocks of 4 tiles, not 132 of which 16 take
    3 and idle through the last wave): H100, judge's clock, 1.011x cuBLAS against 1.003x with
    132 blocks, faster in each of 5 rounds.
  * sm_80 and newer, fp16/bf16, aligned: mma.sync.m16n8k16 on 128x128x64 tiles, 8 warps (64x32
    of C each), a 3-stage cp.async pipeline (global -> shared without registers) and ldmatrix
    fragment loads from XOR-swizzled shared memory (16-byte chunk c of row r stored at c ^ (r %
    8): the 8 rows an ldmatrix reads fall in 8 different bank groups, no conflicts).
  * everything else (fp32, rows not 16-byte aligned such as K = 1023, any strides): a CUDA-core
    kernel, 128x128 tiles of 8x8 outputs a thread, fp32 FMA. fp32 stays exact to ~1e-6 there
    (TF32 tensor cores would miss the 1e-4 tolerance).

Deterministic: no atomics and no split-K; each C element is summed by one thread in a fixed order.

Tried and no faster on the H100 at 4096^3 fp16: clusters of two blocks on vertically adjacent
tiles, each loading half of their shared B tile multicast into both (207.5 us, against 205.5
for single blocks and 202.8 for cuBLAS in the same run): the kernel is not short of L2
bandwidth. (The consumers' arrive on the other block's barrier must not be a release at cluster
scope: that fence per k-tile made it 323 us.)
Storing C under the next tile's MMAs (H100, fp16, judge's clock against cuBLAS): 0.964-0.966x
before, 0.990-0.995x after at 8192x2304x768; 4096^3 0.987-0.991x before, 0.992-0.993x after.
Not the epilogue's latency but C's trip itself is what 4096^3 loses: the same kernel with no C
stores at all ran 1.035-1.040x, with L2 evict-first hints on the stores 0.996x, and at 4224 rows
(exactly 4 waves of tiles) 1.003-1.007x: cuBLAS balances the last wave (512 tiles on 132 SMs)
a little better. Stream-K (each block a run of equal length through the k-tiles of the last
wave's tiles, or of those and one wave more; partial tiles summed in fp32 through global memory
by the block holding the tile's first k-tiles) was correct, and on the H100 slower where it
was to help: 4096^3 222.3 us over the last wave, 265.0 over two, against 206.8 in whole tiles;
2048x4096x4096 121.5 / 136.0 against 108.0 (8192^3 and 8192x768x3072 within 2% either way).
Without the partial sums' reads and writes it was still slower: blocks then sum different
k-ranges of tiles that share A and B panels, which the whole-tile order reads in step.
Nor C stored by 4-byte stores straight from the registers under the next tile's MMAs (no
shared memory; H100, against cuBLAS, warm operands): 4096^3 fp16 0.999x against 1.078x through
shared memory and TMA, 8192x2304x768 bf16 0.886x against 1.212x.
Nor (H100, judge's clock, 4096^3 fp16, against cuBLAS): three stages and each warpgroup's whole
64x256 C tile stored at once from four buffers of its own, as the Triton starter's Gluon kernel
does (0.959x, against 0.998x for this kernel in the same run): this kernel needs its fourth
stage; the tile's first MMA ignoring the accumulator instead of zeroing it (no faster, and ptxas
then spills 160 bytes); tiles in groups of 8 tile rows (1.005x against 1.009x).
Things to try: 128x128 tiles when N leaves a 256-wide last column half empty, split-K for tiny M.

Usage:
  uv run bench.py --kernel kernels/cuda/matmul.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "matmul"
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

// Tile index -> (tile row, tile column), walking GROUP_M tile rows column by column: the tiles
// in flight at once read few distinct A row-panels and B column-panels (L2 reuse). The Hopper
// kernel walks 16: at 8192^3 fp16 its 132 128x256 tiles in flight read ~33 MB of panels against
// ~43 MB with 8 (L2: 50 MB), 1,507 us against 1,525 (H100); 4096^3 the same either way.
template <int GROUP_M = 8>
__device__ __forceinline__ void tile_of(int tile, int tiles_m, int tiles_n, int& pm, int& pn) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (tile / per_group) * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    pm = first_m + (tile % per_group) % rows;
    pn = (tile % per_group) / rows;
}

// What the epilogues add to the fp32 accumulator: bias[col] (or nothing), then
// residual[row, col] (rows ldr apart; or nothing).
template <typename T>
struct Epilogue {
    const T* bias;
    const T* residual;
    long long ldr;
    __device__ __forceinline__ float add(float v, int row, int col) const {
        if (bias != nullptr) v += to_f32(bias[col]);
        if (residual != nullptr) v += to_f32(residual[(long long)row * ldr + col]);
        return v;
    }
};

// C[row, col] and C[row, col + 1] (+ the epilogue's terms), each only if inside C. PAIR: one
// 4-byte store.
template <typename T>
__device__ __forceinline__ void store_pair(T* C, const Epilogue<T>& epi, int M, int N,
                                           long long ldc, int row, int col, float v0, float v1,
                                           bool pair) {
    if (row >= M || col >= N) return;
    v0 = epi.add(v0, row, col);
    if (col + 1 < N) v1 = epi.add(v1, row, col + 1);
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
// CUDA-core kernel: any dtype, any strides. 256 threads, a 128x128 tile of C, 8x8 outputs a
// thread at rows ty + 16 i and columns tx + 16 j (so a warp's shared-memory reads are broadcasts
// or 16 consecutive words: no bank conflicts).
// ---------------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(256)
gemm_simt(const T* __restrict__ A, const T* __restrict__ B, const Epilogue<T> epi,
          T* __restrict__ C, int M, int N, int K, long long sam, long long sak, long long sbk,
          long long sbn, long long ldc) {
    constexpr int BM = 128, BN = 128, BK = 8;
    __shared__ float As[BK][BM], Bs[BK][BN];
    int pm, pn;
    tile_of(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    float acc[8][8] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {  // 1024 elements of each tile, 4 a thread
            const int e = tid + 256 * r;
            const int am = e / BK, ak = e % BK;  // A: consecutive threads walk k
            const int gm = m0 + am, gk = k0 + ak;
            As[ak][am] = gm < M && gk < K ? to_f32(A[gm * sam + gk * sak]) : 0.f;
            const int bk = e / BN, bn = e % BN;  // B: consecutive threads walk n
            const int hk = k0 + bk, gn = n0 + bn;
            Bs[bk][bn] = hk < K && gn < N ? to_f32(B[hk * sbk + gn * sbn]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] = As[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 8; ++j) b[j] = Bs[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
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
                C[(long long)row * ldc + col] = from_f32<T>(epi.add(acc[i][j], row, col));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mma.sync kernel (sm_80+), half precision, rows 16-byte aligned and K (and N for a [K,N] B) a
// multiple of 8, so each 16-byte chunk of a tile is wholly inside or outside the matrix.
// ---------------------------------------------------------------------------------------------
namespace mma {
constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int A_CHUNKS = BM * BK / 8, B_CHUNKS = BK * BN / 8;  // 16-byte chunks per stage
constexpr int SMEM = STAGES * (A_CHUNKS + B_CHUNKS) * 16;

// The 16-byte slot of chunk `c` of row `r` in a tile with `per_row` chunks a row.
__device__ __forceinline__ int slot(int r, int c, int per_row) {
    return r * per_row + (c ^ (r & 7));
}

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
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D (16x8 fp32) += A (16x16, row) * B (16x8, col)
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    if constexpr (sizeof(T) == 2 && std::is_same<T, __half>::value) {
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

// B_KMAJOR: B is stored [N, K] (ldb between rows of N); else [K, N] (ldb between rows of K).
template <typename T, bool B_KMAJOR>
__global__ void __launch_bounds__(mma::THREADS)
gemm_mma(const T* __restrict__ A, const T* __restrict__ B, const Epilogue<T> epi,
         T* __restrict__ C, int M, int N, int K, long long lda, long long ldb, long long ldc,
         bool pair) {
    using namespace mma;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sA = smem_addr(smem), sB = sA + STAGES * A_CHUNKS * 16;
    int pm, pn;
    tile_of(blockIdx.x, (M + BM - 1) / BM, (N + BN - 1) / BN, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp % 2, wn = warp / 2;  // this warp's 64x32 piece of the tile

    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
        const uint32_t a_base = sA + stage * A_CHUNKS * 16, b_base = sB + stage * B_CHUNKS * 16;
#pragma unroll
        for (int i = 0; i < A_CHUNKS / THREADS; ++i) {  // A: 128 rows x 8 chunks
            const int q = tid + i * THREADS, r = q / 8, c = q % 8;
            const bool ok = m0 + r < M && k0 + c * 8 < K;
            const T* src = ok ? A + (long long)(m0 + r) * lda + k0 + c * 8 : A;
            cp_async16(a_base + slot(r, c, 8) * 16, src, ok);
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS / THREADS; ++i) {
            const int q = tid + i * THREADS;
            if (B_KMAJOR) {  // 128 rows of n x 8 chunks of k
                const int r = q / 8, c = q % 8;
                const bool ok = n0 + r < N && k0 + c * 8 < K;
                const T* src = ok ? B + (long long)(n0 + r) * ldb + k0 + c * 8 : B;
                cp_async16(b_base + slot(r, c, 8) * 16, src, ok);
            } else {  // 64 rows of k x 16 chunks of n
                const int r = q / 16, c = q % 16;
                const bool ok = k0 + r < K && n0 + c * 8 < N;
                const T* src = ok ? B + (long long)(k0 + r) * ldb + n0 + c * 8 : B;
                cp_async16(b_base + slot(r, c, 16) * 16, src, ok);
            }
        }
    };

    float acc[4][4][4] = {};  // [m16 tile][n8 tile][fragment]
    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of stage kt have landed
        __syncthreads();              // everyone's have; the stage computed last is free
        if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        cp_async_commit();
        const int stage = kt % STAGES;
        const uint32_t a_base = sA + stage * A_CHUNKS * 16, b_base = sB + stage * B_CHUNKS * 16;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // rows of the lane's 8x8 matrix, chunk = k half
                const int r = wm * 64 + i * 16 + lane % 16, c = kk * 2 + lane / 16;
                ldmatrix_x4(a[i], a_base + slot(r, c, 8) * 16);
            }
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {  // two n8 tiles per ldmatrix.x4
                uint32_t r4[4];
                if (B_KMAJOR) {
                    const int r = wn * 32 + jj * 16 + lane % 8 + 8 * (lane / 16);
                    ldmatrix_x4(r4, b_base + slot(r, kk * 2 + (lane / 8) % 2, 8) * 16);
                } else {
                    const int r = kk * 16 + lane % 8 + 8 * ((lane / 8) % 2);
                    const int c = (wn * 32 + jj * 16) / 8 + lane / 16;
                    ldmatrix_x4_trans(r4, b_base + slot(r, c, 16) * 16);
                }
                b[2 * jj][0] = r4[0];
                b[2 * jj][1] = r4[1];
                b[2 * jj + 1][0] = r4[2];
                b[2 * jj + 1][1] = r4[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816<T>(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    cp_async_wait<0>();
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = m0 + wm * 64 + i * 16 + g, col = n0 + wn * 32 + j * 8 + 2 * t;
            store_pair(C, epi, M, N, ldc, row, col, acc[i][j][0], acc[i][j][1], pair);
            store_pair(C, epi, M, N, ldc, row + 8, col, acc[i][j][2], acc[i][j][3], pair);
        }
}

// ---------------------------------------------------------------------------------------------
// Hopper kernel: TMA + mbarriers + wgmma, warp-specialized (see the file's docstring).
// ---------------------------------------------------------------------------------------------
namespace hopper {
constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
constexpr uint32_t A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
// C leaves through shared memory in 64x64 slices (one TMA box: 64 rows of 128 bytes), two
// buffers per consumer warpgroup used in turn: one is written while the other's TMA store reads
// it. A whole 64x256 tile per warpgroup (64 KB for the two) would cost a stage of the ring
// (4 x 48 KB): the mainloop keeps its depth, and the stores overlap the next slice's conversion
// and the next tile's first MMAs instead.
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
// Consumer warpgroup cw is done with a stage: once all four of its warps are, one arrive on the
// stage's "empty" barrier.
__device__ __forceinline__ void release(uint32_t empty_bar, int cw) {
    warpgroup_sync(1 + cw);
    if (threadIdx.x % 128 == 0) mbar_arrive(empty_bar);
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

// A shared-memory matrix descriptor for a 128-byte-swizzled tile (PTX "matrix descriptor"):
// start address, leading and stride byte offsets (all >> 4), swizzle mode 1 in bits 62-63.
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
                 ", %128, %129, p, 1, 1, 0, %131;\n}\n" \
                 : AK_ACC64(0), AK_ACC64(64) : "l"(da), "l"(db), "r"(1), "n"(TRANS_B) : "memory")

// D (64x256 fp32, this warpgroup's registers) += A (64x16, smem) * B (16x256, smem): one
// instruction for the warpgroup's whole row band, so A is read from shared memory once per
// k-step (two n128 instructions read it twice).
// TRANS_B = 1: B's tile is N-major ([k][n] rows); 0: K-major ([n][k] rows).
template <typename T, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t da, uint64_t db) {
    if constexpr (std::is_same<T, __half>::value) AK_WGMMA_N256("f16");
    else AK_WGMMA_N256("bf16");
}
}  // namespace hopper

// Slice SL (columns 64 SL to 64 SL + 63) of one consumer warpgroup's 64 rows of a C tile
// (packed: the accumulator rounded to T, pairs as wgmma lays them out) to C through shared
// memory: to the buffer the store before last read, laid out as the TMA box's 128-byte swizzle
// wants it (16-byte chunk c of row r at chunk c ^ (r % 8) of the row, so the 8 rows of each 8x8
// matrix of a stmatrix fall in 8 different bank groups), then one TMA store. Rows and columns
// past C are clipped by the store. `slices` counts the warpgroup's slices (which buffer is next).
template <typename T, int SL>
__device__ __forceinline__ void store_slice(const uint32_t (&packed)[hopper::BN / 4],
                                            const CUtensorMap* tmC, uint32_t sC, int cw,
                                            int& slices, int m0, int n0, int N) {
    using namespace hopper;
    if (n0 + 64 * SL >= N) return;  // past C's last column
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const bool leader = threadIdx.x % 128 == 0;  // issues and waits for the C stores
    const int r = warp * 16 + lane % 16;  // the row this lane's stmatrix addresses are in
    const uint32_t buf = sC + (2 * cw + slices++ % 2) * C_BYTES;
    if (leader) bulk_wait_read<1>();  // the store that read buf last is done with it
    warpgroup_sync(1 + cw);
    // stmatrix q of each j: rows 8 (q % 2) to 8 (q % 2) + 7 of n8 block j + q / 2
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        uint32_t v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = packed[16 * SL + 2 * j + q];
        stmatrix_x4(buf + r * 128 + (((j + lane / 16) ^ (r % 8)) << 4), v);
    }
    fence_async_shared();
    warpgroup_sync(1 + cw);  // the whole slice is written
    if (leader) {
        tma_store_2d(tmC, n0 + 64 * SL, m0 + cw * 64, buf);
        bulk_commit();
    }
}

// Slices first, first + 1, ... of the tile (first at run time; the registers need constants).
template <typename T>
__device__ __forceinline__ void store_slices(const uint32_t (&packed)[hopper::BN / 4],
                                             const CUtensorMap* tmC, uint32_t sC, int cw,
                                             int& slices, int m0, int n0, int N, int first,
                                             int last) {
    static_assert(hopper::BN / 64 == 4, "one case per slice");
    if (first <= 0 && 0 <= last) store_slice<T, 0>(packed, tmC, sC, cw, slices, m0, n0, N);
    if (first <= 1 && 1 <= last) store_slice<T, 1>(packed, tmC, sC, cw, slices, m0, n0, N);
    if (first <= 2 && 2 <= last) store_slice<T, 2>(packed, tmC, sC, cw, slices, m0, n0, N);
    if (first <= 3 && 3 <= last) store_slice<T, 3>(packed, tmC, sC, cw, slices, m0, n0, N);
}

// Persistent: at most one block per SM walks tiles blockIdx.x, + gridDim.x, ...; the k-tiles of all
// its tiles are one sequence `it` through the stage ring, so the producer fills the next tile's
// first stages while the consumers run this tile's epilogue. tma_c: C leaves through shared memory
// and TMA stores (tmC); else by 4-byte stores from the registers (C's rows not 16-byte aligned).
template <typename T, bool B_KMAJOR>
__global__ void __launch_bounds__(hopper::THREADS, 1)
gemm_wgmma(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
           const __grid_constant__ CUtensorMap tmC, const Epilogue<T> epi, T* __restrict__ C,
           int M, int N, int K, long long ldc, bool pair, bool tma_c) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace hopper;
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
            mbar_init(empty(s), 2);  // one arrive per consumer warpgroup
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
                tile_of<16>(tile, tiles_m, tiles_n, pm, pn);
                const int m0 = pm * BM, n0 = pn * BN;
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES;
                    mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);  // first round: at once
                    mbar_expect_tx(full(s), A_BYTES + B_BYTES);
                    tma_load_2d(sA + s * A_BYTES, &tmA, kt * BK, m0, full(s));
                    if (B_KMAJOR) {
                        tma_load_2d(sB + s * B_BYTES, &tmB, kt * BK, n0, full(s));
                    } else {
#pragma unroll
                        for (int j = 0; j < BN / 64; ++j)  // 64-column boxes of 64 k-rows
                            tma_load_2d(sB + s * B_BYTES + j * 8192, &tmB, n0 + 64 * j, kt * BK,
                                        full(s));
                    }
                }
            }
        }
    } else {  // consumers: warpgroup 1 rows 0-63 of each tile, warpgroup 2 rows 64-127
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = wg - 1, warp = (threadIdx.x % 128) / 32;
        const bool leader = threadIdx.x % 128 == 0;  // issues and waits for the C stores
        int it = 0, slices = 0;
        uint32_t packed[BN / 4];  // the tile before's C, rounded, waiting for its store
        bool pending = false;
        int pending_m0 = 0, pending_n0 = 0;
        for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
            int pm, pn;
            tile_of<16>(tile, tiles_m, tiles_n, pm, pn);
            const int m0 = pm * BM, n0 = pn * BN;
            float acc[BN / 2];
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
                // The warpgroup's four warps meet before each k-tile (its MMAs start only once
                // all four have issued them anyway), and release a stage by one arrive once all
                // four are done with it (H100, against cuBLAS on the judge's clock, 4096^3 fp16:
                // the meeting alone 0.999x -> 1.005x; 8192^3 0.999x -> 1.014x).
                warpgroup_sync(1 + cw);
                mbar_wait(full(s), (it / STAGES) & 1);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    // A: 64 rows of 128 bytes from row cw*64; a k-step is 32 bytes into a row.
                    const uint64_t da = desc(sA + s * A_BYTES + cw * 64 * 128 + kk * 32, 16, 1024);
                    const uint64_t db =
                        B_KMAJOR ? desc(sB + s * B_BYTES + kk * 32, 16, 1024)  // 256 n-rows
                                 // 64-column blocks 8 KB apart (LBO), 8-row k groups 1 KB apart
                                 : desc(sB + s * B_BYTES + kk * 16 * 128, 8192, 1024);
                    wgmma_m64n256k16<T, B_KMAJOR ? 0 : 1>(acc, da, db);
                }
                wgmma_commit();
                if (pending && kt < BN / 64)  // a slice of the tile before's C under these MMAs
                    store_slices<T>(packed, &tmC, sC, cw, slices, pending_m0, pending_n0, N, kt,
                                    kt);
                wgmma_wait<1>();  // the MMAs of the k-tile before are done: release its stage
                if (kt > 0) release(empty((it - 1) % STAGES), cw);
            }
            wgmma_wait<0>();
            if (KT > 0) release(empty((it - 1) % STAGES), cw);  // the tile's last
            if (pending)  // the slices K had too few k-tiles to hide
                store_slices<T>(packed, &tmC, sC, cw, slices, pending_m0, pending_n0, N, KT,
                                BN / 64 - 1);
            pending = false;
            // Accumulator layout (wgmma m64nN, fp32): value i of a thread sits at row
            // 16 * warp + lane / 4 + 8 * ((i / 2) % 2),
            // column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
            if (!tma_c) {
                const int row = m0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
                for (int i = 0; i < BN / 2; i += 4) {
                    const int col = n0 + (i / 4) * 8 + 2 * (lane % 4);
                    store_pair(C, epi, M, N, ldc, row, col, acc[i], acc[i + 1], pair);
                    store_pair(C, epi, M, N, ldc, row + 8, col, acc[i + 2], acc[i + 3], pair);
                }
                continue;
            }
            if (m0 + cw * 64 >= M) continue;  // none of this warpgroup's rows are in C
            // Round (the epilogue's terms added) into half the registers now, store during the
            // next tile's first MMAs: the accumulator is free for them, and the tensor cores never
            // wait for C.
            // (Two loops: one branch per element of a residual's bounds checks in the common
            // loop made the whole kernel 8-50% slower.)
            if (epi.residual == nullptr) {
#pragma unroll
                for (int i = 0; i < BN / 2; i += 2) {
                    float v0 = acc[i], v1 = acc[i + 1];
                    const int col = n0 + 8 * (i / 4) + 2 * (lane % 4);
                    if (epi.bias != nullptr) {
                        if (col < N) v0 += to_f32(epi.bias[col]);
                        if (col + 1 < N) v1 += to_f32(epi.bias[col + 1]);
                    }
                    packed[i / 2] = pack2<T>(v0, v1);
                }
            } else {
                const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
                for (int i = 0; i < BN / 2; i += 2) {
                    float v0 = acc[i], v1 = acc[i + 1];
                    const int row = row0 + 8 * ((i / 2) % 2);
                    const int col = n0 + 8 * (i / 4) + 2 * (lane % 4);
                    if (row < M && col < N) v0 = epi.add(v0, row, col);
                    if (row < M && col + 1 < N) v1 = epi.add(v1, row, col + 1);
                    packed[i / 2] = pack2<T>(v0, v1);
                }
            }
            pending = true, pending_m0 = m0, pending_n0 = n0;
        }
        if (pending)
            store_slices<T>(packed, &tmC, sC, cw, slices, pending_m0, pending_n0, N, 0,
                            BN / 64 - 1);
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

template <typename T>
static int launch(const T* A, const T* B, const Epilogue<T> epi, T* C, int M, int N, int K,
                  long long lda, long long sbk, long long sbn, long long ldc, int path,
                  cudaStream_t stream) {
    const bool pair = ldc % 2 == 0 && ((uintptr_t)C & 3) == 0;
    const bool b_kmajor = sbk == 1 && sbn != 1;
    const long long ldb = b_kmajor ? sbn : sbk;
    const bool tensor_ok = sizeof(T) == 2 && (sbn == 1 || sbk == 1) && aligned16(A) &&
                           aligned16(B) && (lda * 2) % 16 == 0 && (ldb * 2) % 16 == 0 &&
                           K % 8 == 0 && (b_kmajor || N % 8 == 0);
    if (path == AUTO) path = !tensor_ok ? SIMT : AUTOKERNEL_SM == 90 ? WGMMA
                             : AUTOKERNEL_SM >= 80 ? MMA : SIMT;
    if (path != SIMT && (!tensor_ok || (path == WGMMA && AUTOKERNEL_SM != 90) ||
                         AUTOKERNEL_SM < 80))
        return (int)cudaErrorNotSupported;
    if constexpr (sizeof(T) == 2) {
        if (path == WGMMA) {
            using namespace hopper;
            CUtensorMap ta, tb, tc = {};
            const bool ok = make_map<T>(&ta, A, M, K, lda, BK, BM) &&
                            (b_kmajor ? make_map<T>(&tb, B, N, K, ldb, BK, BN)
                                      : make_map<T>(&tb, B, K, N, ldb, 64, BK));
            // C's stores go through TMA where its rows are 16-byte aligned: 64x64 boxes
            const bool tma_c = aligned16(C) && (ldc * sizeof(T)) % 16 == 0 &&
                               make_map<T>(&tc, C, M, N, ldc, 64, 64);
            if (ok) {
                const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
                // As few blocks as take the same number of waves, each as many tiles: 4096^3's
                // 512 tiles on 128 blocks of 4, not 132 of which 16 idle through the last.
                const int waves = (tiles + sm_count() - 1) / sm_count();
                const unsigned grid = (unsigned)((tiles + waves - 1) / waves);
                if (b_kmajor) {
                    allow_smem((const void*)gemm_wgmma<T, true>, SMEM);
                    gemm_wgmma<T, true><<<grid, THREADS, SMEM, stream>>>(
                        ta, tb, tc, epi, C, M, N, K, ldc, pair, tma_c);
                } else {
                    allow_smem((const void*)gemm_wgmma<T, false>, SMEM);
                    gemm_wgmma<T, false><<<grid, THREADS, SMEM, stream>>>(
                        ta, tb, tc, epi, C, M, N, K, ldc, pair, tma_c);
                }
                return (int)cudaGetLastError();
            }
            path = MMA;  // the driver could not describe the operands: no TMA
        }
        if (path == MMA) {
            using namespace mma;
            const unsigned tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN);
            if (b_kmajor) {
                allow_smem((const void*)gemm_mma<T, true>, SMEM);
                gemm_mma<T, true><<<tiles, THREADS, SMEM, stream>>>(A, B, epi, C, M, N, K, lda,
                                                                    ldb, ldc, pair);
            } else {
                allow_smem((const void*)gemm_mma<T, false>, SMEM);
                gemm_mma<T, false><<<tiles, THREADS, SMEM, stream>>>(A, B, epi, C, M, N, K, lda,
                                                                     ldb, ldc, pair);
            }
            return (int)cudaGetLastError();
        }
    }
    const unsigned tiles = ((M + 127) / 128) * ((N + 127) / 128);
    gemm_simt<T><<<tiles, 256, 0, stream>>>(A, B, epi, C, M, N, K, lda, 1, sbk, sbn, ldc);
    return (int)cudaGetLastError();
}

// activation(C) in place, element by element: 1 gelu_tanh (0.5 x (1 + tanh(u)) written as
// x - x / (exp(2u) + 1), finite where exp overflows), 2 gelu (erf); then + R[row, col] where a
// residual R is given (C: contiguous [n / N, N]; R: rows ldr apart). C is rounded to T once
// before it (the fp64 oracle rounds once, after): within the tolerance; fusing it into the
// GEMMs' epilogues would save this second pass over C.
template <typename T>
__global__ void activate(T* C, long long n, int kind, const T* R, long long ldr, int N) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float x = to_f32(C[i]);
        if (kind == 1) {
            const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            x = x - x / (expf(2.f * u) + 1.f);
        } else {
            x = 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
        }
        if (R != nullptr) x += to_f32(R[(i / N) * ldr + i % N]);
        C[i] = from_f32<T>(x);
    }
}

extern "C" int activate_inplace(void* C, long long n, int kind, const void* R, long long ldr,
                                int N, int dtype, cudaStream_t stream) {
    const unsigned blocks = (unsigned)min((n + 255) / 256, 65535LL);
    switch (dtype) {
        case 0: activate<float><<<blocks, 256, 0, stream>>>((float*)C, n, kind, (const float*)R,
                                                            ldr, N); break;
        case 1: activate<__half><<<blocks, 256, 0, stream>>>((__half*)C, n, kind,
                                                             (const __half*)R, ldr, N); break;
        case 2: activate<__nv_bfloat16><<<blocks, 256, 0, stream>>>(
                    (__nv_bfloat16*)C, n, kind, (const __nv_bfloat16*)R, ldr, N); break;
        default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

// The sum of v over a block of up to 1024 threads (warp shuffles, then one warp over the warps'
// sums in `part`), returned to every thread.
__device__ __forceinline__ float block_sum(float v, float* part) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // part's last use is done
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < blockDim.x / 32 ? part[threadIdx.x % 32] : 0.f;  // every warp
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A pre-norm block's LayerNorm, row by row, before the GEMM: Y[row] = (X[row] - mean) / std * w
// + b (w, b may be null), one block a row, in fp32: the mean first, then the mean square of
// x - mean (rows whose mean is many times their spread do not cancel). X: rows ldx apart; Y:
// contiguous [M, K].
template <typename T>
__global__ void layernorm_rows(const T* X, long long ldx, const T* w, const T* b, float eps,
                               T* Y, int K) {
    __shared__ float part[32];
    const T* x = X + blockIdx.x * ldx;
    T* y = Y + (long long)blockIdx.x * K;
    float s = 0.f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) s += to_f32(x[i]);
    const float mean = block_sum(s, part) / K;
    float q = 0.f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        const float d = to_f32(x[i]) - mean;
        q += d * d;
    }
    const float rstd = rsqrtf(block_sum(q, part) / K + eps);
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = (to_f32(x[i]) - mean) * rstd;
        if (w != nullptr) v *= to_f32(w[i]);
        if (b != nullptr) v += to_f32(b[i]);
        y[i] = from_f32<T>(v);
    }
}

extern "C" int layernorm_into(const void* X, long long ldx, const void* w, const void* b,
                              float eps, void* Y, int M, int K, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case 0: layernorm_rows<float><<<M, 256, 0, stream>>>(
                    (const float*)X, ldx, (const float*)w, (const float*)b, eps, (float*)Y, K);
                break;
        case 1: layernorm_rows<__half><<<M, 256, 0, stream>>>(
                    (const __half*)X, ldx, (const __half*)w, (const __half*)b, eps, (__half*)Y,
                    K);
                break;
        case 2: layernorm_rows<__nv_bfloat16><<<M, 256, 0, stream>>>(
                    (const __nv_bfloat16*)X, ldx, (const __nv_bfloat16*)w,
                    (const __nv_bfloat16*)b, eps, (__nv_bfloat16*)Y, K);
                break;
        default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

// A: [M, K] rows lda apart (unit stride along K); B: element strides sbk (along K) and sbn
// (along N); C: [M, N] rows ldc apart; bias [N] and R [M, N] (rows ldr apart) may be null.
// path: 0 auto, 1 wgmma, 2 mma.sync, 3 CUDA cores. dtype: 0 float32, 1 float16, 2 bfloat16
// (cuda_build.DTYPE_CODES).
template <typename T>
static int launch_typed(const void* A, const void* B, const void* bias, const void* R,
                        long long ldr, void* C, int M, int N, int K, long long lda, long long sbk,
                        long long sbn, long long ldc, int path, cudaStream_t stream) {
    const Epilogue<T> epi{(const T*)bias, (const T*)R, ldr};
    return launch<T>((const T*)A, (const T*)B, epi, (T*)C, M, N, K, lda, sbk, sbn, ldc, path,
                     stream);
}

extern "C" int matmul(const void* A, const void* B, const void* bias, const void* R,
                      long long ldr, void* C, int M, int N, int K, long long lda, long long sbk,
                      long long sbn, long long ldc, int dtype, int path, cudaStream_t stream) {
    switch (dtype) {
        case 0: return launch_typed<float>(A, B, bias, R, ldr, C, M, N, K, lda, sbk, sbn, ldc,
                                           path, stream);
        case 1: return launch_typed<__half>(A, B, bias, R, ldr, C, M, N, K, lda, sbk, sbn, ldc,
                                            path, stream);
        case 2: return launch_typed<__nv_bfloat16>(A, B, bias, R, ldr, C, M, N, K, lda, sbk, sbn,
                                                   ldc, path, stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


ACTIVATIONS = {"gelu_tanh": 1, "gelu": 2}


def matmul(A, B, bias=None, activation=None, residual=None, ln_weight=None, ln_bias=None,
           ln_eps=None, path="auto"):
    """activation(LN(A)[M,K] @ B[K,N] (+ bias[N])) (+ residual[M,N]) -> new C[M,N] in A's
    dtype; LN a LayerNorm of A's rows (ln_weight, ln_bias may be None) where ln_eps is given, for
    now a pass of its own into a normalized copy of A (the Triton starter folds it into the
    GEMM). path: auto, wgmma, mma, simt."""
    M, K = A.shape
    K2, N = B.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    if A.stride(1) != 1:
        A = A.contiguous()  # rows of A must be contiguous (B may have any strides)
    if ln_eps is not None and A.numel():
        ln_weight, ln_bias = (t if t is None or t.stride(0) == 1 else t.contiguous()
                              for t in (ln_weight, ln_bias))
        normed = torch.empty((M, K), dtype=A.dtype, device=A.device)
        _lib.layernorm_into(A, A.stride(0), ln_weight, ln_bias, float(ln_eps), normed, M, K,
                            A.dtype)
        A = normed
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if residual is not None and (tuple(residual.shape) != (M, N) or residual.dtype != A.dtype):
        raise ValueError(f"residual must be [{M}, {N}] in {A.dtype}, like C")
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()  # the epilogues read rows of unit-stride columns
    ldr = residual.stride(0) if residual is not None else 0
    C = torch.empty((M, N), dtype=A.dtype, device=A.device)
    if C.numel():
        # With an activation the residual is added after it, in the activation's pass.
        in_gemm = residual if activation is None else None
        _lib.matmul(A, B, bias, in_gemm, ldr, C, M, N, K, A.stride(0), B.stride(0), B.stride(1),
                    C.stride(0), A.dtype, PATHS[path])
        if activation is not None:
            _lib.activate_inplace(C, C.numel(), ACTIVATIONS[activation], residual, ldr, N,
                                  A.dtype)
    return C


def kernel_fn(A, B, bias=None, activation=None, residual=None, ln_weight=None, ln_bias=None,
              ln_eps=None):
    return matmul(A, B, bias, activation, residual, ln_weight, ln_bias, ln_eps)
