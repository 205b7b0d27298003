"""
Softmax over the last dim of x[M, N], in CUDA C++. Starter kernel for AutoKernel
(BACKEND = "cuda"). Math in fp32 (max-subtracted, so huge inputs do not overflow); the output
has x's dtype.

Two kernels, picked by row length:
  * rows that fit in registers (up to 32K elements): a group of G threads owns a row (G a
    multiple of 32, up to 1024; blockDim.y rows per block when rows are short). Each thread
    loads its 16-byte chunks (8 halves or 4 floats; up to 32 floats' worth, a compile-time
    count, so they stay in registers) up front, interleaved across the group so that a warp's
    load reads 512 contiguous bytes (skipping L1, evict-first in L2: x is read once). Then:
    the row max (a warp-shuffle butterfly, then the warps' partials through shared memory),
    exp(x - max) computed once and kept in the registers that held x, the row sum (the same
    two-level reduction, in warp order: bitwise deterministic), and one multiply by 1/sum per
    element before the 16-byte stores. One read and one write of x: what a copy costs.
  * longer rows (vocabulary-sized with fp32, 50257 / 128256): one block of 1024 threads per
    row. Pass 1 keeps a running max and a sum of exp rescaled to it per thread (online
    softmax: one exp per element, one more per chunk whose max is new); the threads' pairs are
    then combined. Pass 2 re-reads the row (mostly from L2) and writes exp(x - max) / sum.
16-byte access needs 16-byte aligned rows: others (N = 1023, 50257, ...) take the same kernels
with element-wise loads. exp is exp2f of (x - max) * log2(e).

G is the fewest threads that hold the row: 256 for 8192 halves. Kernels are
compiled with __launch_bounds__(1024) (at most 64 registers a thread), so any G launches.

Things to try: split long rows over several blocks of a cluster (distributed shared memory to
exchange the (max, sum) pairs) so 50257-wide rows stay in registers; fewer threads per row with
more chunks each.

Usage:
  uv run bench.py --kernel kernels/cuda/softmax.py     # on a GPU machine
"""
import torch

from autokernel import cuda_build

KERNEL_TYPE = "softmax"
BACKEND = "cuda"

# Launch shape, for tuning (0: the defaults the docstring describes). THREADS_PER_ROW: threads
# that share a row (a multiple of 32, at most 1024; fewer than the row needs is ignored).
# ROWS_PER_BLOCK: rows a block holds (at most 1024 / threads per row).
THREADS_PER_ROW = 0
ROWS_PER_BLOCK = 0

CUDA_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math_constants.h>
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

constexpr float LOG2E = 1.4426950408889634f;

// E elements of T make one 16-byte chunk; a thread holds up to VPT chunks of a row in
// registers (32 floats: with __launch_bounds__(1024), 64 registers a thread leave room).
template <typename T> struct Chunk {
    static constexpr int E = 16 / sizeof(T), VPT = 32 / E;
};

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

// The E elements of a row starting at `start`, as floats (-inf past the row's end: they add
// nothing to a max or to a sum of exp). VEC: one 16-byte load (rows aligned and N a multiple
// of E: a chunk is all in or all out).
template <typename T, bool VEC, bool LAST = false>
__device__ __forceinline__ void load_chunk(const T* row, int start, int n,
                                           float (&v)[Chunk<T>::E]) {
    constexpr int E = Chunk<T>::E;
    if (VEC) {
        if (start < n) {
            const uint4 raw = LAST ? load_last(row + start)
                                   : __ldg(reinterpret_cast<const uint4*>(row + start));
            const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] = to_f32(e[i]);
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) v[i] = -CUDART_INF_F;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = start + i < n ? to_f32(row[start + i]) : -CUDART_INF_F;
    }
}

template <typename T, bool VEC>
__device__ __forceinline__ void store_chunk(T* row, int start, int n,
                                            const float (&v)[Chunk<T>::E]) {
    constexpr int E = Chunk<T>::E;
    if (VEC) {
        if (start >= n) return;
        uint4 raw;
        T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int i = 0; i < E; ++i) e[i] = from_f32<T>(v[i]);
        *reinterpret_cast<uint4*>(row + start) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i)
            if (start + i < n) row[start + i] = from_f32<T>(v[i]);
    }
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

template <typename T, bool VEC>
__global__ void __launch_bounds__(1024)
softmax_rows(const T* __restrict__ x, T* __restrict__ y, long long rows, int n, long long sx,
             long long sy) {
    constexpr int E = Chunk<T>::E, VPT = Chunk<T>::VPT;
    __shared__ float partial[32];
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool live = row < rows;  // a short last block still joins the reductions
    const T* xr = x + (live ? row : 0) * sx;
    float v[VPT][E];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int c = 0; c < VPT; ++c) {
        load_chunk<T, VEC, true>(xr, (c * blockDim.x + threadIdx.x) * E, live ? n : 0, v[c]);
#pragma unroll
        for (int i = 0; i < E; ++i) m = fmaxf(m, v[c][i]);
    }
    m = group_reduce<true>(m, partial);
    // One FMA a element: the rounding of m * log2(e) scales every exp of the row alike, and
    // the division by their sum cancels it.
    const float m2 = m * LOG2E;
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < VPT; ++c) {
#pragma unroll
        for (int i = 0; i < E; ++i) {
            v[c][i] = exp2f(fmaf(v[c][i], LOG2E, -m2));  // padding: exp2(-inf) = 0
            s += v[c][i];
        }
    }
    const float inv = 1.f / group_reduce<false>(s, partial);
    if (!live) return;
    T* yr = y + row * sy;
