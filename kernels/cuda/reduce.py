"""
Sum of x over one dim (x of any rank, dim may be negative) -> x.sum(dim), in CUDA C++. Starter
kernel for AutoKernel (BACKEND = "cuda"). Accumulation in fp32 whatever the input dtype (an fp16
accumulator loses digits on long sums); the output has x's dtype.

x (made contiguous) is viewed as [outer, R, inner]: R is the summed dim, and the output is
[outer, inner]. Two kernels, picked by inner:

  * inner == 1 (the last dim, the common case): rows of R contiguous elements. A group of G
    threads (a multiple of a warp) owns a row, blockDim.y rows share a block. Each thread reads
    16-byte vectors (8 halves or 4 floats) four at a time, so 64 bytes per thread are in flight
    before the first add: a memory-bound kernel is fast when enough loads are outstanding to
    cover HBM latency. Rows whose length is not a multiple of 16 bytes start anywhere, so each
    row peels the few elements before its first 16-byte boundary and after its last one.
    The loads skip L1 and mark their lines evict-first in L2 (read once: keeping them cached
    only evicts something useful).
    The group's partial sums meet in a warp-shuffle butterfly (__shfl_xor_sync: registers to
    registers, no shared memory), then across warps through 32 floats of shared memory, added
    in warp order. The order is fixed, so the result is bitwise deterministic.
  * inner > 1 (dim 0 of a matrix, a middle dim): the R terms of one output are `inner` apart,
    neighbouring outputs are neighbours in memory. A 32x8 block owns 32 neighbouring outputs
    (one warp reads 32 consecutive elements: coalesced) and splits R over its 8 rows of threads;
    the 8 partial sums are added in a fixed order through shared memory.

G is picked so each thread has about four vectors of its row: 128 threads for 4096 halves.

Things to try: a persistent grid, split R over blocks for inner > 1 when outer * inner is too
small to fill the GPU. Within one run's noise on the H100 (judge's clock, 16384x4096 fp16):
plain __ldg loads 46.3 us, eight vectors in flight 46.5, against 47.5 shipped; 256 threads a row
54.4, 32 threads x 8 rows 50.1.

Usage:
  uv run bench.py --kernel kernels/cuda/reduce.py     # on a GPU machine
"""
import math

import torch

from autokernel import cuda_build

KERNEL_TYPE = "reduce"
BACKEND = "cuda"

# Launch shape (0 for either: the rule the docstring describes). THREADS_PER_ROW: threads that
# share a row (a multiple of 32, at most 1024; the last dim's kernel). ROWS_PER_BLOCK: rows a
# block holds (at most 1024 / threads per row). Shipped: 64 threads a row, one row a block,
# which ran 40.9 us at 16384x4096 fp16 against 43.3 with the rule's 128 (H200).
THREADS_PER_ROW = 64
ROWS_PER_BLOCK = 1

