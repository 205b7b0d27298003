"""
Softmax over the last dim of x[M, N], in CUDA C++. Starter kernel for AutoKernel
(BACKEND = "cuda"). Math in fp32 (max-subtracted, so huge inputs do not overflow); the output
has x's dtype.

One read and one write of x, what a copy costs, for rows up to 8 blocks' shared memory (~930K
16-bit elements on Hopper). Rows up to 16K 16-bit elements (8K floats) stay in registers:
  * A group of G threads owns a row (G a multiple of 32, up to 1024; blockDim.y rows per block
    when rows are short). Each thread loads two 16-byte chunks of it (8 halves or 4 floats
    each) up front, interleaved across the group so that a warp's load reads 512 contiguous
    bytes, skipping L1 and marked evict-first in L2 (x is read once). The chunks stay in
    registers as the input's own 16-bit values: with two chunks a thread the kernel fits in 32
    registers, so an SM keeps 2048 threads (64 KB of x) in flight, which is what hides the
    memory latency. (Four chunks a thread, held as floats, take 64 registers and half the
    threads: 125 us against 100 at 8192x8192 fp16 on an H100.)
  * Then the row max (a warp-shuffle butterfly, then the warps' partials through shared memory,
    in warp order: bitwise deterministic), the sum of exp(x - max), and the output exp(x - max)
    / sum, computed again rather than kept (registers are what limit the threads in flight).
Rows longer than 1024 threads' chunks go through shared memory: a block copies the row into it
with cp.async (global to shared without registers, every copy issued before the first wait),
so a block has its whole row in flight and, while two fit, two or more blocks share an SM, one's
loads overlapping another's math. The row is then read from shared memory for the max, the sum and
the output. On Hopper, a row too long for two blocks an SM is split over a cluster of 2 to 8
blocks (thread-block clusters run together on neighbouring SMs), which merge their slices'
(max, sum of exp) through distributed shared memory. Rows past that (and rows past one block's
shared memory before Hopper) take a two-pass kernel: one block of 1024 threads per row keeps a
running max and a sum of exp rescaled to it (online softmax), then re-reads the row (mostly
from L2) to write it. exp is exp2f: of x * log2(e) - max * log2(e) (one FMA) where the max is
known first, of (x - max) * log2(e) in the two-pass kernel.
Rows that start off a 16-byte boundary (N = 50257: every other row) are cut at the boundaries,
on every path: chunk k starts at element 8k - lead, whole chunks are aligned vectors, and only
the partial chunks at the row's two ends go element by element (every chunk does where x and y
sit differently against the boundaries, a strided view's rare case).

Tried and slower on the H100 at 8192x8192: a persistent grid that loads a row group's next row
while it reduces this one (100 -> 103-114 us: the second row's registers cost occupancy or
spill), and one reduction of (max, sum) pairs instead of two (125 us: the warps' pairs merge
one after another, two exp each). Long rows held in registers over a cluster of 8 blocks
waited on one another: 4096x50257 fp16 489 us on an H200, against 236 through shared memory.
Rows too long for registers went through shared memory by cp.async, which takes no registers:
4096x50257 on the H100 from 508 to 309 us.
Things to try: TMA bulk copies instead of cp.async; rows of 8192 through shared memory with
small blocks, more bytes in flight an SM than registers allow (PATH = 1, THREADS_PER_ROW = 128:
81 against 93 us on an H200, no faster on an H100).

Usage:
  uv run bench.py --kernel kernels/cuda/softmax.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "softmax"
BACKEND = "cuda"

# Launch shape, for tuning (0: the defaults the docstring describes). THREADS_PER_ROW: threads
# that share a row (a multiple of 32, at most 1024; in registers, fewer than the row needs is
# ignored; through shared memory: the block's threads, 512 by default). ROWS_PER_BLOCK: rows
# a block holds in registers (at most 1024 / threads per row).
# PATH: 1 rows through shared memory wherever they fit, 2 never.
THREADS_PER_ROW = 0
ROWS_PER_BLOCK = 0
PATH = 0

CUDA_SRC = r"""
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>

namespace cg = cooperative_groups;

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

constexpr float LOG2E = 1.4426950408889634f;
constexpr int VPT = 2;          // chunks a thread holds
constexpr int MAX_CLUSTER = 8;  // blocks a row may span (the portable cluster size)