#pragma unroll
    for (int c = 0; c < VPT; ++c) {
#pragma unroll
        for (int i = 0; i < E; ++i) v[c][i] *= inv;
        store_chunk<T, VEC>(yr, (c * blockDim.x + threadIdx.x) * E, n, v[c]);
    }
}

template <typename T, bool VEC>
__global__ void __launch_bounds__(1024)
softmax_long(const T* __restrict__ x, T* __restrict__ y, int n, long long sx, long long sy) {
    constexpr int E = Chunk<T>::E;
    __shared__ float partial[32];
    const T* xr = x + blockIdx.x * sx;
    T* yr = y + blockIdx.x * sy;
    const int step = blockDim.x * E;
    float m = -CUDART_INF_F, s = 0.f;  // this thread's max and its sum of exp(x - m)
    for (int start = threadIdx.x * E; start < n; start += step) {
        float v[E];
        load_chunk<T, VEC>(xr, start, n, v);
        float cm = v[0];
#pragma unroll
        for (int i = 1; i < E; ++i) cm = fmaxf(cm, v[i]);
        if (cm > m) {  // a new max: rescale what was summed so far
            s *= exp2f((m - cm) * LOG2E);
            m = cm;
        }
#pragma unroll
        for (int i = 0; i < E; ++i) s += exp2f((v[i] - m) * LOG2E);
    }
    const float row_max = group_reduce<true>(m, partial);
    s = m == -CUDART_INF_F ? 0.f : s * exp2f((m - row_max) * LOG2E);
    const float inv = 1.f / group_reduce<false>(s, partial);
    for (int start = threadIdx.x * E; start < n; start += step) {
        float v[E];
        load_chunk<T, VEC, true>(xr, start, n, v);
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = exp2f((v[i] - row_max) * LOG2E) * inv;
        store_chunk<T, VEC>(yr, start, n, v);
    }
}

template <typename T, bool VEC>
int launch(const T* x, T* y, long long rows, int n, long long sx, long long sy, int tpr,
           int rpb, cudaStream_t stream) {
    constexpr int E = Chunk<T>::E;
    const long long chunks = (n + E - 1) / E;
    int g = 32;  // threads per row: each holds up to VPT chunks
    while (g < 1024 && (long long)Chunk<T>::VPT * g < chunks) g *= 2;
    if ((long long)Chunk<T>::VPT * g < chunks) {  // longer than 1024 threads can hold
        softmax_long<T, VEC><<<(unsigned)rows, 1024, 0, stream>>>(x, y, n, sx, sy);
        return (int)cudaGetLastError();
    }
    if (tpr >= g && tpr <= 1024 && tpr % 32 == 0) g = tpr;  // tuning: more threads a row
    int per_block = g >= 256 ? 1 : 256 / g;
    if (rpb > 0) per_block = rpb < 1024 / g ? rpb : 1024 / g;
    const dim3 grid((unsigned)((rows + per_block - 1) / per_block)), block(g, per_block);
    softmax_rows<T, VEC><<<grid, block, 0, stream>>>(x, y, rows, n, sx, sy);
    return (int)cudaGetLastError();
}

template <typename T>
int dispatch(const void* x, void* y, long long rows, int n, long long sx, long long sy,
             int tpr, int rpb, cudaStream_t stream) {
    const auto aligned = [](const void* p) { return ((uintptr_t)p & 15) == 0; };
    const bool vec = (n * sizeof(T)) % 16 == 0 && (sx * sizeof(T)) % 16 == 0 &&
                     (sy * sizeof(T)) % 16 == 0 && aligned(x) && aligned(y);
    return vec ? launch<T, true>((const T*)x, (T*)y, rows, n, sx, sy, tpr, rpb, stream)
               : launch<T, false>((const T*)x, (T*)y, rows, n, sx, sy, tpr, rpb, stream);
}

// dtype: 0 float32, 1 float16, 2 bfloat16 (cuda_build.DTYPE_CODES). tpr, rpb: threads a row
// and rows a block (0: the defaults).
extern "C" int softmax(const void* x, void* y, long long rows, int n, long long sx,
                       long long sy, int dtype, int tpr, int rpb, cudaStream_t stream) {
    switch (dtype) {
        case 0: return dispatch<float>(x, y, rows, n, sx, sy, tpr, rpb, stream);
        case 1: return dispatch<__half>(x, y, rows, n, sx, sy, tpr, rpb, stream);
        case 2: return dispatch<__nv_bfloat16>(x, y, rows, n, sx, sy, tpr, rpb, stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


def softmax(x, threads_per_row=THREADS_PER_ROW, rows_per_block=ROWS_PER_BLOCK):
    n = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()  # the rows must be contiguous (a no-op when they are)
    x2 = x.reshape(-1, n)  # a view for any x whose rows are evenly spaced
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if y.numel():
        _lib.softmax(x2, y, x2.shape[0], n, x2.stride(0), y.stride(0), x.dtype,
                     threads_per_row, rows_per_block)
    return y.view(x.shape)


def kernel_fn(x):
    return softmax(x)