CUDA_SRC = r"""
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

// A 16-byte load that bypasses L1 and marks its L2 line evict-first (data read once).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    return v;
}

// The fp32 sum of one 16-byte vector's elements.
template <typename T>
__device__ __forceinline__ float vec_sum(uint4 v) {
    const T* e = reinterpret_cast<const T*>(&v);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < int(16 / sizeof(T)); ++i) s += to_f32(e[i]);
    return s;
}

// The sum over one row group (blockDim.x threads, a multiple of 32), returned to every thread
// of the group. Every thread of the block must call it (it may synchronize the block).
__device__ __forceinline__ float group_sum(float v, float* partial) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    const int warps = blockDim.x / 32;
    if (warps == 1) return v;
    float* mine = partial + threadIdx.y * warps;
    if ((threadIdx.x & 31) == 0) mine[threadIdx.x / 32] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < warps; ++w) s += mine[w];  // warp order: deterministic
    __syncthreads();
    return s;
}

template <typename T>
__global__ void __launch_bounds__(1024)
sum_rows(const T* __restrict__ x, T* __restrict__ y, long long rows, long long n) {
    constexpr int E = 16 / sizeof(T);  // elements per vector
    __shared__ float partial[32];      // one per warp of the block (at most 1024 threads)
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const int G = blockDim.x;
    float acc = 0.f;
    if (row < rows) {
        const T* p = x + row * n;
        long long head = (long long)(((16 - ((uintptr_t)p & 15)) & 15) / sizeof(T));
        head = head < n ? head : n;
        for (long long i = threadIdx.x; i < head; i += G) acc += to_f32(p[i]);
        const uint4* v = reinterpret_cast<const uint4*>(p + head);
        const long long nvec = (n - head) / E;
        long long i = threadIdx.x;
        for (; i + 3LL * G < nvec; i += 4LL * G) {  // four vectors in flight
            const uint4 a = load_stream(v + i), b = load_stream(v + i + G);
            const uint4 c = load_stream(v + i + 2 * G), d = load_stream(v + i + 3 * G);
            acc += (vec_sum<T>(a) + vec_sum<T>(b)) + (vec_sum<T>(c) + vec_sum<T>(d));
        }
        for (; i < nvec; i += G) acc += vec_sum<T>(load_stream(v + i));
        for (long long j = head + nvec * E + threadIdx.x; j < n; j += G) acc += to_f32(p[j]);
    }
    acc = group_sum(acc, partial);
    if (row < rows && threadIdx.x == 0) y[row] = from_f32<T>(acc);
}

constexpr int COL_BLOCK = 32, COL_SPLIT = 8;

template <typename T>
__global__ void sum_cols(const T* __restrict__ x, T* __restrict__ y, long long r,
                         long long inner, long long col_blocks) {
    __shared__ float partial[COL_SPLIT][COL_BLOCK + 1];
    const long long outer = blockIdx.x / col_blocks;
    const long long col = (blockIdx.x % col_blocks) * COL_BLOCK + threadIdx.x;
    float acc = 0.f;
    if (col < inner) {
        const T* p = x + outer * r * inner + col;
        for (long long k = threadIdx.y; k < r; k += COL_SPLIT) acc += to_f32(p[k * inner]);
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
        float s = 0.f;
        for (int k = 0; k < COL_SPLIT; ++k) s += partial[k][threadIdx.x];
        y[outer * inner + col] = from_f32<T>(s);
    }
}

template <typename T>
int launch(const void* x, void* y, long long outer, long long r, long long inner, int tpr,
           int rpb, cudaStream_t stream) {
    if (inner == 1) {
        const long long nvec = r * (long long)sizeof(T) / 16;
        int g = 32;  // threads per row: about four vectors each, 32 to 1024
        while (g < 1024 && 4LL * g < nvec) g *= 2;
        if (tpr > 0 && tpr <= 1024 && tpr % 32 == 0) g = tpr;  // tuning
        int rows_per_block = g >= 256 ? 1 : 256 / g;
        if (rpb > 0) rows_per_block = rpb < 1024 / g ? rpb : 1024 / g;
        const long long blocks = (outer + rows_per_block - 1) / rows_per_block;
        sum_rows<T><<<(unsigned)blocks, dim3(g, rows_per_block), 0, stream>>>(
            (const T*)x, (T*)y, outer, r);
    } else {
        const long long col_blocks = (inner + COL_BLOCK - 1) / COL_BLOCK;
        sum_cols<T><<<(unsigned)(outer * col_blocks), dim3(COL_BLOCK, COL_SPLIT), 0, stream>>>(
            (const T*)x, (T*)y, r, inner, col_blocks);
    }
    return (int)cudaGetLastError();
}

// dtype: 0 float32, 1 float16, 2 bfloat16 (cuda_build.DTYPE_CODES). tpr, rpb: threads a row
// and rows a block of the inner == 1 kernel (0: the defaults).
extern "C" int reduce_sum(const void* x, void* y, long long outer, long long r, long long inner,
                          int dtype, int tpr, int rpb, cudaStream_t stream) {
    switch (dtype) {
        case 0: return launch<float>(x, y, outer, r, inner, tpr, rpb, stream);
        case 1: return launch<__half>(x, y, outer, r, inner, tpr, rpb, stream);
        case 2: return launch<__nv_bfloat16>(x, y, outer, r, inner, tpr, rpb, stream);
    }
    return (int)cudaErrorInvalidValue;
}
"""

_lib = cuda_build.load(CUDA_SRC)


def reduce_sum(x, dim=-1, threads_per_row=THREADS_PER_ROW, rows_per_block=ROWS_PER_BLOCK):
    dim %= x.dim()
    x = x.contiguous()  # a view as [outer, R, inner] needs contiguous memory (no copy if it is)
    outer, r, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
    y = torch.empty(x.shape[:dim] + x.shape[dim + 1:], dtype=x.dtype, device=x.device)
    if y.numel():  # R == 0 still launches: sums of nothing are written as 0
        _lib.reduce_sum(x, y, outer, r, inner, x.dtype, threads_per_row, rows_per_block)
    return y


def kernel_fn(x, dim=-1):
    return reduce_sum(x, dim)