// A chunk is 16 bytes, E elements of T: what one vector load or store moves. It stays four
// 32-bit registers; elements are read and written as floats by bit operations (a union or a
// pointer cast would put the chunk in local memory).
template <typename T> struct Chunk {
    static constexpr int E = 16 / sizeof(T);
    uint4 raw;
    __device__ __forceinline__ unsigned word(int w) const {
        return w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
    }
    __device__ __forceinline__ void set_word(int w, unsigned v) {
        if (w == 0) raw.x = v;
        else if (w == 1) raw.y = v;
        else if (w == 2) raw.z = v;
        else raw.w = v;
    }
    __device__ __forceinline__ float get(int i) const;
    __device__ __forceinline__ void set(int i, float v);
    static __device__ __forceinline__ Chunk splat(float v) {  // every element v
        Chunk c;
        c.raw = make_uint4(0, 0, 0, 0);
        c.set(0, v);
        const unsigned w = E == 4 ? c.raw.x : c.raw.x * 0x10001u;  // 16-bit: both halves
        c.raw = make_uint4(w, w, w, w);
        return c;
    }
};

template <> __device__ __forceinline__ float Chunk<float>::get(int i) const {
    return __uint_as_float(word(i));
}
template <> __device__ __forceinline__ void Chunk<float>::set(int i, float v) {
    set_word(i, __float_as_uint(v));
}
// 16-bit elements: element i is the low (even i) or high half of word i / 2.
template <> __device__ __forceinline__ float Chunk<__half>::get(int i) const {
    return __half2float(__ushort_as_half((unsigned short)(word(i / 2) >> (i % 2 * 16))));
}
template <> __device__ __forceinline__ void Chunk<__half>::set(int i, float v) {
    const unsigned bits = __half_as_ushort(__float2half_rn(v)), shift = i % 2 * 16;
    set_word(i / 2, (word(i / 2) & ~(0xffffu << shift)) | bits << shift);
}
template <> __device__ __forceinline__ float Chunk<__nv_bfloat16>::get(int i) const {
    const unsigned w = word(i / 2);
    return __uint_as_float(i % 2 ? w & 0xffff0000u : w << 16);  // bf16 is a float's top half
}
template <> __device__ __forceinline__ void Chunk<__nv_bfloat16>::set(int i, float v) {
    const unsigned bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)), shift = i % 2 * 16;
    set_word(i / 2, (word(i / 2) & ~(0xffffu << shift)) | bits << shift);
}

// A 16-byte load of data read for the last time: it skips L1 and marks its L2 line
// evict-first (keeping it cached would only evict something still needed).
__device__ __forceinline__ uint4 load_last(const void* p) {
    uint4 v;
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    return v;
}

// How a row is accessed. ALIGNED: every row starts on a 16-byte boundary and N is a multiple
// of E, so a chunk is wholly inside the row or wholly past it. LEAD: rows start anywhere (x
// and y alike); whole chunks are vectors, the two partial ones element by element. SCALAR:
// element by element (x and y sit differently against the boundaries).
enum Mode { ALIGNED, LEAD, SCALAR };

// A chunk that is partly outside the row, element by element. Not inlined: it runs for two
// chunks of a row at most, and inlined its eight guarded loads cost every thread registers.
template <typename T>
__device__ __noinline__ Chunk<T> load_partial(const T* row, int start, int n, float fill) {
    Chunk<T> c;
    c.raw = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < Chunk<T>::E; ++i)
        c.set(i, start + i >= 0 && start + i < n ? to_f32(row[start + i]) : fill);
    return c;
}

template <typename T>
__device__ __noinline__ void store_partial(T* row, int start, int n, Chunk<T> c) {
#pragma unroll
    for (int i = 0; i < Chunk<T>::E; ++i)
        if (start + i >= 0 && start + i < n) row[start + i] = from_f32<T>(c.get(i));
}

// Elements start .. start + E - 1 of a row of n; `fill` where outside [0, n).
template <typename T, Mode MODE>
__device__ __forceinline__ Chunk<T> load_chunk(const T* row, int start, int n, float fill) {
    constexpr int E = Chunk<T>::E;
    Chunk<T> c;
    if (MODE != SCALAR && start >= 0 && start + E <= n) {
        c.raw = load_last(row + start);
    } else if (MODE == ALIGNED) {
        c = Chunk<T>::splat(fill);
    } else {
        c = load_partial(row, start, n, fill);
    }
    return c;
}

template <typename T, Mode MODE>
__device__ __forceinline__ void store_chunk(T* row, int start, int n, const Chunk<T>& c) {
    constexpr int E = Chunk<T>::E;
    if (MODE != SCALAR && start >= 0 && start + E <= n) {
        *reinterpret_cast<uint4*>(row + start) = c.raw;
    } else if (MODE != ALIGNED) {
        store_partial(row, start, n, c);
    }
}

// How many elements a row starts past a 16-byte boundary (LEAD): chunk k of the row begins
// at element k * E - lead, so every chunk but the first and last is an aligned vector.
template <typename T, Mode MODE>
__device__ __forceinline__ int lead_of(const T* row) {
    return MODE == LEAD ? (int)(((uintptr_t)row & 15) / sizeof(T)) : 0;
}

// A reduction over one row group (blockDim.x threads, a multiple of 32), returned to every
// thread of the group. Every thread of the block must call it (it may synchronize the block).
template <bool MAX>
__device__ __forceinline__ float group_reduce(float v, float* partial) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, offset);
        v = MAX ? fmaxf(v, other) : v + other;
    }
    const int warps = blockDim.x / 32;
    if (warps == 1) return v;
    float* mine = partial + threadIdx.y * warps;
    if ((threadIdx.x & 31) == 0) mine[threadIdx.x / 32] = v;
    __syncthreads();
    float r = mine[0];
    for (int w = 1; w < warps; ++w) r = MAX ? fmaxf(r, mine[w]) : r + mine[w];  // warp order
    __syncthreads();
    return r;
}

// (max, sum of exp(x - max)) of two parts of a row, merged.
__device__ __forceinline__ float2 merge(float2 a, float2 b) {
    const float m = fmaxf(a.x, b.x);
    if (m == -CUDART_INF_F) return a;  // both empty
    return make_float2(m, a.y * exp2f((a.x - m) * LOG2E) + b.y * exp2f((b.x - m) * LOG2E));
}

// One row per group of blockDim.x threads (blockDim.y rows a block): each thread holds VPT
// chunks of the row. 32 registers a thread (2048 threads an SM) in every mode: the partial
// chunks' element-by-element code is not inlined, so it costs the aligned chunks nothing.
template <typename T, Mode MODE>
__global__ void __launch_bounds__(1024, 2)
softmax_rows(const T* __restrict__ x, T* __restrict__ y, long long rows, int n, long long sx,
             long long sy) {
    constexpr int E = Chunk<T>::E;
    __shared__ float partial[32];
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool live = row < rows;  // a short last block still joins the reductions
    const T* xr = x + (live ? row : 0) * sx;
    const int first = threadIdx.x * E - lead_of<T, MODE>(xr);
    const float minus_inf = -CUDART_INF_F;  // adds nothing to a max or a sum of exp
    Chunk<T> v[VPT];
#pragma unroll
    for (int c = 0; c < VPT; ++c)
        v[c] = load_chunk<T, MODE>(xr, first + c * blockDim.x * E, live ? n : 0, minus_inf);
    float m = minus_inf;
#pragma unroll
    for (int c = 0; c < VPT; ++c)
#pragma unroll
        for (int i = 0; i < E; ++i) m = fmaxf(m, v[c].get(i));
    m = group_reduce<true>(m, partial);
    // One FMA a element: the rounding of m * log2(e) scales every exp of the row alike, and
    // the division by their sum cancels it.
    const float m2 = m * LOG2E;
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < VPT; ++c)
#pragma unroll
        for (int i = 0; i < E; ++i) s += exp2f(fmaf(v[c].get(i), LOG2E, -m2));
    const float inv = 1.f / group_reduce<false>(s, partial);
    if (live) {
        T* yr = y + row * sy;
#pragma unroll
        for (int c = 0; c < VPT; ++c) {
#pragma unroll
            for (int i = 0; i < E; ++i) v[c].set(i, exp2f(fmaf(v[c].get(i), LOG2E, -m2)) * inv);
            store_chunk<T, MODE>(yr, first + c * blockDim.x * E, n, v[c]);
        }
    }
}

// A 16-byte copy from global to shared memory that bypasses the registers (cp.async, sm_80+),
// its L2 line marked evict-first like load_last's.
__device__ __forceinline__ void copy_last_async(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                 :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem), "l"(policy)
                 : "memory");
#endif
}

// Rows too long for one block's registers: each block copies its slice of the row (the whole
// row, or 1/cluster of it) into shared memory with cp.async, every copy issued before any is
// waited for, then reads it there three times (max, sum of exp, output). The copies take no
// registers, so a block has its whole slice in flight (100 KB for a row of 50257 halves) and,
// where two fit, blocks share an SM: one's loads overlap another's reductions and stores. A row
// over a cluster (Hopper's thread-block clusters, which run together on neighbouring SMs)
// merges its blocks' (max, sum of exp) through distributed shared memory, in rank order.
template <typename T, Mode MODE>
__global__ void __launch_bounds__(1024, 2)
softmax_smem(const T* __restrict__ x, T* __restrict__ y, int n, long long sx, long long sy,
             int chunks, int cluster) {
    constexpr int E = Chunk<T>::E;
    extern __shared__ uint4 slice[];
    __shared__ float partial[32];
    const long long row = blockIdx.x / cluster;
    const int per_block = (chunks + cluster - 1) / cluster;
    const int begin = (int)(blockIdx.x % cluster) * per_block;
    const int count = min(per_block, chunks - begin);
    const T* xr = x + row * sx;
    const int lead = lead_of<T, MODE>(xr);
    for (int k = threadIdx.x; k < count; k += blockDim.x) {
        const int start = (begin + k) * E - lead;
        if (MODE != SCALAR && start >= 0 && start + E <= n) copy_last_async(&slice[k], xr + start);
        else slice[k] = load_partial(xr, start, n, -CUDART_INF_F).raw;  // a partial chunk
    }
#if __CUDA_ARCH__ >= 800  // launched on sm_80 and newer only
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
    __syncthreads();
    float m = -CUDART_INF_F;
    for (int k = threadIdx.x; k < count; k += blockDim.x) {
        const Chunk<T> v{slice[k]};
#pragma unroll
        for (int i = 0; i < E; ++i) m = fmaxf(m, v.get(i));
    }
    m = group_reduce<true>(m, partial);
    float m2 = m * LOG2E, s = 0.f;
    if (m != -CUDART_INF_F) {  // one block's slice of a masked row may hold nothing but -inf
        for (int k = threadIdx.x; k < count; k += blockDim.x) {
            const Chunk<T> v{slice[k]};
#pragma unroll
            for (int i = 0; i < E; ++i) s += exp2f(fmaf(v.get(i), LOG2E, -m2));
        }
    }
    s = group_reduce<false>(s, partial);
#if __CUDA_ARCH__ >= 900  // clusters are Hopper's; older GPUs are only launched with cluster 1
    if (cluster > 1) {
        __shared__ float2 block_stats;  // this block's (max, sum), read by the cluster's blocks
        cg::cluster_group blocks = cg::this_cluster();
        if (threadIdx.x == 0) block_stats = make_float2(m, s);
        blocks.sync();
        float2 all = *blocks.map_shared_rank(&block_stats, 0);
        for (int r = 1; r < cluster; ++r)  // rank order: deterministic
            all = merge(all, *blocks.map_shared_rank(&block_stats, r));
        // "Done reading the others' pairs": a block leaves only once all have said it (the
        // wait at the end), and the stores in between overlap the other blocks' reads.
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
        m = all.x;
        s = all.y;
        m2 = m * LOG2E;
    }
#endif
    const float inv = 1.f / s;
    T* yr = y + row * sy;
    for (int k = threadIdx.x; k < count; k += blockDim.x) {
        Chunk<T> v{slice[k]};
#pragma unroll
        for (int i = 0; i < E; ++i) v.set(i, exp2f(fmaf(v.get(i), LOG2E, -m2)) * inv);
        store_chunk<T, MODE>(yr, (begin + k) * E - lead, n, v);
    }
#if __CUDA_ARCH__ >= 900
    if (cluster > 1) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Rows longer than 8 blocks' shared memory (than one block's before Hopper; any long row before
// sm_80 or with path 2): a running max and a sum of exp rescaled to it per thread (online
// softmax), then a second pass that re-reads the row, mostly from L2.
template <typename T, Mode MODE>
__global__ void __launch_bounds__(1024)
softmax_long(const T* __restrict__ x, T* __restrict__ y, int n, long long sx, long long sy) {
    constexpr int E = Chunk<T>::E;
    __shared__ float partial[32];
    const T* xr = x + blockIdx.x * sx;
    T* yr = y + blockIdx.x * sy;
    const int first = threadIdx.x * E - lead_of<T, MODE>(xr), step = blockDim.x * E;
    float2 st = make_float2(-CUDART_INF_F, 0.f);  // this thread's max and sum of exp(x - max)
    for (int start = first; start < n; start += step) {
        const Chunk<T> v = load_chunk<T, MODE>(xr, start, n, -CUDART_INF_F);
        float cm = v.get(0);
#pragma unroll
        for (int i = 1; i < E; ++i) cm = fmaxf(cm, v.get(i));
        if (cm > st.x) {  // a new max: rescale what was summed so far
            st.y *= exp2f((st.x - cm) * LOG2E);
            st.x = cm;
        }
        if (st.x == -CUDART_INF_F) continue;  // nothing but -inf so far: exp(-inf - -inf) is NaN
#pragma unroll
        for (int i = 0; i < E; ++i) st.y += exp2f((v.get(i) - st.x) * LOG2E);
    }
    const float row_max = group_reduce<true>(st.x, partial);
    const float s = st.x == -CUDART_INF_F ? 0.f : st.y * exp2f((st.x - row_max) * LOG2E);
    const float inv = 1.f / group_reduce<false>(s, partial);
    for (int start = first; start < n; start += step) {
        Chunk<T> v = load_chunk<T, MODE>(xr, start, n, -CUDART_INF_F);
#pragma unroll
        for (int i = 0; i < E; ++i) v.set(i, exp2f((v.get(i) - row_max) * LOG2E) * inv);
        store_chunk<T, MODE>(yr, start, n, v);
    }
}

// softmax_smem's blocks a row for a row of `chunks` chunks: the fewest (1, or 2 to 8 in a
// cluster on Hopper) whose slices let two blocks share an SM, else the fewest that fit one
// block's shared memory; 0 when none do. `fixed`: the kernel's own shared memory, which counts
// against the same limits (as do the 1 KB the driver keeps a block).
inline int smem_blocks_per_row(long long chunks, int fixed) {
    int device = 0, per_block = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    const int most = AUTOKERNEL_SM >= 90 ? MAX_CLUSTER : 1;
    for (int blocks_an_sm = 2; blocks_an_sm >= 1; --blocks_an_sm)
        for (int c = 1; c <= most; c *= 2) {
            const long long bytes = (chunks + c - 1) / c * 16 + fixed;
            if (bytes <= per_block && blocks_an_sm * (bytes + 1024) <= per_sm) return c;
        }
    return 0;
}

// Rows of at most VPT * 1024 chunks: softmax_rows, threads enough for VPT chunks each (a
// multiple of 32). Longer ones: softmax_smem where its slices fit (sm_80 and newer), else
// softmax_long. path 1 takes softmax_smem for any row that fits, path 2 never (for tuning).
template <typename T, Mode MODE>
int launch(const T* x, T* y, long long rows, int n, long long sx, long long sy, int chunks,
           int tpr, int rpb, int path, cudaStream_t stream) {
    const bool tpr_ok = tpr >= 32 && tpr <= 1024 && tpr % 32 == 0;
#if AUTOKERNEL_SM >= 80
    if (((long long)VPT * 1024 < chunks || path == 1) && path != 2) {
        cudaFuncAttributes own = {};
        cudaFuncGetAttributes(&own, softmax_smem<T, MODE>);
        const int cluster = smem_blocks_per_row(chunks, (int)own.sharedSizeBytes);
        const int bytes = cluster > 0 ? (chunks + cluster - 1) / cluster * 16 : 0;
        if (cluster > 0 && rows * cluster <= 0x7fffffffLL &&
            cudaFuncSetAttribute(softmax_smem<T, MODE>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
                cudaSuccess) {
            cudaLaunchConfig_t config = {};
            cudaLaunchAttribute attribute[1];
            attribute[0].id = cudaLaunchAttributeClusterDimension;
            attribute[0].val.clusterDim.x = cluster;
            attribute[0].val.clusterDim.y = 1;
            attribute[0].val.clusterDim.z = 1;
            config.gridDim = dim3((unsigned)(rows * cluster));
            config.blockDim = dim3(tpr_ok ? tpr : 512);
            config.dynamicSmemBytes = bytes;
            config.stream = stream;
            config.attrs = attribute;
            config.numAttrs = cluster > 1;
            return (int)cudaLaunchKernelEx(&config, softmax_smem<T, MODE>, x, y, n, sx, sy,
                                           chunks, cluster);
        }
    }
#endif
    if ((long long)VPT * 1024 < chunks) {
        softmax_long<T, MODE><<<(unsigned)rows, 1024, 0, stream>>>(x, y, n, sx, sy);
        return (int)cudaGetLastError();
    }
    int g = ((chunks + VPT - 1) / VPT + 31) / 32 * 32;
    if (tpr_ok && tpr >= g) g = tpr;  // tuning: more threads a row
    int per_block = g >= 256 ? 1 : 256 / g;
    if (rpb > 0) per_block = rpb < 1024 / g ? rpb : 1024 / g;
    const dim3 grid((unsigned)((rows + per_block - 1) / per_block)), block(g, per_block);
    softmax_rows<T, MODE><<<grid, block, 0, stream>>>(x, y, rows, n, sx, sy);
    return (int)cudaGetLastError();
}

template <typename T>
int dispatch(const void* x, void* y, long long rows, int n, long long sx, long long sy,
             int tpr, int rpb, int path, cudaStream_t stream) {
    constexpr int E = Chunk<T>::E;
    const long long es = sizeof(T);
    const auto off = [](const void* p) { return (uintptr_t)p % 16; };
    const T* xt = (const T*)x;
    T* yt = (T*)y;
    if (off(x) == 0 && off(y) == 0 && (n * es) % 16 == 0 && (sx * es) % 16 == 0 &&
        (sy * es) % 16 == 0)
        return launch<T, ALIGNED>(xt, yt, rows, n, sx, sy, n / E, tpr, rpb, path,
                                  stream);
    if (off(x) == off(y) && (sx * es) % 16 == (sy * es) % 16)  // rows sit alike: one more chunk
        return launch<T, LEAD>(xt, yt, rows, n, sx, sy, (n + 2 * E - 2) / E, tpr, rpb,
                                path, stream);
    return launch<T, SCALAR>(xt, yt, rows, n, sx, sy, (n + E - 1) / E, tpr, rpb, path,
                                  stream);
}

// dtype: 0 float32, 1 float16, 2 bfloat16 (cuda_build.DTYPE_CODES). tpr, rpb, path: threads a
// row, rows a block and the path (0: the defaults; see launch).
extern "C" int softmax(const void* x, void* y, long long rows, int n, long long sx,
                       long long sy, int dtype, int tpr, int rpb, int path,
                       cudaStream_t stream) {
    switch (dtype) {
        case 0: return dispatch<float>(x, y, rows, n, sx, sy, tpr, rpb, path, stream);
        case 1: return dispatch<__half>(x, y, rows, n, sx, sy, tpr, rpb, path, stream);
        case 2: return dispatch<__nv_bfloat16>(x, y, rows, n, sx, sy, tpr, rpb, path,
                                               stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


def softmax(x, threads_per_row=THREADS_PER_ROW, rows_per_block=ROWS_PER_BLOCK, path=PATH):
    n = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()  # the rows must be contiguous (a no-op when they are)
    x2 = x.reshape(-1, n)  # a view for any x whose rows are evenly spaced
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if y.numel():
        _lib.softmax(x2, y, x2.shape[0], n, x2.stride(0), y.stride(0), x.dtype,
                     threads_per_row, rows_per_block, path)
    return y.view(x.shape)


def kernel_fn(x):
    return softmax(x)
